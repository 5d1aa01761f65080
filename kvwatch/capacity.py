"""Capacity and demand in sequences, per engine: the scaling signal (``kvwatch_capacity_sequences{limit}``,
``kvwatch_capacity_sequences_effective``, ``kvwatch_demand_sequences``).

Each limit says how many sequences the engine holds at the lengths it serves now:
- ``kv_cache``: KV capacity tokens / mean prompt + output tokens of finished requests (vLLM reserves every
  token of a running sequence's context, ``kv_cache_manager.allocate_slots``);
- ``max_num_seqs``: the ceiling itself, configured or inferred (the scheduler admits while
  ``len(self.running) < self.max_num_running_reqs``, ``vllm/v1/core/sched/scheduler.py``);
- ``token_budget``: ``max_num_batched_tokens x output / (computed prompt + output)``, the steady state
  ``kvwatch plan`` uses (``kvwatch.plan.budget_sequences``);
- ``max_loras``: while every LoRA slot is taken and other adapters wait (``lora_requests_info``: running adapters
  at ``max_lora``, waiting adapters named), the sequences running now: with the adapters it can load, that is
  what the engine holds (the scheduler skips a request whose adapter would exceed max_loras,
  ``vllm/v1/core/sched/scheduler.py``). Unknown otherwise: how many sequences the slots allow depends on the
  traffic's adapter mix, which only a full set of slots shows.
The effective capacity is the smallest (``kvwatch.plan.binding_limit``: KV first among equals). A limit whose
inputs are unknown is left out, never guessed: no finished request yet means no KV figure.

Demand is the sequences that want a slot: Running + Waiting (every reason: a ``deferred`` request needs a slot
too once its adapter or grammar is ready) + Swapped (V0), window means. Requests the API server refuses
before the engine sees them (a prompt over ``max_model_len``, a client's rate limit) reach neither gauge and
are not counted.
"""

from __future__ import annotations

from kvwatch.catalog import Bottleneck
from kvwatch.plan import binding_limit, budget_sequences
from kvwatch.window import Signals

__all__ = ["capacity_sequences", "demand_sequences", "effective_capacity", "lora_slots_full", "lora_slots_unattributed"]


def capacity_sequences(
    s: Signals, max_num_seqs: int | None, max_num_batched_tokens: int | None
) -> dict[Bottleneck, float]:
    """Sequences each known limit holds at the observed lengths."""
    out: dict[Bottleneck, float] = {}
    if s.capacity.estimated_max_concurrency is not None:
        out[Bottleneck.KV_CACHE] = s.capacity.estimated_max_concurrency
    if max_num_seqs:
        out[Bottleneck.MAX_NUM_SEQS] = float(max_num_seqs)
    budget = _budget_sequences(s, max_num_batched_tokens)
    if budget is not None:
        out[Bottleneck.TOKEN_BUDGET] = budget
    if lora_slots_full(s) and s.queue.running:
        out[Bottleneck.MAX_LORAS] = s.queue.running
    return out


def lora_slots_full(s: Signals) -> bool:
    """Every LoRA slot holds a running adapter while other adapters wait."""
    c = s.capacity
    return bool(c.max_lora and c.lora_waiting and (c.lora_running or 0) >= c.max_lora)


def lora_slots_unattributed(s: Signals) -> bool:
    """Every LoRA slot held a running adapter at some sample of the current queue, and the engine does not say which
    adapters wait (SGLang's lora_pool_slots_used / _total; vLLM's lora_requests_info names them, 0 when none wait):
    the slots may be what holds the queue, and a queue they hold looks like a Running ceiling or steady prefill."""
    return s.capacity.lora_waiting is None and any(p.lora_slots_full for p in s.queue.streak)


def _budget_sequences(s: Signals, budget: int | None) -> float | None:
    prompt, seq = s.capacity.mean_prompt_tokens, s.capacity.mean_sequence_tokens
    if not budget or prompt is None or seq is None or seq <= prompt:
        return None
    return budget_sequences(budget, prompt * _computed_share(s), seq - prompt)


def _computed_share(s: Signals) -> float:
    """Share of prompt tokens the engine computes (prefix-cache hits cost no step budget): computed / all
    prompt tokens when vLLM splits them by source (0.12+), else 1 - the prefix-cache hit ratio."""
    th = s.throughput
    if th.prompt_tokens_all_per_second and th.prompt_tokens_per_second is not None:
        return min(1.0, th.prompt_tokens_per_second / th.prompt_tokens_all_per_second)
    if th.prefix_cache_hit_ratio is not None:
        return 1.0 - th.prefix_cache_hit_ratio
    return 1.0


def effective_capacity(limits: dict[Bottleneck, float]) -> tuple[Bottleneck, float] | None:
    """The binding limit and its sequences; None when no limit is known."""
    if not limits:
        return None
    b = binding_limit(limits)
    return b, limits[b]


def demand_sequences(s: Signals) -> float | None:
    q = s.queue
    running = q.running_mean if q.running_mean is not None else q.running
    waiting = q.waiting_mean if q.waiting_mean is not None else q.waiting
    if running is None and waiting is None:
        return None
    return (running or 0.0) + (waiting or 0.0) + (q.swapped or 0.0)
