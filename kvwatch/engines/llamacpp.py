"""llama.cpp's adapter: ``llama-server --metrics`` (tools/server, ggml-org/llama.cpp) onto the snapshot.

``llamacpp:`` families carry no labels and no histograms: one engine per server. What they mean here (read from the
server's ``/metrics`` handler and from a real server under load, tests/fixtures/engines/llamacpp):
- ``requests_processing`` is the slots busy; ``requests_deferred`` the requests waiting because no slot was free
  (the server defers a task when ``get_available_slot`` finds none). So while requests are deferred, the busy slots
  *are* the slot count (``--parallel``): the ceiling is read, not inferred. Bar one moment: a finished request's
  slot is released and the deferred task it frees goes to the front of the server's task queue, but ``/metrics``
  posts its own task there too (``post(task, true)``, high priority), so a scrape can land before that request takes
  the slot: fewer busy slots, requests still deferred (seen once in CI). Hence /slots' count where it is read (every
  slot is listed), and the window keeps the most seen (``EngineHistory.ceiling_seen``).
- ``prompt_tokens_total`` (computed, cached ones excluded: ``prompt_tokens_cached_total`` counts those) moves when a
  prompt is processed, ``tokens_predicted_total`` only when a request ends; ``n_decode_total`` (one per
  ``llama_decode`` call) moves while tokens flow, so it is the engine's progress (a stall is no decode).
- ``n_busy_slots_per_decode`` is a lifetime average (busy slots / decodes since start), not the current value: not read.
- ``kv_cache_usage_ratio`` / ``kv_cache_tokens`` exist only in older builds. A current build leaves no trace of a
  full KV cache in ``/metrics`` (requests fail with HTTP 500 "context size has been exceeded"): where no KV gauge is
  exported, the KV cache is not judged, and the diagnosis says so.

``/slots`` (recent builds serve it unless ``--no-slots``; older ones, as the captures', with ``--slots``; 501
``not_supported_error`` when off) shows each slot's context, which
``/metrics`` does not: kvwatch reads it right after ``/metrics`` (``ENGINE.extra``). What its fields mean, from
ggml-org/llama.cpp tools/server/server-context.cpp at 001d906a6d86e2490e394361e7cc6f478b100088 (``server_slot::
to_json``, ``process_token``, ``decode``) and src/llama-context.cpp (``n_ctx_seq``) of the same commit, and from the
real server's captures (tests/fixtures/engines/llamacpp/captures/README.md):
- ``n_ctx`` is the slot's own context, ``llama_n_ctx_seq``: ``--ctx-size / --parallel`` (each slot its own slice of
  the KV cache), or all of ``--ctx-size`` on every slot with ``--kv-unified`` (one pool the slots share; llama-server
  turns it on, with 4 slots, when ``--parallel`` is not given).
- ``n_prompt_tokens`` is the slot's cached tokens (``prompt.tokens.size()``): the prompt and the tokens generated so
  far, despite its name. ``id_task`` and it come from the slot's current task, or its last one once idle (the KV stays
  cached for the next prompt); a slot that never ran a task has only ``id``, ``n_ctx``, ``speculative``,
  ``is_processing``.
- Without context shift (the default) a request is stopped, ``truncated``, when ``n_tokens + 1 >= n_ctx``: a slot
  whose tokens reached ``n_ctx - 1`` had its request cut short at the end of its context (or, by chance, ending
  there). A prompt of ``n_ctx`` tokens or more never reaches a slot (HTTP 400 ``exceed_context_size_error``): unseen.
- With ``--kv-unified`` the pool can fill before any one slot's context does (llama.cpp then purges idle slots, then
  fails every running request with "Context size has been exceeded"): ``/slots`` cannot show that, nor whether the
  pool is unified (every slot reads the same ``n_ctx`` either way), so only a slot's own context is judged.
"""

from __future__ import annotations

import json
import math

from kvwatch.catalog import Action, Bottleneck
from kvwatch.engines import Engine, ExtraSource, Snapshots
from kvwatch.engines._common import engine_index
from kvwatch.parse import Family
from kvwatch.snapshot import Counter, EngineSnapshot, Gauge, SlotContext

__all__ = ["ENGINE", "FLAGS", "fill_slots", "keep_family", "parse_slots", "read", "record_slots"]

_P = "llamacpp:"
PROCESSING, DEFERRED = _P + "requests_processing", _P + "requests_deferred"
GAUGES: dict[str, Gauge] = {
    PROCESSING: Gauge.REQUESTS_RUNNING,
    DEFERRED: Gauge.REQUESTS_WAITING,
    _P + "kv_cache_usage_ratio": Gauge.KV_CACHE_USAGE_RATIO,  # older builds only
}
# Counters by family name (the parser's: without _total).
COUNTERS: dict[str, Counter] = {
    _P + "prompt_tokens": Counter.PROMPT_TOKENS,
    _P + "tokens_predicted": Counter.GENERATION_TOKENS,
    _P + "n_decode": Counter.ENGINE_STEPS,
}
CACHED = _P + "prompt_tokens_cached"  # newer builds: prompt tokens reused from the prompt cache
KEEP_FAMILIES = frozenset([*GAUGES, *COUNTERS, CACHED])


def keep_family(name: str) -> bool:
    return name in KEEP_FAMILIES


def recognise(name: str) -> bool:
    return name.startswith(_P)


def read(families: dict[str, Family], max_engines: int = 64) -> dict[tuple[str, str], EngineSnapshot]:
    """One snapshot (model "", engine "0"): the server's families have no labels. Empty without its request gauges."""
    snap, out = engine_index(max_engines)
    for name, canon in GAUGES.items():
        fam = families.get(name)
        for smp in fam.samples if fam is not None else ():
            if math.isfinite(smp.value):
                snap(smp.labels).gauges[canon] = smp.value
    if not out:
        return out
    for name, counter in COUNTERS.items():
        fam = families.get(name)
        for smp in fam.samples if fam is not None else ():
            if math.isfinite(smp.value) and not smp.name.endswith("_created"):
                snap(smp.labels).counters[counter] = smp.value
    cached = families.get(CACHED)
    for smp in cached.samples if cached is not None else ():
        c = snap(smp.labels).counters
        if math.isfinite(smp.value) and Counter.PROMPT_TOKENS in c:  # prompt_tokens_total excludes cached ones
            c[Counter.PROMPT_TOKENS_COMPUTED] = c[Counter.PROMPT_TOKENS]
            c[Counter.PROMPT_TOKENS] += smp.value
            # every prompt token is looked up in the slot's prompt cache, the cached ones found: vLLM's
            # prefix_cache_queries / _hits in tokens, so the window gives the prefix-cache hit ratio
            c[Counter.PREFIX_CACHE_QUERIES] = c[Counter.PROMPT_TOKENS]
            c[Counter.PREFIX_CACHE_HITS] = smp.value
    for s in out.values():
        s.max_running_requests = _slots_when_deferring(s)
        s.tokens_at_request_end = True  # tokens_predicted_total moves when a request ends
    return out


def _slots_when_deferring(s: EngineSnapshot) -> int | None:
    """Requests are deferred only when no slot is free: then the busy slots are all of them (--parallel), bar the
    moment a slot was just released (module docstring): a lower bound that fill_slots and the window correct."""
    busy, deferred = s.gauges.get(Gauge.REQUESTS_RUNNING), s.gauges.get(Gauge.REQUESTS_WAITING)
    return int(busy) if busy and deferred and deferred > 0 else None


# /slots. At most this many slots are read (llama.cpp's --parallel is far below; a longer list is not its /slots), and
# every number is a C int32 as the server prints it: anything else, and the body is not read.
MAX_SLOTS = 4096
_INT32 = 2**31 - 1


def parse_slots(body: bytes) -> tuple[SlotContext, ...] | None:
    """``/slots`` -> each slot's context, or None when the body is not llama.cpp's ``/slots``: not JSON, not a list
    of objects, a field of the wrong type or out of range, a slot id twice, more than MAX_SLOTS. Pure; never raises."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):  # not JSON, not UTF-8 (UnicodeDecodeError), nested past the stack
        return None
    if not isinstance(data, list) or len(data) > MAX_SLOTS:
        return None
    slots = [_slot(x) for x in data]
    if any(s is None for s in slots):
        return None
    out = tuple(sorted((s for s in slots if s is not None), key=lambda s: s.slot))
    return out if len({s.slot for s in out}) == len(out) else None


def _int(v: object, low: int = 0) -> int | None:
    return v if type(v) is int and low <= v <= _INT32 else None  # type() and not isinstance: a bool is no count


def _slot(x: object) -> SlotContext | None:
    if not isinstance(x, dict) or type(x.get("is_processing")) is not bool:
        return None
    slot, n_ctx = _int(x.get("id")), _int(x.get("n_ctx"), 1)
    tokens = _int(x.get("n_prompt_tokens", 0))  # absent: the slot never ran a task
    raw_task = x.get("id_task")
    task = None if raw_task is None else _int(raw_task, -1)
    if slot is None or n_ctx is None or tokens is None or (raw_task is not None and task is None):
        return None
    # llama.cpp stops a request (truncated) once n_tokens + 1 >= n_ctx (process_token, context shift off)
    return SlotContext(slot, n_ctx, tokens, x["is_processing"], task, tokens + 1 >= n_ctx)


def fill_slots(parsed: object, snaps: Snapshots) -> None:
    """The slots onto the server's snapshot (one: llama.cpp's metrics have no labels), the fullest busy slot's
    share of its context (0 when none is busy: a known nothing, not an unknown), and, while requests are deferred,
    the slot count as the ceiling rather than the busy slots (see the module's docstring)."""
    slots: tuple[SlotContext, ...] = parsed  # type: ignore[assignment]  # parse_slots' result
    busy = [min(1.0, s.tokens / s.n_ctx) for s in slots if s.busy]
    for snap in snaps.values():
        snap.slots = slots
        snap.gauges[Gauge.CONTEXT_USED_MAX_RATIO] = max(busy, default=0.0)
        if snap.max_running_requests is not None and slots:  # deferring: /slots lists every slot, busy or not
            snap.max_running_requests = len(slots)


def record_slots(parsed: object) -> bytes:
    """The slots as a recording keeps them: only the fields kvwatch reads, in /slots' own shape (so that parse_slots
    reads the file back), never the sampling params or, on a debugging server, the prompts."""
    slots: tuple[SlotContext, ...] = parsed  # type: ignore[assignment]
    out = []
    for s in slots:
        slot: dict = {"id": s.slot, "n_ctx": s.n_ctx, "is_processing": s.busy}
        if s.task is not None:
            slot["id_task"] = s.task
        if s.task is not None or s.tokens:
            slot["n_prompt_tokens"] = s.tokens
        out.append(slot)
    return json.dumps(out, separators=(",", ":")).encode()


# llama-server's spelling of each action (tools/server/README.md).
FLAGS: dict[Action, str] = {
    Action.FP8_KV_CACHE: "--cache-type-k q8_0 --cache-type-v q8_0",
    Action.ENABLE_PREFIX_CACHING: "--cache-reuse (prompt caching is on by default)",
    Action.REDUCE_MAX_MODEL_LEN: "--ctx-size / --parallel (each slot's context)",
    Action.RAISE_GPU_MEMORY_UTILIZATION: "--ctx-size (and --n-gpu-layers)",
    Action.RAISE_KV_CACHE_MEMORY_BYTES: "--ctx-size",
    Action.RAISE_MAX_NUM_SEQS: "--parallel",
    Action.LOWER_MAX_NUM_SEQS: "--parallel",
    Action.RAISE_MAX_NUM_BATCHED_TOKENS: "--batch-size / --ubatch-size",
    Action.RAISE_MAX_LORAS: "--lora (adapters are loaded at start)",
    Action.SCALE_PREFILL_SIDE: "-",
    Action.ADD_REPLICA: "replicas",
    Action.RESTART_ENGINE: "restart",
}

ENGINE = Engine(
    name="llamacpp",
    title="llama.cpp",
    families=KEEP_FAMILIES,
    keep_family=keep_family,
    recognise=recognise,
    read=read,
    flags=FLAGS,
    # No step histogram (the token budget), no LoRA queue, no P/D, no sleep state in its metrics.
    shows=frozenset(Bottleneck)
    - {Bottleneck.ASLEEP, Bottleneck.MAX_LORAS, Bottleneck.KV_TRANSFER, Bottleneck.TOKEN_BUDGET},
    cannot_tell="the KV cache in current builds without /slots (no KV gauge; a full context fails requests: HTTP 400, "
    "older builds 500); with /slots, a pool the slots share (--kv-unified, the default without --parallel) filling "
    "before any one slot's context; and the slot count while no request is deferred",
    extra=ExtraSource(
        "/slots",
        ".slots.json",
        parse_slots,
        fill_slots,
        record_slots,
        # common.h's endpoint_slots: on in recent builds (--no-slots turns it off); the captures' build needed --slots
        enable="start llama-server with --slots (recent builds serve it unless --no-slots)",
    ),
)
