"""The simulated engine as ``llama-server --metrics`` (``llamacpp:`` families of a current build; tests/fixtures/
engines/llamacpp/FAMILIES.md on the engine-data branch, from llama.cpp's tools/server and a real server's captures).

No labels, no histograms, one server = one engine (the simulator refuses ``--engines`` > 1). The simulation is the
same; what llama.cpp would show of it:

* Slots. ``--parallel`` is the simulator's max_num_seqs. llama.cpp gives a request a slot as soon as one is free, and a
  slot's KV is its own share of ``--ctx-size``, so a request never waits for KV: a request the simulated scheduler
  holds back for KV room is, as llama.cpp, *processing* in a slot. ``requests_processing`` = min(in the server,
  slots); ``requests_deferred`` = the rest (waiting because no slot is free). ``/slots`` (``slot_states``) shows each
  slot's context, max_model_len: what a slot holds of it, and a request the simulator ends at max_model_len as one
  llama.cpp cut short at the end of its slot's context.
* No KV gauge: current builds removed ``kv_cache_usage_ratio`` / ``kv_cache_tokens`` (ggml-org/llama.cpp#13660).
* Counters that move when a prompt is processed (``prompt_tokens_total``, computed, cached ones apart in
  ``prompt_tokens_cached_total``; here at the request's first token), only when a request ends
  (``tokens_predicted_total``, ``tokens_predicted_seconds_total``, ``n_tokens_max``), and per decode call
  (``n_decode_total``: the simulator's steps).
* ``prompt_tokens_seconds`` / ``predicted_tokens_seconds`` cover the tokens since the previous ``/metrics`` call (the
  server resets its bucket per scrape); here over the simulated seconds since then (llama.cpp divides by processing
  time). ``n_busy_slots_per_decode`` is the lifetime average, as llama.cpp's.
* Numbers as llama.cpp prints them: integers plain, reals with six significant digits. HELP texts are the real
  server's (captures/ on the engine-data branch).
"""

from __future__ import annotations

import json

from ._text import Text

__all__ = ["render", "render_slots", "slot_states", "slots"]

P = "llamacpp:"


def _num(v: float) -> str:
    return str(v) if isinstance(v, int) else format(v, ".6g")


def slots(e) -> tuple[int, int]:
    """(processing, deferred) as llama.cpp would count the simulated engine's requests."""
    in_server = e.stats.running + e.stats.waiting
    processing = min(in_server, e.cfg.max_num_seqs)
    return processing, in_server - processing


def render(sim, version: str | None = None) -> str:
    """The ``/metrics`` body for ``sim`` as llama-server prints it. Remembers this call on ``sim`` (the per-scrape
    throughput buckets)."""
    (e,) = sim.engines
    s = e.stats
    predicted = int(s.h_generation.sum)
    prompt = s.prompt_local_compute
    t0, prompt0, predicted0 = sim.scrape_marks.get("llamacpp", (0.0, 0, 0))
    dt = sim.now - t0
    sim.scrape_marks["llamacpp"] = (sim.now, prompt, predicted)
    processing, deferred = slots(e)
    out = Text()
    for name, help_, typ, value in (
        ("prompt_tokens_total", "Number of prompt tokens processed, excluding cached tokens", "counter", prompt),
        (
            "prompt_tokens_cached_total",
            "Number of prompt tokens reused from the cache",
            "counter",
            s.prompt_local_cache_hit,
        ),
        ("prompt_seconds_total", "Total time spent processing prompts", "counter", s.h_prefill.sum),
        ("tokens_predicted_total", "Number of generation tokens processed", "counter", predicted),
        ("tokens_predicted_seconds_total", "Total time spent generating tokens", "counter", s.h_decode.sum),
        (
            "n_decode_total",
            "Total number of llama_decode() calls, excluding speculative decoding and multimodal decoding",
            "counter",
            s.steps,
        ),
        ("n_tokens_max", "Largest observed sequence length (prompt + generation)", "counter", s.longest_seq),
        ("spec_decode_num_draft_tokens_total", "Speculative: Total draft tokens generated", "counter", 0),
        (
            "spec_decode_num_accepted_tokens_total",
            "Speculative: Total draft tokens accepted by the target model",
            "counter",
            0,
        ),
        ("spec_decode_num_drafts_total", "Speculative: Total speculative decoding verification steps", "counter", 0),
        ("prompt_tokens_seconds", "Average prompt throughput in tokens/s", "gauge", _rate(prompt - prompt0, dt)),
        (
            "predicted_tokens_seconds",
            "Average generation throughput in tokens/s",
            "gauge",
            _rate(predicted - predicted0, dt),
        ),
        ("requests_processing", "Number of requests processing", "gauge", processing),
        ("requests_deferred", "Number of requests deferred", "gauge", deferred),
        (
            "n_busy_slots_per_decode",
            "Average number of busy slots per llama_decode() call",
            "gauge",
            s.seqs_stepped / s.steps if s.steps else 0.0,
        ),
    ):
        out.family(P + name, help_, typ, [((), value)], fmt=_num)
    return out.text()


def _rate(n: float, dt: float) -> float:
    return n / dt if dt > 0 else 0.0


def slot_states(sim) -> list[dict]:
    """``/slots``: one object per slot (``--parallel``), as llama-server lists them (tools/server/server-context.cpp's
    ``server_slot::to_json``: the fields kvwatch reads and the captures show). Each slot's context ``n_ctx`` is the
    scenario's max_model_len: the longest sequence the server serves is, in llama.cpp, a slot's context (``--ctx-size``
    = max_model_len x ``--parallel``), and the simulator ends a request at max_model_len as llama.cpp cuts one short at
    the end of its slot's context (truncated). A slot's ``n_prompt_tokens`` is its request's prompt and tokens so far;
    once the request has left, its last: prompt + output - 1 (the last token is not cached), ``n_ctx - 1`` for one cut
    short. The running requests, then the head of the queue (in a slot as llama.cpp, see ``slots``), keep the slot they
    were first listed in (the free one used longest ago); a slot keeps its last request's figures when idle (llama.cpp keeps them, and the KV, for the
    next prompt), and one never used has only ``id``, ``n_ctx``, ``speculative``, ``is_processing``. Remembers the
    slots on ``sim`` between calls."""
    (e,) = sim.engines
    n, n_ctx = e.cfg.max_num_seqs, e.cfg.max_model_len
    busy = [*e.running, *list(e.waiting)[: max(0, n - len(e.running))]][:n]
    owner, last, used = sim.scrape_marks.get("llamacpp/slots", ({}, [None] * n, [-1.0] * n))
    here = {r.rid for r in busy}
    last, used = (list(last) + [None] * n)[:n], (list(used) + [-1.0] * n)[:n]
    for rid, i in owner.items():
        if rid not in here and i < n:  # left since the last call: the slot shows where the request ended
            last[i], used[i] = (rid, last[i][3], 0, last[i][3]), sim.now
    owner = {rid: i for rid, i in owner.items() if rid in here and i < n}
    # a new request takes the free slot used longest ago (never used first), as llama.cpp's get_available_slot does
    # without a prompt similar enough to a slot's cache
    free = sorted((i for i in range(n) if i not in owner.values()), key=lambda i: (used[i], i))
    for req in busy:
        if req.rid not in owner:
            owner[req.rid] = free.pop(0)
        final = min(req.prompt_len + req.out_target - 1, n_ctx - 1)
        processed = req.prompt_len - min(req.cached_tokens, req.prompt_len)
        last[owner[req.rid]] = (req.rid, min(req.num_tokens, n_ctx - 1), processed, final)
    sim.scrape_marks["llamacpp/slots"] = (owner, last, used)
    out = []
    for i in range(n):
        slot: dict = {"id": i, "n_ctx": n_ctx, "speculative": False, "is_processing": i in owner.values()}
        if last[i] is not None:
            rid, tokens, processed, _ = last[i]
            slot |= {
                "id_task": rid,
                "n_prompt_tokens": tokens,
                "n_prompt_tokens_processed": processed,
                "n_prompt_tokens_cache": 0,
            }
        out.append(slot)
    return out


def render_slots(sim) -> bytes:
    """The ``/slots`` body (JSON) for ``sim``, as llama-server serves it."""
    return json.dumps(slot_states(sim)).encode()
