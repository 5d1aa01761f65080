"""Fixtures for the real-vLLM lane (``pytest -m e2e tests/e2e``).

The vLLM venv is set up by ``setup_vllm.sh`` (idempotent; instant when already installed) unless
``KVWATCH_E2E_PYTHON`` names its interpreter. The model is built at test time by ``make_model.py``.
Nothing here ever skips: if vLLM cannot be installed or started, the test fails with the reason.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from .harness import ARTIFACTS, E2E_DIR, VllmServer, log, tail


@pytest.fixture(scope="session")
def vllm_python() -> str:
    py = os.environ.get("KVWATCH_E2E_PYTHON")
    if py:
        if not os.access(py, os.X_OK):
            pytest.fail(f"KVWATCH_E2E_PYTHON={py} is not an executable")
        return py
    proc = subprocess.run(["bash", str(E2E_DIR / "setup_vllm.sh")], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.fail(f"setup_vllm.sh failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="session")
def model_dir(vllm_python: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("model") / "tiny-llama-dummy"
    proc = subprocess.run([vllm_python, str(E2E_DIR / "make_model.py"), str(out)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.fail(f"make_model.py failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return out


@pytest.fixture(scope="session")
def vocab_size(model_dir: Path) -> int:
    return json.loads((model_dir / "config.json").read_text())["vocab_size"]


@pytest.fixture(scope="session")
def artifacts_root() -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS


@pytest.fixture
def scenario_dir(request: pytest.FixtureRequest, artifacts_root: Path) -> Path:
    """artifacts/e2e/<test name>/ — emptied first; logs, recordings, samples and a summary go here."""
    d = artifacts_root / request.node.name.removeprefix("test_")
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    return d


def start_server(vllm_python: str, model_dir: Path, name: str, args: list[str]) -> VllmServer:
    """Start one vLLM server (module-scoped fixtures call this); fails the test loudly if it cannot start."""
    log_dir = ARTIFACTS / "servers"
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    log_path.unlink(missing_ok=True)
    server = VllmServer(vllm_python, model_dir, args, log_path)
    try:
        server.start_and_wait()
    except Exception as e:  # noqa: BLE001 — reported as a failure, never a skip
        server.stop()
        pytest.fail(f"vLLM server '{name}' could not start: {e}", pytrace=False)
    return server


@pytest.fixture(scope="module")
def server_factory(vllm_python: str, model_dir: Path):
    """Starts servers for one test module and kills their whole process groups at the module's end."""
    started: list[VllmServer] = []

    def make(name: str, args: list[str]) -> VllmServer:
        s = start_server(vllm_python, model_dir, name, args)
        started.append(s)
        return s

    make.started = started
    yield make
    for s in started:
        log(f"stopping vLLM :{s.port}")
        s.stop()


@pytest.fixture(autouse=True)
def vllm_alive(server_factory):
    """A module's server that died during an earlier test is restarted first, with its last words in the
    log, so that one crash fails one test and not every test after it."""
    for s in server_factory.started:
        if not s.healthy():
            log(
                f"vLLM :{s.port} is down before this test (exit {s.proc.returncode if s.proc else None}); "
                f"its log ends:\n{tail(s.log_path, 15)}\nrestarting it"
            )
            s.stop()
            s.start_and_wait()
    yield


def _rng(d: dict, nd: int = 2) -> str:
    if not d or not d.get("n"):
        return "-"
    return f"{round(d['min'], nd):g}–{round(d['max'], nd):g} (mean {round(d['mean'], nd):g})"


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Figures of every e2e scenario that ran (also in artifacts/e2e/<scenario>/summary.json)."""
    from .scenario import SUMMARIES

    if not SUMMARIES:
        return
    w = terminalreporter
    w.section("kvwatch against real vLLM: figures")
    for name, s in SUMMARIES.items():
        w.write_line(
            f"{name}: vLLM {' '.join(s.get('server_args', []))}; server start-up "
            f"{', '.join(f'{x:.0f} s' for x in s.get('server_startup_seconds', []))}; scenario "
            f"{s.get('scenario_seconds', '?')} s"
        )
        if "load_result" in s:
            lr = s["load_result"]
            w.write_line(
                f"  load: {s['load']} -> ok {lr['ok']}, failed {lr['failed']}, cancelled {lr['cancelled']} "
                f"in {lr['seconds']} s ({len(s.get('load_rounds', [0]))} round(s)); "
                f"recording: {s['record']['files']} files (rc {s['record']['rc']})"
            )
        sat = s.get("saturated") or {}
        if "samples" in sat:
            sat = {"nohint": sat}
        for v, d in sat.items():
            w.write_line(
                f"  while waiting [{v}]: {d['samples']} samples, bottleneck {d['bottleneck']}, "
                f"vLLM running {_rng(d['vllm_running'])}, waiting {_rng(d['vllm_waiting'], 0)}, "
                f"KV {_rng(d['vllm_kv'])}; kvwatch preemptions/s {_rng(d['kvwatch_preempt_ps'])}, "
                f"step tokens {_rng(d['kvwatch_step_tokens'], 1)}, "
                f"est. max concurrency {_rng(d['kvwatch_est_max_conc'])}, "
                f"max_num_seqs cfg/inf {_rng(d['kvwatch_max_num_seqs_configured'], 0)} / "
                f"{_rng(d['kvwatch_max_num_seqs_inferred'], 0)}, budget cfg/inf "
                f"{_rng(d['kvwatch_budget_configured'], 0)} / {_rng(d['kvwatch_budget_inferred'], 0)}"
            )
        if "up_rows" in s:
            d = s["up_rows"]
            w.write_line(
                f"  all samples: bottleneck {d['bottleneck']}, vLLM running {_rng(d['vllm_running'])}, "
                f"waiting {_rng(d['vllm_waiting'], 0)}"
            )
        if "onsets" in s:
            lat = [f"{o['latency_s']} (reads {o.get('read_gap_s')} s apart)" for o in s["onsets"]]
            w.write_line(
                f"  detection latency over {len(lat)} onsets, s = intervals: {', '.join(lat)}; median "
                f"{s['median_latency_s']}; bursts the test's reads could not judge: {len(s['unjudged'])}"
            )
        if "detection" in s and s["detection"].get("latency_s") is not None:
            d = s["detection"]
            w.write_line(
                f"  detection latency (vLLM's KV-bound onset -> kvwatch_bottleneck kv_cache): "
                f"{d['latency_s']:.2f} s = {d['latency_s'] / d['interval_s']:.2f} intervals "
                f"(reads {d['read_gap_s']} s apart there; onset {d['onset_s']} s into the load)"
            )
        for k in ("observed_mean_running", "estimated_max_concurrency_median", "vllm_mean_step_tokens"):
            if s.get(k) is not None:
                w.write_line(f"  {k}: {s[k]:.2f}")
        if "marks_relative_to_kill" in s:
            w.write_line(
                f"  marks (s from kill): {s['marks_relative_to_kill']}; while down: {s['down']}; "
                f"recording {s['record']}"
            )
            d = s["saturated_after_restart"]
            w.write_line(
                f"  after restart, while waiting: bottleneck {d['bottleneck']}, "
                f"vLLM running {_rng(d['vllm_running'])}; negative values: {len(s['negatives'])}"
            )
