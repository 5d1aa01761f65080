"""Real logs are messy. Each kind of mess is applied to the real vLLM 0.32 logs (and to the example
logs of older formats); every complete stats record must still come out, with the same values and the
same diagnosis, and nothing may fail.
"""

import functools
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kvwatch.logs import LogSession

HERE = Path(__file__).parent
REAL = sorted((HERE / "fixtures" / "vllm-0.32.0-cpu").glob("*/server.log"))
EXAMPLES = sorted(p for p in (HERE / "fixtures" / "logs").glob("*.log") if not p.name.startswith("messy_"))
KV_CACHE = HERE / "fixtures" / "vllm-0.32.0-cpu" / "kv_cache" / "server.log"


def read(text: str) -> LogSession:
    s = LogSession()
    for i, raw in enumerate(text.split("\n"), 1):
        s.feed(raw, i)
    s.finish()
    return s


def summary(s: LogSession) -> list[tuple]:
    """Everything a record says, except its line number (which a wrap changes)."""
    out = []
    for r in s.results:
        rec, d = r.record, r.diagnosis
        out.append(
            (
                rec.engine,
                rec.clock,
                rec.prompt_tokens_per_second,
                rec.generation_tokens_per_second,
                rec.requests_running,
                rec.requests_waiting,
                rec.requests_swapped,
                rec.requests_deferred,
                rec.kv_cache_usage_ratio,
                rec.prefix_cache_hit_ratio,
                rec.preemptions,
                rec.kv_fetch,
                d.bottleneck,
                tuple(x.action for x in d.recommendations),
                d.signals.capacity.capacity_tokens,
            )
        )
    return out


@functools.cache  # one clean read per log, shared by every mess and width applied to it
def clean(path: Path) -> list[tuple]:
    return summary(read(path.read_bytes().decode("utf-8", errors="replace")))


def per_line(text: str, f) -> str:
    return "\n".join(f(i, line) for i, line in enumerate(text.split("\n")))


class Clock:
    """A collector's timestamp for each line: the time of the last vLLM header seen (as a collector would)."""

    def __init__(self):
        self.now = "10:21:00"

    def __call__(self, line: str) -> str:
        m = re.search(r"\d\d-\d\d (\d\d:\d\d:\d\d)", line)
        if m:
            self.now = m[1]
        return self.now


def hard_wrap(text: str, width: int, indent: str = "") -> str:
    return "\n".join(
        ("\n" + indent).join(line[i : i + width] for i in range(0, max(len(line), 1), width))
        for line in text.split("\n")
    )


def paste_wrap(text: str, width: int) -> str:
    """An editor or chat re-wrapping at spaces: each break replaces a space with a newline."""
    return "\n".join(
        "\n".join(textwrap.wrap(line, width, break_long_words=False, break_on_hyphens=False, replace_whitespace=False))
        if line.strip()
        else line
        for line in text.split("\n")
    )


def kubectl_timestamps(text: str) -> str:
    clock = Clock()
    return per_line(text, lambda i, line: f"2026-12-01T{clock(line)}.{i:09d}Z {line}")


def cri(text: str, chunk: int = 90) -> str:
    clock = Clock()

    def f(i, line):
        ts = f"2026-12-01T{clock(line)}.{i:09d}Z"
        parts = [line[k : k + chunk] for k in range(0, max(len(line), 1), chunk)]
        return "\n".join(f"{ts} stdout {'F' if j == len(parts) - 1 else 'P'} {p}" for j, p in enumerate(parts))

    return per_line(text, f)


def docker_json(text: str, chunk: int = 120) -> str:
    clock = Clock()

    def f(i, line):
        ts = f"2026-12-01T{clock(line)}.{i:09d}Z"
        parts = [line[k : k + chunk] for k in range(0, max(len(line), 1), chunk)]
        return "\n".join(
            json.dumps({"log": p + ("\n" if j == len(parts) - 1 else ""), "stream": "stdout", "time": ts})
            for j, p in enumerate(parts)
        )

    return per_line(text, f)


def wrapper_timestamps(text: str) -> str:
    clock = Clock()
    return per_line(text, lambda i, line: f"[2026-12-01 {clock(line)},{i % 1000:03d}] vllm-0 | {line}")


def journald(text: str) -> str:
    clock = Clock()
    return per_line(text, lambda i, line: f"Dec 01 {clock(line)} gpu-node-3 vllm[23309]: {line}")


def is_record(line: str) -> bool:
    return "Avg prompt throughput" in line


def access_log_everywhere(text: str) -> str:
    return per_line(text, lambda i, line: line + '\nINFO:     10.0.0.1:5000 - "GET /metrics HTTP/1.1" 200 OK')


def glue_to_previous(text: str) -> str:
    """Records written without a newline before them (two writers on one stream)."""
    lines = text.split("\n")
    out = []
    for line in lines:
        if is_record(line) and out:
            out[-1] += line
        else:
            out.append(line)
    return "\n".join(out)


def glue_to_next(text: str) -> str:
    lines = text.split("\n")
    out, glue = [], False
    for line in lines:
        if glue:
            out[-1] += line
        else:
            out.append(line)
        glue = is_record(line)
    return "\n".join(out)


def glue_records_together(text: str) -> str:
    """Consecutive stats lines with nothing between them run into one line."""
    lines = [line for line in text.split("\n") if is_record(line)]
    return "".join(lines)


def tqdm_before(text: str) -> str:
    bar = "Processed prompts:  {0}%|{1:<10}| {0}/100 [00:10<00:12,  4.50it/s]"
    return per_line(
        text,
        lambda i, line: (
            "".join(bar.format(p, "#" * (p // 10)) + "\r" for p in (44, 45)) + line if is_record(line) else line
        ),
    )


def tqdm_after(text: str) -> str:
    bar = "Processed prompts: 100%|##########| 100/100 [00:22<00:00,  4.50it/s]"
    return per_line(text, lambda i, line: line + "\n" + bar + "\r" + bar + "\r" if is_record(line) else line)


def ansi(text: str) -> str:
    return text.replace(" INFO ", " \x1b[32mINFO\x1b[0m ").replace(" WARNING ", " \x1b[33mWARNING\x1b[0m ")


MESS = {
    "kubectl --timestamps": kubectl_timestamps,
    "CRI node file, P/F partial lines": cri,
    "docker json-file, split lines": docker_json,
    "wrapper timestamps": wrapper_timestamps,
    "journald prefix": journald,
    "access log between every line": access_log_everywhere,
    "hard wrap 80": lambda t: hard_wrap(t, 80),
    "hard wrap 80, indented": lambda t: hard_wrap(t, 80, "  "),
    "hard wrap 132": lambda t: hard_wrap(t, 132),
    "paste wrap 72": lambda t: paste_wrap(t, 72),
    "glued to the line before": glue_to_previous,
    "glued to the line after": glue_to_next,
    "tqdm bars before records": tqdm_before,
    "tqdm bars after records": tqdm_after,
    "ANSI colours": ansi,
    "CRLF line ends": lambda t: t.replace("\n", "\r\n"),
    "kubectl timestamps, then a terminal wrap": lambda t: hard_wrap(kubectl_timestamps(t), 100),
    "ANSI + tqdm + paste wrap": lambda t: paste_wrap(tqdm_before(ansi(t)), 90),
}


@pytest.mark.parametrize("mess", sorted(MESS))
@pytest.mark.parametrize("log", REAL + EXAMPLES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_mess_changes_nothing(log, mess):
    want = clean(log)
    assert want, "every example has records"
    s = read(MESS[mess](log.read_text()))
    assert summary(s) == want
    assert s.assembler.skipped == []


@pytest.mark.parametrize("log", REAL, ids=lambda p: p.parent.name)
def test_glued_records_with_nothing_between(log):
    """Without their headers, clocks and start-up lines fall away: the values must not."""

    def values(s):
        return [
            (
                r.record.prompt_tokens_per_second,
                r.record.requests_running,
                r.record.requests_waiting,  # noqa: E731
                r.record.kv_cache_usage_ratio,
                r.record.prefix_cache_hit_ratio,
            )
            for r in s.results
        ]

    want = values(read(log.read_text()))
    s = read(glue_records_together(log.read_text()))
    assert values(s) == want and len(s.results) >= 2


WIDTHS = (35, 41, 53, 64, 79, 80, 81, 97, 100, 120, 132, 160, 200, 240)


@pytest.mark.parametrize("mode", ["hard", "paste"])
@pytest.mark.parametrize("log", REAL + EXAMPLES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_any_terminal_width(log, mode):
    want = clean(log)
    for width in WIDTHS:
        text = hard_wrap(log.read_text(), width) if mode == "hard" else paste_wrap(log.read_text(), width)
        assert summary(read(text)) == want, width


def test_incomplete_records_are_skipped_not_fatal():
    lines = KV_CACHE.read_text().split("\n")
    i = next(n for n, line in enumerate(lines) if "Running: 4 reqs, Waiting: 53" in line)
    lines[i] = lines[i][: lines[i].index("Waiting: 53") + 9]  # "... Waiting: 5" and a newline: cut mid-number
    text = "\n".join(lines)
    text = text[: text.rindex("Running: 0 reqs") + 10]  # the file ends inside the last record
    s = read(text)
    assert [r.record.requests_waiting for r in s.results] == [72, 15]
    assert s.assembler.skipped == [i + 1, len(text.split("\n"))]


def test_a_truncated_number_is_never_read_as_a_smaller_one():
    s = read(
        "INFO 12-01 10:00:00 [loggers.py:1] Engine 000: Avg prompt throughput: 1.0 tokens/s, Avg generation "
        "throughput: 2.0 tokens/s, Running: 12 reqs, Waiting: 3"
    )
    assert s.results == [] and s.assembler.skipped == [1]


@pytest.mark.slow  # runs `python -m kvwatch logs`
def test_bytes_that_are_not_utf8_and_huge_lines(tmp_path):
    data = KV_CACHE.read_bytes().replace(b"Triton is installed", b"\xff\xferiton is installed")
    data = b"x" * (3 << 20) + b"\n" + data  # a 3 MiB line without a newline in sight of a record
    f = tmp_path / "binary.log"
    f.write_bytes(data)
    p = subprocess.run([sys.executable, "-m", "kvwatch", "logs", "--json", str(f)], capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr.decode()
    assert [json.loads(line)["bottleneck"] for line in p.stdout.decode().splitlines()] == ["kv_cache"] * 3 + ["none"]


def test_collector_clock_when_lines_carry_no_vllm_header():
    """A logging config that prints the message only: the collector's timestamps give the intervals."""
    msg = (
        "Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 0.0 tokens/s, "
        "Running: 4 reqs, Waiting: 9 reqs, GPU KV cache usage: 20.0%, Prefix cache hit rate: 0.0%"
    )
    text = "\n".join(f"2026-12-01T10:00:{s:02d}.000000000Z {msg}" for s in (0, 5, 10))
    s = read(text)
    assert [r.interval for r in s.results] == [10.0, 5.0, 5.0]  # the first: vLLM's default interval
    # the first record: no plateau, no limit named (max_num_seqs by elimination before issue 14); 9 wait, so
    # undetermined, not "none" (issue 25)
    assert [r.diagnosis.bottleneck for r in s.results] == ["undetermined", "stalled", "stalled"]
    assert s.results[1].diagnosis.signals.throughput.stalled_seconds == 5.0


@pytest.mark.parametrize("name", ["messy_cri_node.log", "messy_terminal_copy.log", "messy_wrapper_glued.log"])
def test_messy_example_files_match_the_clean_log(name):
    want = [x for x in clean(KV_CACHE)]
    got = clean(HERE / "fixtures" / "logs" / name)
    assert got == want[: len(got)] and len(got) >= 3
