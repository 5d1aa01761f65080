"""Memory of ``kvwatch logs`` on a huge log and on an endless standard input.

A generator process (``python -m bench.logmem --generate BYTES``) writes a vLLM 0.32 server log into a pipe:
the real start-up lines of ``tests/fixtures/vllm-0.32.0-cpu/kv_cache/server.log`` once, then a steady run for as
long as it takes: every 10 simulated seconds one stats line (a cycle of healthy, KV-bound, max_num_seqs-bound
and idle states, each held for a while, so the report's timeline keeps growing) and 40 uvicorn access lines,
the clock advancing in vLLM's header (``INFO 12-01 10:22:22``). A real ``python -m kvwatch logs -`` process
reads the pipe to its end and prints its report. Its peak RSS is the kernel's (``wait4``'s ``ru_maxrss``).

The figure is the peak RSS at ``big`` bytes over the peak at ``big / 10`` bytes, measured in the same run: memory
that does not grow with the input reads ~1.0. ``--json`` mode (one object per record, as it is read) is measured
the same way, its output thrown away by the reader.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
START = ROOT / "tests" / "fixtures" / "vllm-0.32.0-cpu" / "kv_cache" / "server.log"
HEADER = "(APIServer pid=23309) INFO {clock} [loggers.py:335] "
ACCESS = '(APIServer pid=23309) INFO:     127.0.0.1:{port} - "POST /v1/completions HTTP/1.1" 200 OK\n'
# (prompt tok/s, generation tok/s, running, waiting, KV %), each held for `hold` records in turn
STATES = (
    (310.8, 216.0, 12, 0, 41.0),  # serving with room to spare
    (975.1, 967.9, 4, 53, 97.3),  # KV-bound
    (540.2, 247.1, 2, 22, 2.2),  # the max_num_seqs ceiling
    (0.0, 0.0, 0, 0, 0.0),  # idle
)
ACCESS_PER_RECORD = 40


def _clock(t: int) -> str:
    return time.strftime("%m-%d %H:%M:%S", time.gmtime(t))


def generate(total: int, out=None) -> None:
    """Write ``total`` bytes (a little more: whole lines) of vLLM log to ``out`` (stdout's buffer)."""
    out = out or sys.stdout.buffer
    start = START.read_bytes()
    first_stats = start.index(b"Engine 000: Avg prompt")
    head = start[: start.rindex(b"\n", 0, first_stats) + 1]  # the start-up lines, up to the first stats line
    out.write(head)
    written, k, t = len(head), 0, 1_796_120_542
    while written < total:
        prompt, gen, running, waiting, kv = STATES[(k // 7) % len(STATES)]
        w = waiting + k % 3 if waiting else 0  # a queue that moves a little, so spans vary
        stats = (
            HEADER.format(clock=_clock(t))
            + f"Engine 000: Avg prompt throughput: {prompt:.1f} tokens/s, Avg generation throughput: {gen:.1f} "
            f"tokens/s, Running: {running} reqs, Waiting: {w} reqs, CPU KV cache usage: {kv:.1f}%, "
            "Prefix cache hit rate: 0.0%\n"
        )
        chunk = stats + "".join(ACCESS.format(port=40000 + (k * 41 + i) % 20000) for i in range(ACCESS_PER_RECORD))
        data = chunk.encode()
        out.write(data)
        written += len(data)
        k += 1
        t += 10
    out.flush()


def spawn_logs(args: list[str], stdin: int, stdout: int, stderr: int) -> int:
    """``python -m kvwatch logs ARGS`` with these file descriptors; its pid. ``posix_spawn``, not fork: a forked
    child's peak RSS would count the parent's pages it had before exec (wait4 reports the higher of the two)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVWATCH_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))  # this tree's kvwatch
    actions = [(os.POSIX_SPAWN_DUP2, stdin, 0), (os.POSIX_SPAWN_DUP2, stdout, 1), (os.POSIX_SPAWN_DUP2, stderr, 2)]
    argv = [sys.executable, "-P", "-m", "kvwatch", "logs", *args]  # -P: not the cwd's kvwatch, PYTHONPATH's
    return os.posix_spawn(sys.executable, argv, env, file_actions=actions)


def wait_peak(pid: int) -> tuple[int, float]:
    """(exit status, peak RSS in MiB) of a spawned child, from the kernel (``wait4``'s ``ru_maxrss``)."""
    _, status, usage = os.wait4(pid, 0)
    return os.waitstatus_to_exitcode(status), usage.ru_maxrss / 1024  # Linux: KiB


def _one(total: int, json_mode: bool) -> dict:
    gen = subprocess.Popen(
        [sys.executable, "-m", "bench.logmem", "--generate", str(total)], cwd=ROOT, stdout=subprocess.PIPE
    )
    assert gen.stdout is not None
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    started = time.monotonic()
    pid = spawn_logs(["-", *(["--json"] if json_mode else [])], gen.stdout.fileno(), out_w, err_w)
    gen.stdout.close()  # kvwatch holds the read end now
    os.close(out_w)
    os.close(err_w)
    tail: list[bytes] = []
    counted = [0]  # lines of kvwatch's output
    err = bytearray()

    def drain(fd: int, keep_tail: bool) -> None:
        with os.fdopen(fd, "rb") as f:
            for line in f:
                if keep_tail:
                    counted[0] += 1
                    tail.append(line)
                    del tail[:-200]  # the whole closing report (its evidence and notes run to ~2 KB)
                else:
                    err.extend(line[:1000])

    readers = [threading.Thread(target=drain, args=a, daemon=True) for a in ((out_r, True), (err_r, False))]
    for r in readers:
        r.start()
    code, peak = wait_peak(pid)
    seconds = time.monotonic() - started
    for r in readers:
        r.join(30)
    if gen.wait(60) != 0 or code != 0:
        raise RuntimeError(f"kvwatch logs exited {code} (generator {gen.returncode}): {bytes(err[-500:])!r}")
    return {
        "bytes": total,
        "json": json_mode,
        "peak_rss_mib": peak,
        "seconds": seconds,
        "mib_per_second": total / 2**20 / seconds,
        "output_lines": counted[0],
        "report_tail": b"".join(tail).decode(errors="replace")[-20000:],
    }


def measure(big: int = 1 << 30, json_big: int | None = None) -> dict:
    """Peak RSS of ``kvwatch logs -`` at ``big`` bytes and at a tenth of it (and the same in --json mode, at
    ``json_big`` bytes, default big)."""
    out: dict = {"runs": []}
    for json_mode, size in ((False, big), (True, json_big or big)):
        small = _one(size // 10, json_mode)
        large = _one(size, json_mode)
        out["runs"] += [small, large]
        key = "json" if json_mode else "report"
        out[key] = {
            "small_bytes": small["bytes"],
            "big_bytes": large["bytes"],
            "small_peak_rss_mib": small["peak_rss_mib"],
            "big_peak_rss_mib": large["peak_rss_mib"],
            "ratio": large["peak_rss_mib"] / small["peak_rss_mib"],
            "big_seconds": large["seconds"],
            "big_mib_per_second": large["mib_per_second"],
        }
    return out


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--generate":
        try:
            generate(int(sys.argv[2]))
        except BrokenPipeError:
            sys.exit(1)
    else:
        sys.exit("usage: python -m bench.logmem --generate BYTES  (the benchmark: python -m bench --only logs)")
