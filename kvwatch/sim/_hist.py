"""Histograms with vLLM's bucket layouts (copied from vLLM 0.32's /metrics)."""

from __future__ import annotations

from bisect import bisect_left

__all__ = [
    "Hist",
    "build_1_2_5_buckets",
    "ITERATION_TOKENS_BUCKETS",
    "ITERATION_TOKENS_BUCKETS_V0",
    "N_BUCKETS",
    "PREEMPTION_BUCKETS",
    "REQUEST_LATENCY_BUCKETS",
    "TTFT_BUCKETS",
    "TPOT_BUCKETS",
    "HTTP_HIGHR_BUCKETS",
    "HTTP_BUCKETS",
]

# vLLM's bucket tables, wrapped as vLLM writes them
# fmt: off
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                           120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
# V0 used the CUDA-graph capture sizes (1, 2, 4, then multiples of 8 up to 512).
ITERATION_TOKENS_BUCKETS_V0 = (1, 2, 4) + tuple(range(8, 513, 8))
N_BUCKETS = (1, 2, 5, 10, 20)
PREEMPTION_BUCKETS = (1, 2, 3, 4, 5, 10, 20)
HTTP_HIGHR_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5,
                      5.0, 7.5, 10.0, 30.0, 60.0)
HTTP_BUCKETS = (0.1, 0.5, 1.0)
# fmt: on


def _go(d: float) -> str:
    s = repr(float(d))
    dot = s.find(".")
    if d > 0 and dot > 6:
        return f"{s[0]}.{s[1:dot]}{s[dot + 1 :]}".rstrip("0.") + f"e+{dot - 1:02d}"
    return s


def build_1_2_5_buckets(max_value: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50, ... up to ``max_value`` (vLLM's ``build_1_2_5_buckets``)."""
    out: list[int] = []
    exp = 1
    while True:
        for m in (1, 2, 5):
            v = m * exp
            if v > max_value:
                return tuple(out)
            out.append(v)
        exp *= 10


class Hist:
    """A Prometheus histogram: per-bucket counts (not cumulative), sum and count."""

    __slots__ = ("bounds", "les", "counts", "sum", "count", "created")

    def __init__(self, bounds, created: float = 0.0):
        self.bounds = tuple(float(b) for b in bounds)
        # the "le" label values as prometheus_client prints them (floatToGoString), +Inf last
        self.les = tuple(_go(b) for b in self.bounds) + ("+Inf",)
        self.counts = [0] * (len(self.bounds) + 1)  # last slot: +Inf
        self.sum = 0.0
        self.count = 0
        self.created = created

    def observe(self, value: float, n: int = 1) -> None:
        # Prometheus buckets are "le": a value equal to a bound belongs to that bucket.
        self.counts[bisect_left(self.bounds, value)] += n
        self.sum += value * n
        self.count += n

    def cumulative(self) -> list[int]:
        acc = 0
        out = []
        for c in self.counts:
            acc += c
            out.append(acc)
        return out
