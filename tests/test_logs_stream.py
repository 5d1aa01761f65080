"""`kvwatch logs --follow FILE` and `kvwatch logs -` read a log while it is being written.

The test writes the real vLLM 0.32 kv_cache log into a file (or a pipe) a piece at a time and reads
`kvwatch logs` output as it comes: each record must come out while the writer is still writing (no
EOF), and the process must end cleanly on SIGTERM / Ctrl-C / end of input. Waits are bounded (a
failure, never a measurement).
"""

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.helpers.process import Process

# Every test runs `python -m kvwatch logs` as a process, fed in real time: outside the fast lane.
pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).parent / "fixtures" / "vllm-0.32.0-cpu"
KV = (FIXTURES / "kv_cache" / "server.log").read_text().splitlines(keepends=True)
SEQS = (FIXTURES / "max_num_seqs" / "server.log").read_text().splitlines(keepends=True)
WAIT = 30.0  # seconds before a missing line fails the test


def record_lines(lines):
    return [i for i, line in enumerate(lines) if "Engine 000: Avg prompt throughput" in line]


class Proc:
    def __init__(self, *args, stdin=None):
        env = {k: v for k, v in os.environ.items() if not k.startswith("KVWATCH_")}
        self.proc = Process(
            [sys.executable, "-m", "kvwatch", "logs", *map(str, args)],
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
        ).start()
        self.p = self.proc.proc
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self):
        for line in self.p.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def next_line(self) -> str:
        try:
            line = self.lines.get(timeout=WAIT)
        except queue.Empty:
            self.kill()
            raise AssertionError("kvwatch logs printed nothing in time") from None
        assert line is not None, f"kvwatch logs ended early: {self.p.stderr.read()}"
        return line

    def next_json(self) -> dict:
        return json.loads(self.next_line())

    def rest(self) -> str:
        out = []
        while (line := self.lines.get(timeout=WAIT)) is not None:
            out.append(line)
        return "".join(out)

    def wait(self) -> int:
        try:
            return self.p.wait(timeout=WAIT)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self):
        self.proc.stop(sig=signal.SIGKILL)


def append(path: Path, lines):
    with path.open("a") as f:
        f.writelines(lines)
        f.flush()


def test_follow_reads_records_as_the_file_grows_and_survives_rotation(tmp_path):
    log = tmp_path / "vllm.log"
    recs = record_lines(KV)
    append(log, KV[: recs[0]])  # start-up lines and requests, no stats line yet
    proc = Proc("--follow", log, "--json")
    try:
        seen = []
        prev = recs[0]
        for i in recs:
            append(log, KV[prev : i + 1])  # up to and including the stats line, nothing after it yet
            prev = i + 1
            r = proc.next_json()
            seen.append(r)
            assert r["line"] == i + 1
        assert [r["bottleneck"] for r in seen] == ["kv_cache", "kv_cache", "kv_cache", "none"]
        assert seen[0]["kv_cache_usage_ratio"] == 1.0

        # logrotate: the file is moved away and a new server writes a new one
        log.rename(tmp_path / "vllm.log.1")
        seqs = record_lines(SEQS)
        append(log, SEQS[: seqs[0] + 1])
        r = proc.next_json()
        assert (r["line"], r["bottleneck"], r["max_num_seqs"]) == (
            seqs[0] + 1,
            "max_num_seqs",
            {"value": 2, "source": "configured"},
        )

        # truncated in place (copytruncate): read again from the start
        with log.open("w") as f:
            f.writelines(KV[: recs[0] + 1])
        r = proc.next_json()
        assert (r["line"], r["bottleneck"]) == (recs[0] + 1, "kv_cache")

        proc.p.send_signal(signal.SIGTERM)
        assert proc.wait() == 0
        assert proc.rest() == ""  # --json: records only
    finally:
        proc.kill()


def test_follow_text_mode_prints_rows_live_and_the_report_on_ctrl_c(tmp_path):
    log = tmp_path / "vllm.log"
    recs = record_lines(KV)
    append(log, KV[: recs[1] + 1])
    proc = Proc("--follow", log)
    try:
        row = proc.next_line()
        assert row.startswith(f"line {recs[0] + 1}  10:22:22  engine 000  kv_cache") and "waiting 72" in row
        assert proc.next_line().startswith(f"line {recs[1] + 1}  10:22:32")
        proc.p.send_signal(signal.SIGINT)
        assert proc.wait() == 0
        report = proc.rest()
        assert "Dominant bottleneck: kv_cache (2 of 2 records" in report
        assert "KV cache 2,048 tokens" in report
    finally:
        proc.kill()


def test_stdin_pipe_gives_records_before_the_pipe_closes():
    """`kubectl logs -f POD | kvwatch logs -`: the pipe stays open; records come out as they arrive."""
    recs = record_lines(KV)
    proc = Proc("-", "--json", stdin=subprocess.PIPE)
    try:
        proc.p.stdin.writelines(KV[: recs[0] + 1])
        proc.p.stdin.flush()
        r = proc.next_json()
        assert (r["line"], r["bottleneck"], r["requests_waiting"]) == (recs[0] + 1, "kv_cache", 72)
        proc.p.stdin.writelines(KV[recs[0] + 1 :])
        proc.p.stdin.close()
        assert [proc.next_json()["line"] for _ in recs[1:]] == [i + 1 for i in recs[1:]]
        assert proc.wait() == 0
        assert proc.rest() == ""
    finally:
        proc.kill()


def test_stdin_without_stats_lines_exits_1():
    proc = Proc("-", stdin=subprocess.PIPE)
    try:
        proc.p.stdin.write("INFO:     Started server process [1]\n")
        proc.p.stdin.close()
        assert proc.wait() == 1
        assert "no vLLM stats line found in <stdin> (1 lines read)" in proc.p.stderr.read()
    finally:
        proc.kill()
