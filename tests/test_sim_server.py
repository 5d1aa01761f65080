"""``kvwatch sim`` over HTTP: the in-process SimServer API and the real command line."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvwatch.sim import SimServer, list_presets
from kvwatch.sim.cli import main as sim_main
from tests.helpers.process import Process


def _gauge(text: str, name: str) -> list[float]:
    return [float(v) for v in re.findall(r"^" + re.escape(name) + r"\{[^}]*\} (\S+)$", text, re.M)]


async def _wait_for(pred, timeout: float = 20.0, every: float = 0.05):
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(every)


async def test_sim_server_serves_vllm_metrics_and_its_endpoints():
    async with SimServer("kv_cache", host="127.0.0.1", port=0, seed=1, speed=4.0) as sim:
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/metrics", sim.url)
        async with httpx.AsyncClient() as c:
            await _wait_for(lambda: sim.sim_time > 4.0)
            r = await c.get(sim.url, headers={"Accept-Encoding": "identity"})
            assert r.status_code == 200
            assert r.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
            assert "content-encoding" not in r.headers
            text = r.text
            assert text.endswith("\n")
            assert {f.name for f in text_string_to_metric_families(text)} >= {
                "vllm:num_requests_running",
                "vllm:kv_cache_usage_perc",
                "vllm:num_preemptions",
            }
            # KV-bound, as the preset says. Like real vLLM's samples, its KV usage dips below 0.5 for a moment
            # now and then (~4 % of simulated time after 4 s; a loaded machine serves this read seconds of
            # simulated time later): one read of a few shows the state, a wrong preset or an empty body none.
            bodies = [text]
            for _ in range(9):
                await asyncio.sleep(0.05)
                bodies.append((await c.get(sim.url)).text)
            bound = [
                (_gauge(b, "vllm:num_requests_waiting")[0], _gauge(b, "vllm:kv_cache_usage_perc")[0]) for b in bodies
            ]
            assert any(w > 10 and kv > 0.5 for w, kv in bound), bound

            z = await c.get(sim.url, headers={"Accept-Encoding": "gzip"})
            assert z.status_code == 200 and z.headers["content-encoding"] == "gzip"
            assert z.text.startswith("# HELP python_gc_objects_collected_total")

            assert (await c.get(sim.base_url + "/health")).status_code == 200
            assert (await c.get(sim.base_url + "/version")).json() == {"version": "0.32.0"}
            models = (await c.get(sim.base_url + "/v1/models")).json()
            assert models["data"][0]["id"] == "tiny-llama-dummy"
            state = (await c.get(sim.base_url + "/sim/state")).json()
            assert state["scenario"] == "kv_cache" and state["phase"] == "kv_cache"
            assert state["engines"][0]["max_num_seqs"] == 16
            assert state["sim_time_s"] > 4.0
            assert "kv_cache" in (await c.get(sim.base_url + "/")).text


async def test_background_task_drives_the_simulation_and_switches_phases():
    phases: list[str] = []
    sim = SimServer("stalled", port=0, seed=2, speed=20.0, on_phase=lambda name, t: phases.append(name))
    await sim.start()
    try:
        # nobody scrapes: the background task alone must move simulated time and the phase
        await _wait_for(lambda: phases[-1:] == ["stalled"], timeout=30.0)
        assert phases == ["serving", "stalled"]
        async with httpx.AsyncClient() as c:
            frozen = (await c.get(sim.url)).text
            await asyncio.sleep(0.5)
            later = (await c.get(sim.url)).text
        vllm = lambda t: [ln for ln in t.splitlines() if ln.startswith("vllm:")]  # noqa: E731
        assert vllm(frozen) == vllm(later)  # a stalled engine publishes nothing
        assert _gauge(later, "vllm:num_requests_running")[0] > 0
        assert sim.phase == "stalled"
    finally:
        await sim.stop()


async def test_tour_walks_through_every_phase():
    phases: list[str] = []
    async with SimServer("tour", port=0, seed=0, speed=60.0, on_phase=lambda n, t: phases.append(n)):
        await _wait_for(lambda: len(phases) >= 6, timeout=60.0)
    assert phases[:6] == ["healthy", "kv_cache", "recovery", "max_num_seqs", "token_budget", "healthy"]


async def test_engines_and_metrics_versions_over_http():
    async with SimServer("max_num_seqs", port=0, seed=1, speed=4.0, engines=2, metrics_version="0.10") as sim:
        await _wait_for(lambda: sim.sim_time > 3.0)
        async with httpx.AsyncClient() as c:
            text = (await c.get(sim.url)).text
    assert re.findall(r'^vllm:num_requests_running\{engine="(\d)"', text, re.M) == ["0", "1"]
    assert _gauge(text, "vllm:gpu_cache_usage_perc") == _gauge(text, "vllm:kv_cache_usage_perc")
    async with SimServer("max_num_seqs", port=0, seed=1, speed=4.0, metrics_version="v0") as sim:
        await _wait_for(lambda: sim.sim_time > 3.0)
        async with httpx.AsyncClient() as c:
            text = (await c.get(sim.url)).text
    # The format is the point here: one series, no engine label, at most the ceiling of 2.
    (running,) = _gauge(text, "vllm:num_requests_running")
    assert running <= 2.0 and "engine=" not in text
    with pytest.raises(ValueError, match="engines"):
        SimServer("max_num_seqs", engines=2, metrics_version="v0")


async def test_scenario_file_is_served(tmp_path):
    f = tmp_path / "mine.json"
    f.write_text(
        json.dumps(
            {
                "name": "mine",
                "engine": {"model_name": "my-model", "num_gpu_blocks": 256, "max_num_seqs": 4},
                "workload": {"rate": 20.0, "prompt_tokens": 100, "output_tokens": 50},
            }
        )
    )
    async with SimServer(scenario=None, scenario_file=f, port=0, speed=4.0) as sim:
        await _wait_for(lambda: sim.sim_time > 3.0)
        async with httpx.AsyncClient() as c:
            text = (await c.get(sim.url)).text
        assert sim.phase == "mine"
    assert 'model_name="my-model"' in text
    (running,) = _gauge(text, "vllm:num_requests_running")
    assert 1.0 <= running <= 4.0  # the file's max_num_seqs caps it (a sample may fall between two admissions)


# --------------------------------------------------------------------------- the command line


def _start_cli(*args: str) -> tuple[Process, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVWATCH_")}
    proc = Process(
        [sys.executable, "-m", "kvwatch", "sim", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    ).start()
    line = proc.proc.stdout.readline()
    m = re.search(r"(http://\S+/metrics)", line)
    if not m:
        proc.stop(sig=signal.SIGKILL)
        out, err = proc.proc.communicate()
        raise AssertionError(f"no banner: {line!r} {out!r} {err!r}")
    return proc, m.group(1)


@pytest.mark.slow
def test_cli_serves_until_sigterm_and_exits_zero():
    proc, url = _start_cli("--scenario", "max_num_seqs", "--port", "0", "--seed", "3", "--speed", "2")
    try:
        deadline = time.monotonic() + 20
        while True:
            text = httpx.get(url, timeout=5).text
            if _gauge(text, "vllm:num_requests_waiting")[0] > 0:
                break
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert _gauge(text, "vllm:num_requests_running")[0] in (0.0, 2.0)
        assert 'kv_cache_size_tokens="32768"' in text
        proc.proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
        assert "phase max_num_seqs" in proc.proc.stdout.read()
    finally:
        proc.stop()


@pytest.mark.slow
def test_cli_duration_ends_it():
    proc, url = _start_cli("--scenario", "idle", "--port", "0", "--duration", "1")
    try:
        assert httpx.get(url, timeout=5).status_code == 200
        assert proc.wait(timeout=20) == 0
    finally:
        proc.stop()


@pytest.mark.parametrize(
    "args, named",
    [
        (["--speed", "0"], "speed"),
        (["--speed", "fast"], "speed"),
        (["--scenario", "nope"], "nope"),
        (["--metrics-version", "v9"], "metrics-version"),
        (["--engines", "2", "--metrics-version", "v0"], "engines"),
        (["--engines", "0"], "engines"),
        (["--port", "70000"], "port"),
        (["--scenario-file", "/nonexistent/x.json"], "scenario-file"),
        (["--scenario", "idle", "--scenario-file", "x.json"], "scenario-file"),
        (["--bogus"], "--bogus"),
    ],
)
def test_cli_bad_setting_exits_2_with_one_line_naming_it(args, named, capsys):
    assert sim_main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("kvwatch sim: error:") and named in err, err


def test_cli_bad_scenario_file_exits_2_naming_the_field(tmp_path, capsys):
    f = tmp_path / "bad.json"
    f.write_text(json.dumps({"phases": [{"name": "a", "duration_s": 5}, {"workload": {"rate": -1}}]}))
    assert sim_main(["--scenario-file", str(f)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("kvwatch sim: error: phases[1].workload.rate: "), err


def test_cli_port_in_use_exits_1(capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert sim_main(["--scenario", "idle", "--port", str(port), "--duration", "1"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot listen" in err


def test_cli_lists_the_presets(capsys):
    assert sim_main(["--list-scenarios"]) == 0
    out = capsys.readouterr().out
    names = [line.split()[0] for line in out.splitlines()]
    assert names == list_presets()
    cpu = {"idle", "healthy", "kv_cache", "max_num_seqs", "token_budget", "stalled"}
    new = {"asleep", "max_loras", "kv_transfer"}
    assert set(names) == cpu | new | {"tour"} | {f"gpu_{n}" for n in cpu | new}
