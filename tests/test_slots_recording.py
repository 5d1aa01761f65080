"""Recordings carry llama.cpp's ``/slots``: ``kvwatch record`` writes ``<t>.slots.json`` beside each ``<t>.prom`` (what
kvwatch reads of it, nothing more: no sampling params, no prompts), and ``kvwatch diagnose --replay`` reads it back, so
a replay of a real capture judges each slot's context as the live scrape loop would. In-process, against a fake
llama.cpp serving a real capture on loopback (tests/helpers/fake_llamacpp.py)."""

from __future__ import annotations

import json
import shutil

import pytest

from kvwatch import cli
from kvwatch.engines import llamacpp
from kvwatch.recording import extra_file, read_recorded, recording_files
from tests.helpers.fake_llamacpp import CAPTURES, FakeLlamaCpp


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for name in [n for n in __import__("os").environ if n.startswith("KVWATCH_")]:
        monkeypatch.delenv(name)
    monkeypatch.setattr(cli, "_setup_logging", lambda settings: None)  # main() would configure pytest's root logger


def _replay(directory, capsys) -> dict:
    assert cli.main(["diagnose", "--replay", str(directory), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_replay_of_a_capture_with_its_slots_names_the_full_slot_context(capsys):
    doc = _replay(CAPTURES / "context_too_small", capsys)
    assert doc["bottleneck"] == "kv_cache" and doc["engine_type"] == "llamacpp"
    (e,) = doc["engines"]
    assert "of their slot's 256-token context" in e["evidence"][0], e["evidence"]
    assert e["signals"]["slot_context_tokens"] == 256 and e["signals"]["context_full_requests"] >= 1
    assert {r["flag"] for r in e["recommendations"]} >= {"--ctx-size", "--parallel"}


def test_the_same_replay_without_the_slots_files_does_not_judge_the_kv_cache(tmp_path, capsys):
    for _, p in recording_files(CAPTURES / "context_too_small"):
        shutil.copy(p, tmp_path / p.name)  # the .prom files alone: a server without --slots
    doc = _replay(tmp_path, capsys)
    assert doc["bottleneck"] != "kv_cache"
    (e,) = doc["engines"]
    assert any(line.startswith("KV cache not judged") for line in e["evidence"]), e["evidence"]


def test_record_keeps_what_kvwatch_reads_of_slots_beside_each_snapshot(tmp_path, capsys):
    with FakeLlamaCpp() as llama:
        llama.serve_capture("context_too_small")
        llama.index = 3
        # 2-s ticks with a 1.9-s deadline for both paths: a loaded machine still reads them on loopback
        argv = ["record", llama.url, "--out", str(tmp_path), "--duration", "3", "--interval", "2", "--timeout", "1.9"]
        assert cli.main(argv) == 0, capsys.readouterr().err
    served = {
        body: slots for body, slots in (read_recorded(p) for _, p in recording_files(CAPTURES / "context_too_small"))
    }
    files = recording_files(tmp_path)
    assert files and llama.slots_requests == len(files)
    for _, prom in files:
        slots = extra_file(prom, ".slots.json")
        kept = slots.read_bytes()
        original = served[prom.read_text()]  # the /slots body served with this /metrics body
        assert llamacpp.parse_slots(kept) == llamacpp.parse_slots(original)
        assert b"params" in original and b"params" not in kept and b"next_token" not in kept
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        n for _, prom in files for n in (prom.name, extra_file(prom, ".slots.json").name)
    )
