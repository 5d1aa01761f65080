"""Helpers for the real-vLLM e2e lane: processes (vLLM, kvwatch run, kvwatch record), a load driver, and an
observer that samples kvwatch's and vLLM's /metrics over HTTP while a scenario runs.

Everything binds to 127.0.0.1 on ports chosen free at run time; every process is started in its own session
(process group) and the whole group is killed on teardown.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.ports import free_port
from tests.helpers.process import Process

REPO = Path(__file__).resolve().parents[2]
E2E_DIR = Path(__file__).resolve().parent
ARTIFACTS = REPO / "artifacts" / "e2e"
MODEL_NAME = "tiny-llama-dummy"
HOST = "127.0.0.1"

#: flags every server gets (the CPU attention backend needs a block size that is a multiple of 32)
BASE_SERVER_ARGS = ["--load-format", "dummy", "--dtype", "bfloat16", "--block-size", "32"]


def log(msg: str) -> None:
    print(f"[e2e {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def tail(path: Path, n: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


# --------------------------------------------------------------------------------------------- processes


def vllm_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHONPATH"))}
    env.update(
        VLLM_TARGET_DEVICE="cpu",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONUNBUFFERED="1",
    )
    return env


class VllmServer(Process):
    """``python -m vllm.entrypoints.openai.api_server`` on a free loopback port, with the tiny dummy model."""

    name = "vLLM"

    def __init__(self, python: str, model_dir: Path, args: list[str], log_path: Path, port: int | None = None):
        self.port = port or free_port()
        self.args = list(args)
        argv = [
            python,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(model_dir),
            "--served-model-name",
            MODEL_NAME,
            "--host",
            HOST,
            "--port",
            str(self.port),
            *BASE_SERVER_ARGS,
            *self.args,
        ]
        super().__init__(argv, log_path, env=vllm_env(), cwd=log_path.parent)
        self.startup_seconds: list[float] = []

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"{self.base_url}/metrics"

    def healthy(self) -> bool:
        """Running, and GET /health answers 200 (the API server can outlive a dead engine)."""
        if not self.running():
            return False
        try:
            return httpx.get(f"{self.base_url}/health", timeout=10.0).status_code == 200
        except httpx.HTTPError:
            return False

    def start_and_wait(self, timeout: float = 600.0) -> float:
        """Start the server and block until GET /health is 200. Raises (never skips) if it cannot start.

        ``timeout`` catches a server that never comes up; it is no speed bound: start-up took 190-355 s on
        the loaded 2-core CI machine (the old 420 s was close). The tests' own 900 s timeouts bound the whole."""
        t0 = time.monotonic()
        log(f"starting vLLM on :{self.port} with {' '.join(self.args)}")
        self.start()
        try:
            self.wait_for_url(f"{self.base_url}/health", timeout=timeout, what="vLLM healthy", interval=0.5)
        except TimeoutError:
            self.stop()
            raise
        took = time.monotonic() - t0
        self.startup_seconds.append(took)
        log(f"vLLM healthy on :{self.port} after {took:.1f} s")
        return took


def kvwatch_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "kvwatch", *args]


def project_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    # the sidecar is configured by its flags only in these tests
    for k in [k for k in env if k.startswith("KVWATCH_")]:
        del env[k]
    return env


class Kvwatch(Process):
    """``python -m kvwatch run --target URL --listen 127.0.0.1:PORT --interval 1 [hints]`` — as in production."""

    name = "kvwatch run"

    def __init__(self, target: str, log_path: Path, extra: Iterable[str] = ()):
        self.port = free_port()
        self.target = target
        self.extra = list(extra)
        argv = kvwatch_argv(
            "run", "--target", target, "--listen", f"{HOST}:{self.port}", "--interval", "1", *self.extra
        )
        super().__init__(argv, log_path, env=project_env(), cwd=REPO)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def start_and_wait(self, timeout: float = 30.0) -> None:
        self.start()
        self.wait_for_url(f"{self.url}/readyz", timeout=timeout, what="kvwatch ready", interval=0.2)

    def history(self, seconds: float = 900.0) -> dict:
        """kvwatch's own record of its scrapes (/api/v1/history): a starved machine gets a few tries."""
        for attempt in range(5):
            try:
                r = httpx.get(f"{self.url}/api/v1/history", params={"seconds": seconds}, timeout=10.0)
                r.raise_for_status()
                return r.json()
            except httpx.TransportError:
                if attempt == 4:
                    raise
                time.sleep(1.0)
        raise AssertionError("unreachable")


class Recorder(Process):
    """``python -m kvwatch record URL --out DIR --duration S``: the scenario's recording, kept as an artefact."""

    def __init__(self, target: str, out_dir: Path, duration: float, log_path: Path):
        self.out_dir = out_dir
        self.duration = duration
        argv = kvwatch_argv("record", target, "--out", str(out_dir), "--duration", f"{duration:g}")
        super().__init__(argv, log_path, env=project_env(), cwd=REPO)

    def finish(self, extra_wait: float = 10.0) -> int | None:
        """Let it end by itself (its --duration), else stop it; returns its exit status."""
        if self.proc is None:
            return None
        try:
            self.proc.wait(timeout=extra_wait)
        except subprocess.TimeoutExpired:
            log("kvwatch record outlived its --duration; stopping it")
            self.stop(grace=5)
        return self.proc.returncode

    def files(self) -> list[Path]:
        return sorted(self.out_dir.glob("*.prom")) if self.out_dir.exists() else []


# --------------------------------------------------------------------------------------------- load


@dataclass
class LoadResult:
    sent: int = 0
    ok: int = 0
    failed: int = 0
    cancelled: int = 0
    errors: list[str] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    started: float = 0.0
    ended: float = 0.0

    @property
    def seconds(self) -> float:
        return self.ended - self.started

    def add(self, other: LoadResult) -> LoadResult:
        """This round and a later one as one result."""
        for k in ("sent", "ok", "failed", "cancelled", "prompt_tokens", "completion_tokens"):
            setattr(self, k, getattr(self, k) + getattr(other, k))
        self.errors += other.errors
        self.ended = other.ended
        return self

    def failure(self, server: VllmServer) -> str:
        """A short assertion message for failed requests: how many, the first errors, and whether vLLM lives."""
        state = (
            "still running"
            if server.running()
            else f"exited with {server.proc.returncode if server.proc else None}: {tail(server.log_path, 3)}"
        )
        return f"{self.failed} of {self.sent} requests failed, e.g. {self.errors[:2]}; vLLM {state}"

    def as_dict(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k != "errors"}
        d["errors"] = self.errors[:5]
        d["seconds"] = round(self.seconds, 2)
        return d


async def drive_load(
    base_url: str,
    *,
    num_requests: int,
    input_len: int,
    output_len: int | tuple[int, int],
    vocab_size: int,
    concurrency: int | None = None,
    request_rate: float | None = None,
    max_seconds: float,
    seed: int = 0,
) -> LoadResult:
    """Send ``num_requests`` completions of exactly ``input_len`` random prompt tokens (token-id prompts, so no
    tokenizer is needed and the prefix cache never hits) and ``output_len`` generated tokens (``ignore_eos``;
    a ``(low, high)`` pair draws each request's length uniformly, so that requests admitted together do not
    all finish together).

    ``concurrency`` caps requests in flight (None: all at once); ``request_rate`` spaces starts as a Poisson
    process. Bounded in count and in time: whatever is still in flight after ``max_seconds`` is cancelled (the
    client disconnects and vLLM aborts it).
    """
    rng = random.Random(seed)
    res = LoadResult(started=time.monotonic())
    sem = asyncio.Semaphore(concurrency) if concurrency else None
    limits = httpx.Limits(max_connections=concurrency or num_requests, max_keepalive_connections=64)

    async with httpx.AsyncClient(base_url=base_url, timeout=httpx.Timeout(max_seconds + 30), limits=limits) as client:

        async def one(i: int, prompt: list[int], max_tokens: int) -> None:
            async def call() -> None:
                res.sent += 1
                r = await client.post(
                    "/v1/completions",
                    json={
                        "model": MODEL_NAME,
                        "prompt": prompt,
                        "max_tokens": max_tokens,
                        "ignore_eos": True,
                        "temperature": 0.0,
                        "stream": False,
                    },
                )
                if r.status_code != 200:
                    res.failed += 1
                    res.errors.append(f"{r.status_code}: {r.text[:200]}")
                    return
                usage = r.json().get("usage") or {}
                res.ok += 1
                res.prompt_tokens += usage.get("prompt_tokens", 0)
                res.completion_tokens += usage.get("completion_tokens", 0)

            try:
                if sem:
                    async with sem:
                        await call()
                else:
                    await call()
            except httpx.HTTPError as e:
                res.failed += 1
                res.errors.append(f"{type(e).__name__}: {e}")

        async def spawn() -> list[asyncio.Task]:
            tasks = []
            for i in range(num_requests):
                prompt = [rng.randrange(2, vocab_size) for _ in range(input_len)]
                n = rng.randint(*output_len) if isinstance(output_len, tuple) else output_len
                tasks.append(asyncio.create_task(one(i, prompt, n)))
                if request_rate:
                    await asyncio.sleep(rng.expovariate(request_rate))
            return tasks

        tasks: list[asyncio.Task] = []
        spawner = asyncio.create_task(spawn())
        deadline = res.started + max_seconds
        try:
            tasks = await asyncio.wait_for(spawner, timeout=max_seconds)
            remaining = max(0.0, deadline - time.monotonic())
            if tasks:
                _, pending = await asyncio.wait(tasks, timeout=remaining)
                for t in pending:
                    t.cancel()
                res.cancelled = len(pending)
                await asyncio.gather(*pending, return_exceptions=True)
        except TimeoutError:
            res.cancelled = num_requests - res.ok - res.failed
    res.ended = time.monotonic()
    return res


# --------------------------------------------------------------------------------------------- metrics


def parse_metrics(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Prometheus text → {sample name: [(labels, value), ...]} using prometheus_client's parser."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    return out


class Snapshot:
    """One parsed /metrics body with label-subset look-ups."""

    def __init__(self, t: float, text: str):
        self.t = t
        self.samples = parse_metrics(text)

    def series(self, name: str, **labels: str) -> list[tuple[dict[str, str], float]]:
        return [(ln, v) for ln, v in self.samples.get(name, []) if all(ln.get(k) == want for k, want in labels.items())]

    def value(self, name: str, **labels: str) -> float | None:
        found = self.series(name, **labels)
        if len(found) > 1:
            raise AssertionError(f"{name}{labels} matches {len(found)} series: {found}")
        return found[0][1] if found else None

    def state(self, name: str, label: str, **labels: str) -> str | None:
        """The one label value whose state-set series is 1 (None if absent); asserts exactly one is 1."""
        found = self.series(name, **labels)
        if not found:
            return None
        on = [ln[label] for ln, v in found if v == 1]
        assert len(on) == 1, f"{name}{labels}: exactly one state must be 1, got {found}"
        return on[0]


@dataclass
class Sample:
    t: float
    kv: Snapshot | None  # kvwatch /metrics (None if it could not be read)
    vllm: Snapshot | None  # vLLM /metrics read by the test itself (None while the server is down)
    diagnosis: dict | None = None  # kvwatch /api/v1/diagnosis, read just after its /metrics
    took: dict = field(default_factory=dict)  # seconds from t to the end of each read (observe.py)


class Observer:
    """Reads kvwatch's /metrics and /api/v1/diagnosis and vLLM's /metrics (independent ground truth) every
    ``period`` s, in a process of its own (tests/e2e/observe.py) whose JSON lines, kept at ``out``, are read
    back as ``samples``. Its own process and session: under autogroup scheduling (a Linux default) CPU is
    shared between sessions first, so the reads keep their cadence however busy the test's process is."""

    def __init__(self, kvwatch_url: str, vllm_metrics_url: str | None, out: Path, period: float = 1.0):
        argv = [
            sys.executable,
            "-m",
            "tests.e2e.observe",
            "--kvwatch",
            kvwatch_url,
            "--every",
            f"{period:g}",
            "--out",
            str(out),
        ]
        if vllm_metrics_url:
            argv += ["--vllm", vllm_metrics_url]
        out.unlink(missing_ok=True)
        self.out = out
        self.proc = Process(argv, out.with_suffix(".observer.log"), env=project_env(), cwd=REPO)
        self._samples: list[Sample] = []
        self._read = 0  # bytes of ``out`` already parsed
        self._stop = asyncio.Event()

    async def run(self) -> None:
        """Read until stop(); the tests run this as a task beside the load."""
        self.proc.start()
        try:
            await self._stop.wait()
        finally:
            self.proc.stop(grace=5)

    def stop(self) -> None:
        self._stop.set()

    @property
    def samples(self) -> list[Sample]:
        """Every complete line so far, parsed once."""
        try:
            with open(self.out, "rb") as f:
                f.seek(self._read)
                data = f.read()
        except FileNotFoundError:
            return self._samples
        done = data.rfind(b"\n") + 1  # a line still being written waits for the next call
        for line in data[:done].splitlines():
            d = json.loads(line)
            t = d["t"]
            self._samples.append(
                Sample(
                    t,
                    Snapshot(t, d["kvwatch"]) if d["kvwatch"] else None,
                    Snapshot(t, d["vllm"]) if d["vllm"] else None,
                    d.get("diagnosis"),
                    d.get("took") or {},
                )
            )
        self._read += done
        return self._samples


# --------------------------------------------------------------------------------------------- figures


def vllm_gauge(s: Snapshot, name: str) -> float | None:
    return s.value(f"vllm:{name}", model_name=MODEL_NAME, engine="0")


def summarize(values: list[float]) -> dict:
    if not values:
        return {"n": 0}
    return {"n": len(values), "min": min(values), "max": max(values), "mean": round(sum(values) / len(values), 3)}


def counts(items: Iterable[str | None]) -> dict[str, int]:
    out: dict[str, int] = {}
    for i in items:
        out[str(i)] = out.get(str(i), 0) + 1
    return out


def finite(v: float | None) -> bool:
    return v is not None and not math.isnan(v) and not math.isinf(v)
