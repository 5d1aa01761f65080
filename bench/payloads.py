"""The payloads the benchmark feeds kvwatch and the baseline parser.

- ``real``: the real vLLM 0.32 captures in ``tests/fixtures/vllm-0.32.0-cpu/kv_cache`` (one engine,
  ~56 KB, ~620 lines), in capture order, so counters and histograms move as they did on the server.
- ``relabel(body, engines, models)``: the same capture as a data-parallel server would expose it:
  every ``vllm:*`` series repeated per (model_name, engine), other families kept once.
- ``big(body, series)``: the capture plus ~``series`` series of families kvwatch does not read
  (gauges, counters with ``_created``, histograms; some under the ``vllm:`` prefix), placed before and
  after the vLLM families, as a busy node or application exporter would add them.
"""

from __future__ import annotations

from tests.helpers.recordings import FIXTURES, captures

MODEL = "tiny-llama-dummy"


def real_bodies() -> list[str]:
    bodies = captures("kv_cache")
    if not bodies:
        raise SystemExit(f"bench: no captures in {FIXTURES / 'kv_cache'}")
    return bodies


def _blocks(body: str) -> list[tuple[list[str], list[str]]]:
    """(comment lines, sample lines) per family block, in order."""
    blocks: list[tuple[list[str], list[str]]] = []
    for line in body.splitlines():
        if not line:
            continue
        if line.startswith("#"):
            if not blocks or blocks[-1][1]:
                blocks.append(([], []))
            blocks[-1][0].append(line)
        else:
            if not blocks:
                blocks.append(([], []))
            blocks[-1][1].append(line)
    return blocks


def relabel(body: str, engines: int, models: int = 1) -> str:
    """``body`` with every vLLM series repeated for ``models`` model names x ``engines`` engines."""
    names = [MODEL] + [f"{MODEL}-{i + 1}" for i in range(models - 1)]
    out: list[str] = []
    for comments, samples in _blocks(body):
        out.extend(comments)
        seen: set[str] = set()
        for m in names:
            for e in range(engines):
                for line in samples:
                    if not line.startswith("vllm:") or ('engine="0"' not in line and "model_name=" not in line):
                        new = line
                    else:
                        new = line.replace('engine="0"', f'engine="{e}"').replace(
                            f'model_name="{MODEL}"', f'model_name="{m}"'
                        )
                    if new not in seen:
                        seen.add(new)
                        out.append(new)
    return "\n".join(out) + "\n"


def _irrelevant(series: int) -> tuple[str, str]:
    """Families kvwatch must skip, about ``series`` sample lines in all, split in two halves."""
    lines: list[str] = []
    fam = 0
    buckets = ("0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1.0", "2.5", "+Inf")
    while len(lines) - 2 * fam < series:  # sample lines (each family adds two comment lines)
        kind = fam % 4
        prefix = "vllm:unused_" if fam % 10 == 9 else "app_"
        name = f"{prefix}family_{fam}"
        if kind in (0, 1):  # gauge, 200 series
            lines += [f"# HELP {name} An unrelated gauge.", f"# TYPE {name} gauge"]
            lines += [f'{name}{{shard="{i}",pod="pod-{i % 17}"}} {i * 1.5}' for i in range(200)]
        elif kind == 2:  # counter, 100 series x (_total, _created)
            lines += [f"# HELP {name}_total An unrelated counter.", f"# TYPE {name}_total counter"]
            for i in range(100):
                lines.append(f'{name}_total{{path="/api/v{i % 3}/item/{i}",code="200"}} {i * 7.0}')
                lines.append(f'{name}_created{{path="/api/v{i % 3}/item/{i}",code="200"}} 1.7961205e+09')
        else:  # histogram, 16 series x (10 buckets + sum + count)
            lines += [f"# HELP {name}_seconds An unrelated histogram.", f"# TYPE {name}_seconds histogram"]
            for i in range(16):
                lab = f'handler="/h{i}",method="GET"'
                lines += [f'{name}_seconds_bucket{{{lab},le="{b}"}} {j * 3.0 + i}' for j, b in enumerate(buckets)]
                lines.append(f"{name}_seconds_sum{{{lab}}} {i * 11.25}")
                lines.append(f"{name}_seconds_count{{{lab}}} {27.0 + i}")
        fam += 1
    # split at a family boundary near the middle
    mid = len(lines) // 2
    while not lines[mid].startswith("# HELP"):
        mid += 1
    return "\n".join(lines[:mid]) + "\n", "\n".join(lines[mid:]) + "\n"


def big(bodies: list[str], series: int = 100_000) -> list[str]:
    """Each body with ~``series`` unrelated series around it."""
    head, tail = _irrelevant(series)
    return [head + b + tail for b in bodies]


def sample_lines(body: str) -> int:
    return sum(1 for line in body.splitlines() if line and not line.startswith("#"))
