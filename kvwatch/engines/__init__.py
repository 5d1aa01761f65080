"""The engine contract: one module per serving engine, each an ``Engine`` that reads its own ``/metrics`` families
into ``kvwatch.snapshot.EngineSnapshot``s. Shaped like node_exporter's collectors / blackbox_exporter's probers:
the registry (``ENGINES``) lists them, and everything downstream (window, diagnose, export, the page) is
engine-neutral, asking the engine only for its name, its flags' spellings and which limits it can show at all.

Adding an engine is one module here, its line in ``ENGINES`` and its tests (CONTRIBUTING.md).

An engine may declare a second path (``Engine.extra``, an ``ExtraSource``: llama.cpp's ``/slots``, whose per-slot
context its ``/metrics`` lacks). The scrape stage fetches it right after ``/metrics``, within what is left of the same
deadline, only for an engine that declares it; the adapter's ``parse`` is the only reader of its body, and ``fill``
puts what it says on that scrape's snapshots. A failed, slow or unreadable extra body never fails the scrape: the
snapshots simply lack what it would have added.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from kvwatch.catalog import Action, Bottleneck
from kvwatch.parse import Family
from kvwatch.snapshot import EngineSnapshot

__all__ = ["AUTO", "ENGINES", "Engine", "ExtraSource", "by_name", "detect", "keep_any", "names"]

AUTO = "auto"

Snapshots = dict[tuple[str, str], EngineSnapshot]


@dataclass(frozen=True, slots=True)
class ExtraSource:
    """A second path an engine serves beside its metrics, read right after them (llama.cpp's ``/slots``)."""

    path: str  # replaces the target URL's metrics_path: http://HOST:8080/metrics -> http://HOST:8080/slots
    suffix: str  # a recording's file for it beside <unix_time>.prom: "<unix_time>.slots.json"
    # The body (bytes, at most --max-body-bytes) -> what it says, or None when it is not what the engine serves (wrong
    # shape, types, values): pure, never raises. Run off the event loop for a large body.
    parse: Callable[[bytes], object | None]
    fill: Callable[[object, Snapshots], None]  # parse's result onto the scrape's snapshots (in place)
    record: Callable[[object], bytes]  # parse's result as a recording keeps it: only what parse reads (no prompts)
    enable: str = ""  # for people: how the engine is told to serve it ("llama-server --slots")


@dataclass(frozen=True, slots=True)
class Engine:
    """One serving engine as kvwatch reads it."""

    name: str  # the --engine value and the engine_type label: "vllm"
    title: str  # for people: "vLLM"
    families: frozenset[str]  # the families ``read`` uses, as the engine names them
    keep_family: Callable[[str], bool]  # the parser's filter: only the families ``read`` uses are tokenised
    recognise: Callable[[str], bool]  # a family name that only this engine exports (auto-detection)
    read: Callable[[dict[str, Family], int], Snapshots]  # families -> snapshots by (model_name, engine), bounded
    flags: Mapping[Action, str]  # the engine's own spelling of each action's flag (or operation)
    shows: frozenset[Bottleneck]  # the limits its signals can show at all: no other is ever named for it
    metrics_path: str = "/metrics"  # where it serves Prometheus text
    # prefixes of names its keep_family admits beyond ``families`` (Ray Serve's ray_vllm: for vLLM)
    alias_prefixes: tuple[str, ...] = ()
    cannot_tell: str = ""  # for people: what its metrics cannot show
    extra: ExtraSource | None = None  # a second path read after the metrics (llama.cpp's /slots)

    def flag(self, action: Action) -> str:
        return self.flags.get(action, "")

    def extra_url(self, metrics_url: str) -> str | None:
        """Where this engine serves its extra path, given the target's metrics URL: the URL with its path's
        ``metrics_path`` ending replaced (a proxy's prefix, the query and any credentials kept). None without an
        extra path, or when the target's path does not end in ``metrics_path`` (then where it is cannot be known)."""
        if self.extra is None:
            return None
        parts = urlsplit(metrics_url)
        path = parts.path.rstrip("/")
        if not path.endswith(self.metrics_path):
            return None
        return urlunsplit(parts._replace(path=path[: -len(self.metrics_path)] + self.extra.path))


def _registry() -> tuple[Engine, ...]:
    # Imported here: the adapters import this module's Engine. vLLM first: the order breaks ties in detect().
    from kvwatch.engines import llamacpp, sglang, trtllm, vllm

    return (vllm.ENGINE, sglang.ENGINE, trtllm.ENGINE, llamacpp.ENGINE)


ENGINES: tuple[Engine, ...] = _registry()
_BY_NAME = {e.name: e for e in ENGINES}


def names() -> tuple[str, ...]:
    return tuple(_BY_NAME)


def by_name(name: str) -> Engine:
    return _BY_NAME[name]


_KEEP_ALL = frozenset().union(*(e.families for e in ENGINES))
_ALIASED = tuple(e for e in ENGINES if e.alias_prefixes)
_ALIAS_PREFIXES = tuple(p for e in _ALIASED for p in e.alias_prefixes)


def keep_any(name: str) -> bool:
    """The parser's filter when the engine is chosen from the scrape: any engine's families. One set lookup: it runs
    for every family of every scrape, most of them no engine's (python_gc_*, process_*)."""
    if name in _KEEP_ALL:
        return True
    return name.startswith(_ALIAS_PREFIXES) and any(e.keep_family(name) for e in _ALIASED)


def detect(family_names: Iterable[str]) -> Engine | None:
    """The engine whose own families the scrape carries most of (None: none of any engine's)."""
    counts = {e.name: 0 for e in ENGINES}
    for n in family_names:
        for e in ENGINES:
            if e.recognise(n):
                counts[e.name] += 1
    best = max(counts, key=counts.__getitem__, default=None)
    return _BY_NAME[best] if best is not None and counts[best] else None
