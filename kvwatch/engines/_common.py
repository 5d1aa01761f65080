"""Building blocks every engine adapter shares: the snapshot index (bounded, labels shortened), numbers from label
text, and histograms summed over the series folded into one snapshot."""

from __future__ import annotations

import math

from kvwatch.parse import Family
from kvwatch.snapshot import OVERFLOW, EngineSnapshot, Histogram, short_label

__all__ = ["engine_index", "first_present", "num", "read_histograms"]

_BOUNDS: dict[str, float] = {}  # "le" label text -> bucket bound; the same few recur on every scrape
# Bucket layouts -> one shared tuple: the window keeps a dozen histograms per engine, each with its
# bounds; sharing them saves memory and makes the window's layout comparisons identity checks.
_SHARED_BOUNDS: dict[tuple[float, ...], tuple[float, ...]] = {}


def _bound(text: str) -> float | None:
    le = _BOUNDS.get(text)
    if le is None:
        try:
            le = float(text)
        except ValueError:
            return None
        if le == le:  # NaN is never shared: each one stays a distinct key, as float() makes it
            if len(_BOUNDS) >= 4096:
                _BOUNDS.clear()
            _BOUNDS[text] = le
    return le


def num(value: str | None, kind=float):
    if value is None or value in ("", "None", "none", "null"):
        return None
    try:
        x = float(value)
    except ValueError:
        return None
    if not math.isfinite(x):
        return None
    return int(x) if kind is int else x


def engine_index(max_engines: int, model_label: str = "model_name", engine_label: str = "engine"):
    """``snap(labels)`` -> the snapshot a series belongs to, and ``out``, the snapshots by key: one per
    (``model_label``, ``engine_label``) value pair (vLLM's engine, SGLang's dp_rank; "0" when unlabelled).

    Series are keyed as labelled until ``max_engines`` keys exist; every later key shares the
    overflow snapshot. A closure, not a class: it is called once per sample.
    """
    by_raw: dict[tuple[str, str], EngineSnapshot] = {}  # as labelled; beyond max_engines they share one
    out: dict[tuple[str, str], EngineSnapshot] = {}

    def snap(labels: dict[str, str]) -> EngineSnapshot:
        raw = (labels.get(model_label, ""), labels.get(engine_label, "0"))
        s = by_raw.get(raw)
        if s is None:  # a new pair: shortened once here, never per sample
            key = (short_label(raw[0]), short_label(raw[1])) if len(by_raw) < max_engines else (OVERFLOW, OVERFLOW)
            s = out.get(key)
            if s is None:
                s = out[key] = EngineSnapshot(*key)
            s.folded += key == (OVERFLOW, OVERFLOW)
            by_raw[raw] = s
        return s

    return snap, out


def first_present(fams: dict[str, Family], names: tuple[str, ...]) -> Family | None:
    """The family of the newest name that has samples (engines rename metrics across releases)."""
    for n in names:
        fam = fams.get(n)
        if fam is not None and fam.samples:
            return fam
    return None


def read_histograms(
    canon: str, fam: Family, snap, out: dict[tuple[str, str], EngineSnapshot], key_labels=("model_name", "engine")
) -> None:
    for key, (buckets, (hsum, hcount)) in _sum_histogram_series(fam, snap, *key_labels).items():
        if not buckets or math.inf not in buckets:
            continue  # a histogram without +Inf is not usable for quantiles
        if not (math.isfinite(hsum) and math.isfinite(hcount) and all(map(math.isfinite, buckets.values()))):
            continue  # NaN or an infinite count (or sums that overflowed): unusable, like a missing one
        out[key].histograms[canon] = _histogram(buckets, hsum, hcount)


def _sum_histogram_series(
    fam: Family, snap, model_label: str, engine_label: str
) -> dict[tuple[str, str], tuple[dict[float, float], list[float]]]:
    """Per snapshot key: buckets {bound: count} and [sum, count], added over the series folded into it."""
    acc: dict[tuple[str, str], tuple[dict[float, float], list[float]]] = {}
    acc_raw: dict[tuple[str, str], tuple[dict[float, float], list[float]]] = {}  # the same, by raw labels
    for smp in fam.samples:
        name = smp.name
        if name.endswith("_created"):
            continue
        labels = smp.labels
        # Looked up by raw labels first: one dict probe per sample instead of a snap() call.
        raw = (labels.get(model_label, ""), labels.get(engine_label, "0"))
        entry = acc_raw.get(raw)
        if entry is None:
            es = snap(labels)
            entry = acc_raw[raw] = acc.setdefault((es.model_name, es.engine), ({}, [0.0, 0.0]))
        buckets, sc = entry
        if name.endswith("_bucket"):
            le = _bound(labels.get("le", ""))
            if le is None:
                continue
            buckets[le] = buckets.get(le, 0.0) + smp.value
        elif name.endswith("_sum"):
            sc[0] += smp.value
        elif name.endswith("_count"):
            sc[1] += smp.value
    return acc


def _histogram(buckets: dict[float, float], hsum: float, hcount: float) -> Histogram:
    bounds = tuple(sorted(buckets))
    if len(_SHARED_BOUNDS) >= 1024:
        _SHARED_BOUNDS.clear()  # endless layouts from a hostile upstream must not grow memory
    bounds = _SHARED_BOUNDS.setdefault(bounds, bounds)  # one tuple per bucket layout, not per scrape
    return Histogram(bounds, [buckets[b] for b in bounds], hsum, hcount)
