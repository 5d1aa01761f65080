"""Regenerate the real llama.cpp captures in tests/fixtures/engines/llamacpp/captures/ (see the README there).

    .venv/bin/python -m tests.helpers.capture_llamacpp                 # every scenario
    .venv/bin/python -m tests.helpers.capture_llamacpp slot_ceiling    # one; --out DIR to write elsewhere

Each scenario starts llama.cpp's server (tests/helpers/llamacpp.py: xllamacpp, the tiny random model), sends its
load from threads, and meanwhile reads ``/metrics`` then ``/slots`` every ``INTERVAL`` s, from a second before the
load until two seconds after it. It writes, per scenario folder:

- ``<unix_time>.prom``: the ``/metrics`` body as served (``kvwatch record``'s format, so ``kvwatch diagnose
  --replay`` and tests/helpers/recordings.py read the folder as is);
- ``<unix_time>.slots.json``: the ``/slots`` body as served, read right after that ``/metrics``;
- ``requests.jsonl``: one line a request: start and end (unix time), prompt tokens asked, ``n_predict``, HTTP
  status, and from the body ``tokens_evaluated``, ``tokens_predicted``, ``truncated``, ``stop_type``, or the
  error object of a failed request;
- ``config.txt``: the server flags | the load; ``server.log``: the server's own log (the model path replaced by a
  placeholder, the interpreter's path shortened to ``python``).

Old files of the scenario are removed first. Timings depend on the machine (two shared cores here): the README
says what each run showed, the tests assert only what holds on any machine.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.helpers.llamacpp import LlamaCppServer, llamacpp_server, make_tiny_gguf, prompt_of_tokens

OUT = Path(__file__).resolve().parents[1] / "fixtures" / "engines" / "llamacpp" / "captures"
INTERVAL = 0.5


@dataclass(frozen=True)
class Request:
    prompt_tokens: int
    n_predict: int


@dataclass(frozen=True)
class Scenario:
    name: str
    server: dict[str, Any]  # llamacpp_server keyword arguments
    requests: tuple[Request, ...]
    concurrency: int  # requests in flight at once (threads)
    what: str

    def flags(self) -> str:
        return " ".join(f"--{k.replace('_', '-')} {v}" for k, v in self.server.items())

    def load(self) -> str:
        sizes = sorted({(r.prompt_tokens, r.n_predict) for r in self.requests})
        shapes = ", ".join(
            f"{sum(1 for r in self.requests if (r.prompt_tokens, r.n_predict) == s)} x "
            f"({s[0]} prompt + {s[1]} n_predict)"
            for s in sizes
        )
        return f"{shapes}, {self.concurrency} at a time, /completion with ignore_eos"


SCENARIOS = {
    s.name: s
    for s in (
        Scenario(
            "slot_ceiling",
            {"parallel": 2, "ctx_size": 1024},
            tuple(Request(64, 384) for _ in range(24)),
            16,
            "more concurrent requests than slots: the slot ceiling (--parallel) binds",
        ),
        Scenario(
            "light",
            {"parallel": 2, "ctx_size": 1024},
            tuple(Request(64, 384) for _ in range(10)),
            1,
            "one request at a time: nothing binds",
        ),
        Scenario(
            "context_too_small",
            {"parallel": 2, "ctx_size": 512},
            tuple(r for _ in range(6) for r in (Request(300, 8), Request(200, 200), Request(120, 200))),
            2,
            "256 tokens of context a slot: long prompts are refused (HTTP 400), long generations cut short",
        ),
    )
}


@dataclass
class Recorder:
    """Reads /metrics then /slots every INTERVAL s into ``folder`` until ``stop`` is set."""

    server: LlamaCppServer
    folder: Path
    stop: threading.Event = field(default_factory=threading.Event)
    samples: int = 0

    def run(self) -> None:
        with httpx.Client(timeout=10.0, trust_env=False) as client:
            next_at = time.time()
            while not self.stop.is_set():
                stamp = time.time()
                metrics = client.get(self.server.url + "/metrics")
                slots = client.get(self.server.url + "/slots")
                (self.folder / f"{stamp:.3f}.prom").write_bytes(metrics.content)
                (self.folder / f"{stamp:.3f}.slots.json").write_bytes(slots.content)
                self.samples += 1
                next_at += INTERVAL
                self.stop.wait(max(0.0, next_at - time.time()))


def send(server: LlamaCppServer, tagged: tuple[int, Request]) -> dict[str, Any]:
    tag, request = tagged
    start = time.time()
    response = server.complete(prompt_of_tokens(request.prompt_tokens, tag), request.n_predict)
    body = response.json()
    line: dict[str, Any] = {
        "start": round(start, 3),
        "end": round(time.time(), 3),
        "prompt_tokens": request.prompt_tokens,
        "n_predict": request.n_predict,
        "status": response.status_code,
    }
    if response.status_code == 200:
        line.update({k: body.get(k) for k in ("tokens_evaluated", "tokens_predicted", "truncated", "stop_type")})
    else:
        line["error"] = body.get("error", body)
    return line


def capture(scenario: Scenario, model: Path, out: Path, log: Callable[[str], None] = print) -> Path:
    folder = out / scenario.name
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:
        server_log = Path(tmp) / "server.log"
        with llamacpp_server(model, server_log, **scenario.server) as server:
            recorder = Recorder(server, folder)
            thread = threading.Thread(target=recorder.run, daemon=True)
            thread.start()
            time.sleep(1.0)
            with ThreadPoolExecutor(scenario.concurrency) as pool:
                lines = list(pool.map(lambda r: send(server, r), enumerate(scenario.requests)))
            time.sleep(2.0)
            recorder.stop.set()
            thread.join(30)
        text = server_log.read_text(errors="replace").replace(str(model), "<model.gguf>")
        text = text.replace(sys.executable, "python")
    (folder / "server.log").write_text(text)
    (folder / "requests.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    (folder / "config.txt").write_text(f"{scenario.flags()} | {scenario.load()}\n")
    log(
        f"{scenario.name}: {recorder.samples} samples, {len(lines)} requests "
        f"({sum(1 for line in lines if line['status'] != 200)} failed) -> {folder}"
    )
    return folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.helpers.capture_llamacpp", description=__doc__.splitlines()[0]
    )
    parser.add_argument("scenarios", nargs="*", metavar="SCENARIO", help=f"some of {', '.join(SCENARIOS)} (all)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    if unknown := set(args.scenarios) - set(SCENARIOS):
        parser.error(f"no scenario {', '.join(sorted(unknown))}; there are {', '.join(SCENARIOS)}")
    with tempfile.TemporaryDirectory() as tmp:
        model = make_tiny_gguf(Path(tmp) / "tiny.gguf")
        for name in args.scenarios or SCENARIOS:
            capture(SCENARIOS[name], model, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
