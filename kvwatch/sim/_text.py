"""The Prometheus text format (0.0.4) for the non-vLLM expositions: labels in the order the engine declares them
(prometheus_client prints ``labelnames`` in declaration order), no ``_created`` series (SGLang runs prometheus_client
in multiprocess mode, which has none; llama.cpp writes its text by hand), numbers as prometheus_client prints them.

vLLM's exposition keeps its own writer (kvwatch.sim.exposition), byte-compared with real captures.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from .exposition import float_to_go

__all__ = ["Labels", "Text", "merged"]

Labels = tuple[tuple[str, str], ...]  # (name, value) pairs in the engine's order


def _esc(v: str) -> str:
    return v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _pairs(labels: Labels) -> str:
    return ",".join(f'{k}="{_esc(v)}"' for k, v in labels)


class Text:
    """Accumulates one exposition."""

    __slots__ = ("parts",)

    def __init__(self) -> None:
        self.parts: list[str] = []

    def family(
        self, name: str, help_: str, typ: str, rows: Iterable[tuple[Labels, float]], fmt: Callable = float_to_go
    ) -> None:
        """A gauge or counter: ``name`` as printed (a counter's with ``_total``); ``fmt`` prints a value."""
        self.parts.append(f"# HELP {name} {help_}\n# TYPE {name} {typ}\n")
        for labels, value in rows:
            self.parts.append(f"{name}{{{_pairs(labels)}}} {fmt(value)}\n" if labels else f"{name} {fmt(value)}\n")

    def histogram(self, name: str, help_: str, rows: Iterable[tuple[Labels, _Hist]]) -> None:
        self.parts.append(f"# HELP {name} {help_}\n# TYPE {name} histogram\n")
        for labels, h in rows:
            pre = _pairs(labels)
            sep = "," if pre else ""
            acc = 0.0
            for le, n in zip(h.les, h.counts, strict=True):
                acc += n
                self.parts.append(f'{name}_bucket{{{pre}{sep}le="{le}"}} {float_to_go(acc)}\n')
            tail = f"{{{pre}}}" if pre else ""
            self.parts.append(f"{name}_count{tail} {float_to_go(h.count)}\n{name}_sum{tail} {float_to_go(h.sum)}\n")

    def text(self) -> str:
        return "".join(self.parts)


@dataclass(frozen=True, slots=True)
class _Hist:
    les: Sequence[str]
    counts: Sequence[float]  # per bucket, not cumulative, +Inf last
    sum: float
    count: float


def merged(hists: Sequence) -> _Hist:
    """Several engines' histograms of one layout as one (a front end that observes every engine's requests)."""
    first = hists[0]
    counts = [sum(h.counts[i] for h in hists) for i in range(len(first.counts))]
    return _Hist(first.les, counts, sum(h.sum for h in hists), sum(h.count for h in hists))
