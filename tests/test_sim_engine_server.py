"""``kvwatch sim --engine``: each engine's metrics where that engine serves them, its other endpoints, and the
settings it refuses (exit 2, one line)."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvwatch.engines import by_name, detect
from kvwatch.sim import SimServer
from kvwatch.sim.cli import main as sim_main
from kvwatch.sim.expositions import EXPOSITIONS


async def _advanced(sim: SimServer, seconds: float) -> None:
    deadline = time.monotonic() + 20.0
    while sim.sim_time < seconds:
        assert time.monotonic() < deadline, "the simulation does not advance"
        await asyncio.sleep(0.05)


@pytest.mark.parametrize(
    ("engine", "path"),
    [
        ("sglang", "/metrics"),
        ("trtllm", "/prometheus/metrics"),
        ("triton-trtllm", "/metrics"),
        ("llamacpp", "/metrics"),
    ],
)
async def test_sim_serves_the_engines_metrics_at_its_path(engine, path):
    async with SimServer("kv_cache", host="127.0.0.1", port=0, seed=1, speed=8.0, engine=engine) as sim:
        assert sim.url == sim.base_url + path
        await _advanced(sim, 3.0)
        async with httpx.AsyncClient() as c:
            r = await c.get(sim.url)
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=0.0.4")
            fams = {f.name for f in text_string_to_metric_families(r.text)}
            assert detect(fams) is by_name(EXPOSITIONS[engine].engine)
            assert sim.state()["engine_type"] == engine
            if engine == "trtllm":  # trtllm-serve's /metrics is JSON iteration stats, not Prometheus text
                stats = (await c.get(sim.base_url + "/metrics")).json()
                assert stats[0]["maxNumActiveRequests"] == sim.simulator.engines[0].cfg.max_num_seqs
                assert stats[0]["kvCacheStats"]["maxNumBlocks"] == sim.simulator.engines[0].usable
            else:
                assert (await c.get(sim.base_url + "/prometheus/metrics")).status_code == 404
            slots = await c.get(sim.base_url + "/slots")
            if engine == "llamacpp":
                listed = slots.json()
                cfg = sim.simulator.engines[0].cfg
                assert len(listed) == cfg.max_num_seqs  # --parallel
                assert sum(s["is_processing"] for s in listed) == min(
                    cfg.max_num_seqs, sum(e["running"] + e["waiting"] for e in sim.state()["engines"])
                )
                read = by_name("llamacpp").extra.parse(slots.content)  # as kvwatch's adapter reads llama.cpp's
                assert read is not None and {x.n_ctx for x in read} == {cfg.max_model_len}
            else:
                assert slots.status_code == 404


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--engine", "llamacpp", "--engines", "2"], "a llama.cpp server is one engine"),
        (["--engine", "trtllm", "--engines", "2"], "trtllm-serve runs one executor"),
        (["--engine", "triton-trtllm", "--engines", "2"], "Triton's TensorRT-LLM backend reports one executor"),
        (["--engine", "tgi"], "--engine: 'tgi' is not one of vllm, sglang, trtllm, triton-trtllm, llamacpp"),
        (["--engine", "sglang", "--metrics-version", "v0"], "--metrics-version: vLLM's only"),
        (["--engine", "sglang", "--log-file", "/dev/null"], "--log-file: the simulator writes vLLM's log only"),
    ],
)
def test_sim_refuses_what_the_engine_cannot_be_with_one_line(argv, says, capsys):
    assert sim_main(["--port", "0", "--duration", "0.1", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err, err


async def test_sglang_data_parallel_ranks_are_read_as_engines():
    """SGLang's data-parallel ranks (dp_rank) are separate engines to kvwatch, each with its own queue and KV."""
    from kvwatch.state import Target

    async with SimServer("healthy", host="127.0.0.1", port=0, seed=1, speed=8.0, engines=2, engine="sglang") as sim:
        await _advanced(sim, 2.0)
        async with httpx.AsyncClient() as c:
            body = (await c.get(sim.url)).text
    target = Target(sim.url)
    target.observe_body(1.0, body)
    assert target.engine_kind is by_name("sglang")
    assert sorted(target.engines) == [("tiny-llama-dummy", "0"), ("tiny-llama-dummy", "1")]
