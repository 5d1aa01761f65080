"""The CLI end to end: real processes, real HTTP, recorded real vLLM snapshots served on loopback."""

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvwatch.catalog import Bottleneck
from tests.helpers.fake_vllm import FakeVllm
from tests.helpers.ports import free_port
from tests.helpers.recordings import FIXTURES

KVWATCH = [sys.executable, "-m", "kvwatch"]

# Every test starts kvwatch as a process (servers, one-shot runs): outside the fast lane.
pytestmark = pytest.mark.slow


def env(**extra):
    e = {k: v for k, v in os.environ.items() if not k.startswith("KVWATCH_")}
    e.update(extra)
    return e


async def start(*args, **env_extra):
    return await asyncio.create_subprocess_exec(
        *KVWATCH, *args, env=env(**env_extra), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )


async def wait_http(url, timeout=20.0):
    async with httpx.AsyncClient() as c:
        for _ in range(int(timeout / 0.1)):
            try:
                r = await c.get(url)
                return r
            except httpx.HTTPError:
                await asyncio.sleep(0.1)
    raise AssertionError(f"{url} never answered")


def samples(text):
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


async def stop(proc):
    if proc.returncode is None:
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            proc.kill()
            await proc.wait()
    return proc.returncode


async def test_run_serves_metrics_diagnosis_and_probes():
    async with FakeVllm() as up:
        up.serve_dir("kv_cache")
        up.index = 10
        port = free_port()
        proc = await start("run", "--target", up.url, "--listen", f"127.0.0.1:{port}", "--interval", "0.5")
        try:
            base = f"http://127.0.0.1:{port}"
            assert (await wait_http(base + "/readyz")).status_code == 200
            async with httpx.AsyncClient() as c:
                for _ in range(60):
                    text = (await c.get(base + "/metrics")).text
                    m = samples(text)
                    key = (
                        "kvwatch_bottleneck",
                        (
                            ("bottleneck", "kv_cache"),
                            ("engine", "0"),
                            ("model_name", "tiny-llama-dummy"),
                            ("target", up.url),
                        ),
                    )
                    if m.get(key) == 1.0:
                        break
                    await asyncio.sleep(0.25)
                else:
                    raise AssertionError(text[-3000:])
                assert m[("kvwatch_up", (("target", up.url),))] == 1.0
                assert m[("kvwatch_build_info", (("version", "0.1.0"),))] == 1.0
                states = [v for (n, lbl), v in m.items() if n == "kvwatch_bottleneck"]
                assert sorted(states) == [0.0] * (len(Bottleneck) - 1) + [1.0]
                recs = {dict(lbl)["action"] for (n, lbl), v in m.items() if n == "kvwatch_recommendation"}
                assert "fp8_kv_cache" in recs
                assert (
                    m[
                        (
                            "kvwatch_kv_cache_capacity_tokens",
                            (("engine", "0"), ("model_name", "tiny-llama-dummy"), ("target", up.url)),
                        )
                    ]
                    == 2048
                )

                r = await c.get(base + "/api/v1/diagnosis")
                doc = r.json()
                assert r.headers["content-type"].startswith("application/json")
                assert doc["target"] == up.url and doc["bottleneck"] == "kv_cache"
                assert doc["engines"][0]["recommendations"][0]["action"] == "fp8_kv_cache"

                r = await c.get(base + "/")
                assert 'href="metrics"' in r.text and "api/v1/diagnosis" in r.text
                assert r.headers["Server"].startswith("kvwatch/")
                assert (await c.get(base + "/healthz")).status_code == 200
                for _ in range(100):  # a few more scrapes for the log check below
                    if up.requests >= 3:
                        break
                    await asyncio.sleep(0.1)
        finally:
            assert await stop(proc) == 0
        # At the default (info) level a scrape is not news: httpx's per-request line stays out of the log.
        log = (await proc.stderr.read()).decode()
        assert up.requests >= 3 and "HTTP Request:" not in log, log[-2000:]


async def test_readyz_does_not_depend_on_vllm():
    port = free_port()
    dead = f"http://127.0.0.1:{free_port()}/metrics"
    proc = await start("--target", dead, "--listen", f"127.0.0.1:{port}")  # run is the default subcommand
    try:
        r = await wait_http(f"http://127.0.0.1:{port}/readyz")
        assert r.status_code == 200
        errors = ("kvwatch_scrape_errors_total", (("reason", "connect"), ("target", dead)))
        async with httpx.AsyncClient() as c:
            # until a failed scrape is counted (the first comes at start; a loaded machine may delay it), not
            # a fixed 1.5 s
            for _ in range(200):
                m = samples((await c.get(f"http://127.0.0.1:{port}/metrics")).text)
                if m.get(errors, 0) >= 1:
                    break
                await asyncio.sleep(0.1)
            assert (await c.get(f"http://127.0.0.1:{port}/readyz")).status_code == 200
        assert m[("kvwatch_up", (("target", dead),))] == 0.0
        assert m[errors] >= 1
    finally:
        assert await stop(proc) == 0


async def test_record_then_replay(tmp_path):
    async with FakeVllm() as up:
        up.serve_dir("max_num_seqs")
        up.index = 12
        proc = await start("record", up.url, "--out", str(tmp_path), "--duration", "3", "--interval", "0.5")
        out, err = await asyncio.wait_for(proc.communicate(), 30)
        assert proc.returncode == 0, err
        files = sorted(tmp_path.glob("*.prom"))
        # one scrape per 0.5 s tick for 3 s (a loaded machine can time some out: they are attempts, not files)
        saved, failed = map(
            int, re.search(r"recorded (\d+) snapshots .* \((\d+) failed scrapes\)", out.decode()).groups()
        )
        assert 4 <= saved + failed <= 8 and len(files) == saved >= 1, (saved, failed, len(files))
        assert all(float(f.name[:-5]) > 1.7e9 for f in files)
        assert files[0].read_text() == up.bodies[12]

    # The run's own --max-num-seqs 2 (its config.txt) as the hint: the replay is then judged on every snapshot, not on
    # how many a loaded machine recorded (without it, max_num_seqs needs a plateau of several: CI under load once read none).
    proc = await start("diagnose", "--replay", str(tmp_path), "--max-num-seqs", "2", "--json")
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err
    doc = json.loads(out)
    assert doc["summary"]["worst"]["bottleneck"] == "max_num_seqs"


async def test_diagnose_live_url():
    async with FakeVllm() as up:
        up.serve_dir("token_budget")
        up.index = 11
        proc = await start("diagnose", up.url, "--duration", "3", "--interval", "0.5", "--json")
        out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err
    doc = json.loads(out)
    assert doc["target"] == up.url
    # every diagnosis but the first (one sample: no tokens per step yet) or two says so; how many there are in
    # 3 s depends on the machine (missed ticks are skipped)
    seen = doc["summary"]["bottlenecks_seen"]
    budget = seen.get("token_budget", 0)
    assert budget >= 1 and budget >= sum(seen.values()) - 2, seen


def test_replay_timeline_is_one_json_per_snapshot():
    d = FIXTURES / "kv_cache"
    r = subprocess.run(
        [*KVWATCH, "diagnose", "--replay", str(d), "--timeline"], capture_output=True, text=True, env=env(), timeout=60
    )
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert len(lines) == len(list(d.glob("*.prom")))
    assert [x["timestamp"] for x in lines] == sorted(x["timestamp"] for x in lines)
    assert {x["bottleneck"] for x in lines} == {"idle", "kv_cache", "none"}


def test_replay_text_report():
    r = subprocess.run(
        [*KVWATCH, "diagnose", "--replay", str(FIXTURES / "kv_cache")],
        capture_output=True,
        text=True,
        env=env(),
        timeout=60,
    )
    assert r.returncode == 0
    assert "worst moment" in r.stdout and "=> fp8_kv_cache" in r.stdout


@pytest.mark.parametrize(
    "args, env_extra, names",
    [
        (["--interval", "abc"], {}, "--interval"),
        (["--max-num-seqs", "-1"], {}, "--max-num-seqs"),
        (["--target", "localhost:8000"], {}, "--target"),
        ([], {"KVWATCH_LISTEN": "nope"}, "KVWATCH_LISTEN"),
        (["--interval", "1", "--timeout", "2"], {}, "--timeout"),
        (["--bearer-token-file", "/nonexistent/token"], {}, "--bearer-token-file"),
        (["--frobnicate"], {}, "--frobnicate"),
        (["diagnose", "--replay", "/nonexistent"], {}, "--replay"),
    ],
)
def test_bad_config_exits_2_with_one_line_naming_the_setting(args, env_extra, names):
    r = subprocess.run([*KVWATCH, *args], capture_output=True, text=True, env=env(**env_extra), timeout=30)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert names in lines[0]


def test_console_script_and_module_agree():
    script = Path(sys.executable).parent / "kvwatch"
    assert script.exists()
    a = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=30)
    b = subprocess.run([*KVWATCH, "--version"], capture_output=True, text=True, timeout=30)
    assert a.stdout == b.stdout == "kvwatch 0.1.0\n"
