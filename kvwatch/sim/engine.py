"""One simulated vLLM V1 engine core: the scheduler, the paged KV cache and the stats it publishes.

The model follows ``vllm/v1/core/sched/scheduler.py`` (FCFS policy) step by step:

* **KV cache** — ``num_gpu_blocks`` blocks of ``block_size`` tokens; one is vLLM's reserved null
  block, so usage is ``1 - free / (num_gpu_blocks - 1)`` (the captures show exactly 63ths for 64
  blocks).  A request holds ``ceil(computed_tokens / block_size)`` blocks.
* **Running first** — each running request is scheduled for ``min(remaining, budget)`` tokens
  (its prefill chunk, or one decode token) under ``max_num_batched_tokens``.  If the blocks for
  those tokens cannot be had, the *newest* running request is preempted (recompute: its blocks
  are freed, ``num_computed_tokens = 0``, it goes back to the *front* of the waiting queue) until
  they can — possibly the request itself.
* **Then waiting** — only if nothing was preempted in this step, while budget remains and
  ``running < max_num_seqs``: the head of the queue is admitted if the blocks for its (uncached)
  scheduled chunk fit in the free blocks (evictable prefix-cache blocks count as free, but touching
  a cached block takes it out of the free pool); otherwise admission stops (FCFS).  A LoRA request
  whose adapter would exceed ``max_loras`` adapters in the batch is skipped ("deferred") and keeps
  its place.  With chunked prefill the blocks needed are those of the first chunk, as in vLLM; for
  prompts within the budget that is the whole uncached prompt.
* **Prefix caching** — shared prefixes are runs of full blocks in a small trie (a workload's shared
  prefix, then a parent's whole prompt for ``n > 1`` siblings).  A run is cached once a request
  finishes computing its prompt; later requests hit every cached run on their chain (never the
  last prompt token, as in vLLM).  Runs nobody references stay cached in the free pool until
  allocation evicts them (LRU).
* **Outputs** — a scheduled request whose computed tokens reach its known tokens samples one
  token at the end of the step.  Stats are published at the end of every step, like vLLM's
  ``SchedulerStats``/``IterationStats``: a stalled engine publishes nothing, so its gauges freeze.
  The prompt counts (``prompt_tokens``, ``iteration_tokens_total``) include a request's prompt once,
  at its first token — recomputation after a preemption is work, not prompt tokens, as in vLLM.

Left out (simplifications): a preempted request's own blocks are not kept for reuse (only shared
prefixes are cached); shared prefixes are cached when the prompt completes rather than block by
block; preemptions are counted when they happen (vLLM counts them with the request's next output);
no priority scheduling, speculative decoding, KV offloading or async scheduling; a KV connector only as
the decode side of P/D (``kv_transfer_tokens_per_s``: each prompt's KV but its last token loads in turn at that rate;
until it has, the scheduler skips the request as vLLM does one WAITING_FOR_REMOTE_KVS, and counts it deferred); the step
time is linear in the batch (see :class:`kvwatch.sim.scenario.StepTime`).
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Sequence

from ._hist import (
    ITERATION_TOKENS_BUCKETS,
    ITERATION_TOKENS_BUCKETS_V0,
    N_BUCKETS,
    PREEMPTION_BUCKETS,
    REQUEST_LATENCY_BUCKETS,
    TPOT_BUCKETS,
    TTFT_BUCKETS,
    Hist,
    build_1_2_5_buckets,
)
from .scenario import EngineConfig

__all__ = ["Engine", "EngineStats", "PrefixRun", "Request"]

INF = math.inf
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")


class PrefixRun:
    """A run of full KV blocks that several requests can share (one node of the prefix trie)."""

    __slots__ = ("key", "parent", "nblocks", "refs", "cached")

    def __init__(self, key, parent: PrefixRun | None, nblocks: int):
        self.key = key
        self.parent = parent
        self.nblocks = nblocks
        self.refs = 0
        self.cached = False


class Request:
    __slots__ = (
        "rid",
        "arrival",
        "prompt_len",
        "max_tokens",
        "out_target",
        "n",
        "lora",
        "chain_keys",
        "num_computed",
        "num_tokens",
        "output",
        "blocks",
        "runs",
        "shared_blocks",
        "scheduled_ts",
        "first_token_ts",
        "last_token_ts",
        "num_preemptions",
        "cached_tokens",
        "prompt_bytes",
        "deferred",
        "kv_start",
        "kv_ready",
        "external_tokens",
    )

    def __init__(self, rid, arrival, prompt_len, out_target, max_tokens, n=1, lora=None, chain_keys=()):
        self.rid = rid
        self.arrival = arrival
        self.prompt_len = prompt_len
        self.out_target = out_target
        self.max_tokens = max_tokens
        self.n = n
        self.lora = lora
        # ((key, tokens_from_start), ...) shortest first: the shared-prefix runs this prompt starts with.
        self.chain_keys = chain_keys
        self.num_computed = 0
        self.num_tokens = prompt_len
        self.output = 0
        self.blocks = 0  # private blocks
        self.runs: list[PrefixRun] = []  # shared runs referenced
        self.shared_blocks = 0
        self.scheduled_ts = -1.0
        self.first_token_ts = -1.0
        self.last_token_ts = -1.0
        self.num_preemptions = 0
        self.cached_tokens = 0
        self.prompt_bytes = 0
        self.deferred = False
        self.kv_start = 0.0  # P/D decode side: when its remote KV load starts and has finished (0: no load)
        self.kv_ready = 0.0
        self.external_tokens = 0  # prompt tokens whose KV was loaded, not computed


class EngineStats:
    """Everything one engine exports, in vLLM's units.  Histograms hold simulated seconds."""

    def __init__(self, max_model_len: int, created: float):
        c = created
        self.created = c
        # counters
        self.prompt_tokens = 0
        self.prompt_local_compute = 0
        self.prompt_local_cache_hit = 0
        self.prompt_cached = 0
        self.cached_device = 0
        self.gen_tokens = 0
        self.preemptions = 0
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.success = {r: 0 for r in FINISH_REASONS}
        self.steps = 0
        # What other engines' expositions need beyond vLLM's (kvwatch.sim.exposition_*):
        self.seqs_stepped = 0  # requests summed over steps (llama.cpp's n_busy_slots_per_decode)
        self.longest_seq = 0  # the longest finished request, prompt + output (llama.cpp's n_tokens_max)
        # SGLang's realtime_tokens_total{mode}: tokens as the scheduler batches them (each prefill chunk, each decode
        # token), not when a request ends; see _count_realtime
        self.realtime_prefill_compute = 0
        self.realtime_prefill_cache = 0
        self.realtime_decode = 0
        # SGLang's gen_throughput, set at its stats log: (t, generated tokens then, tokens/s), see _log_interval
        self.logged: tuple[float, int, float] = (0.0, 0, 0.0)  # t: simulated seconds
        # gauges (as last published)
        self.running = 0
        self.waiting = 0
        self.waiting_deferred = 0
        self.kv_fetch = (0, 0, 0)  # waiting_to_start, in_progress, completed_waiting (P/D decode side)
        self.prompt_external = 0  # prompt tokens whose KV came over the connector
        self.sleep_level = 0  # 0 awake; 1, 2 asleep at that level (engine_sleep_state)
        self.kv_usage = 0.0
        self.running_loras: tuple[str, ...] = ()
        self.waiting_loras: tuple[str, ...] = ()
        # histograms
        tok = build_1_2_5_buckets(max_model_len)
        self.h_prompt = Hist(tok, c)
        self.h_generation = Hist(tok, c)
        self.h_iteration = Hist(ITERATION_TOKENS_BUCKETS, c)
        self.h_iteration_v0 = Hist(ITERATION_TOKENS_BUCKETS_V0, c)  # V0 bucketed the same values finer
        self.h_max_gen = Hist(tok, c)
        self.h_n = Hist(N_BUCKETS, c)
        self.h_max_tokens = Hist(tok, c)
        self.h_ttft = Hist(TTFT_BUCKETS, c)
        self.h_itl = Hist(TPOT_BUCKETS, c)
        self.h_tpot = Hist(TPOT_BUCKETS, c)
        self.h_e2e = Hist(REQUEST_LATENCY_BUCKETS, c)
        self.h_queue = Hist(REQUEST_LATENCY_BUCKETS, c)
        self.h_inference = Hist(REQUEST_LATENCY_BUCKETS, c)
        self.h_prefill = Hist(REQUEST_LATENCY_BUCKETS, c)
        self.h_decode = Hist(REQUEST_LATENCY_BUCKETS, c)
        self.h_preemptions = Hist(PREEMPTION_BUCKETS, c)
        self.h_prefill_kv = Hist(tok, c)


class Engine:
    """One data-parallel engine.  Driven by :class:`kvwatch.sim.simulator.Simulator`."""

    def __init__(self, index: int, cfg: EngineConfig, rng, created: float, on_finish=None, on_lora=None):
        self.index = index
        self.cfg = cfg
        self.rng = rng
        self.bs = cfg.block_size
        self.usable = cfg.usable_blocks
        self.free = self.usable
        self.evictable: OrderedDict[PrefixRun, None] = OrderedDict()
        self.evictable_blocks = 0
        self.runs: dict = {}
        self.running: list[Request] = []
        self.waiting: deque[Request] = deque()
        self.stats = EngineStats(cfg.max_model_len, created)
        self.stalled = False
        self.in_flight: list | None = None
        self.step_start_t = 0.0
        self.step_end_t = 0.0
        self.prev_end = -1.0
        self.next_t = INF
        self.on_finish = on_finish  # callback(engine, request, t, reason)
        self.on_lora = on_lora  # callback(engine, t) after each step of a LoRA-enabled engine
        self.lora_counts: dict[str, int] = {}
        self._deferred = 0
        self.connector_free = 0.0  # P/D decode side: when the connector finishes the loads queued so far

    # ------------------------------------------------------------------ public

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    @property
    def kv_usage(self) -> float:
        return 1.0 - self.free / self.usable

    def set_config(self, cfg: EngineConfig, now: float) -> None:
        """Apply a phase's runtime flags (max_num_seqs, max_num_batched_tokens, max_loras, step_time)."""
        self.cfg = cfg

    def set_stalled(self, stalled: bool, now: float) -> None:
        """Hang (or resume) the engine core.  A hang freezes the step in flight, if any: its outputs
        and stats are never published, so every vllm:* series stays where it was."""
        self.stalled = stalled
        if stalled:
            self.next_t = INF
        elif self.in_flight is not None:
            self.next_t = max(self.step_end_t, now)
        else:
            self.next_t = now if self.has_work else INF

    def add_request(self, req: Request, now: float) -> None:
        rate = self.cfg.kv_transfer_tokens_per_s
        if rate:
            req.kv_start = max(now, self.connector_free)
            req.kv_ready = self.connector_free = req.kv_start + (req.prompt_len - 1) / rate
        self.waiting.append(req)
        if self.in_flight is None and self.next_t == INF and not self.stalled:
            self.next_t = now

    def abort_waiting(self, now: float) -> int:
        n = len(self.waiting)
        for req in self.waiting:
            self.stats.success["abort"] += 1
            if self.on_finish:
                self.on_finish(self, req, now, "abort")
        self.waiting.clear()
        return n

    def on_event(self, now: float) -> None:
        if self.in_flight is not None:
            self._step_end(now)
        else:
            self._step_start(now)

    # ------------------------------------------------------------------ KV blocks

    def _allocate(self, k: int) -> None:
        if k > self.free - self.evictable_blocks:
            short = k - (self.free - self.evictable_blocks)
            ev = self.evictable
            while short > 0 and ev:
                run, _ = ev.popitem(last=False)
                run.cached = False
                self.evictable_blocks -= run.nblocks
                short -= run.nblocks
                self.runs.pop(run.key, None)
        self.free -= k

    def _release(self, req: Request) -> None:
        self.free += req.blocks
        req.blocks = 0
        if req.runs:
            for run in reversed(req.runs):
                run.refs -= 1
                if run.refs == 0:
                    self.evictable[run] = None
                    self.evictable_blocks += run.nblocks
                    self.free += run.nblocks
            req.runs = []
            req.shared_blocks = 0

    def _run(self, key, parent, tokens: int) -> PrefixRun:
        run = self.runs.get(key)
        if run is None:
            if len(self.runs) > 50000:  # forget runs that hold no blocks (bounded memory)
                self.runs = {k: r for k, r in self.runs.items() if r.refs or r.cached}
            parent_blocks = 0
            p = parent
            while p is not None:
                parent_blocks += p.nblocks
                p = p.parent
            run = PrefixRun(key, parent, max(0, tokens // self.bs - parent_blocks))
            self.runs[key] = run
        return run

    def _chain(self, req: Request) -> list[PrefixRun]:
        out = []
        parent = None
        for key, tokens in req.chain_keys:
            run = self._run(key, parent, tokens)
            if run.nblocks > 0:
                out.append(run)
                parent = run
        return out

    def _preempt(self, req: Request) -> None:
        self._release(req)
        req.num_computed = 0
        req.num_preemptions += 1
        self.stats.preemptions += 1
        if req.lora is not None:
            self._lora_dec(req.lora)
        self.waiting.appendleft(req)

    def _lora_dec(self, name: str) -> None:
        c = self.lora_counts[name] - 1
        if c:
            self.lora_counts[name] = c
        else:
            del self.lora_counts[name]

    # ------------------------------------------------------------------ one step

    def _step_start(self, now: float) -> None:
        """Schedule one step (running requests first, then the queue) and time it."""
        budget = self.cfg.max_num_batched_tokens
        scheduled: list = []
        budget, preempted = self._schedule_running(budget, scheduled)
        self._deferred = 0
        # vLLM admits nobody in a step that had to preempt: the blocks just freed are for the running.
        if not preempted and self.waiting:
            budget = self._schedule_waiting(now, budget, scheduled)
        dt = self._step_duration(self.cfg.max_num_batched_tokens - budget, scheduled)
        self.in_flight = scheduled
        self.step_start_t = now
        self.step_end_t = now + dt
        self.next_t = self.step_end_t

    def _schedule_running(self, budget: int, scheduled: list) -> tuple[int, bool]:
        """Each running request gets its next chunk (or decode token) and the blocks for it, in order,
        preempting the newest requests when blocks run out.  Returns (budget left, preempted?)."""
        bs = self.bs
        running = self.running
        preempted = False
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            num_new = req.num_tokens - req.num_computed
            if num_new > budget:
                num_new = budget
            need = (req.num_computed + num_new + bs - 1) // bs - req.blocks - req.shared_blocks
            if need > 0:
                if need > self.free:
                    preempted = True
                    if not self._preempt_newest_until_free(req, need):
                        break  # req itself was the newest and went: the running list ends here
                self._allocate(need)
                req.blocks += need
            scheduled.append((req, num_new))
            budget -= num_new
            i += 1
        return budget, preempted

    def _preempt_newest_until_free(self, req: Request, need: int) -> bool:
        """Preempt the newest running requests until ``need`` blocks are free; False if ``req``
        itself had to go (it was the newest left)."""
        running = self.running
        while need > self.free:
            victim = running.pop()
            self._preempt(victim)
            if victim is req:
                return False
        return True

    def _schedule_waiting(self, now: float, budget: int, scheduled: list) -> int:
        """Admit the head of the queue while budget, max_num_seqs and free blocks allow (FCFS: the
        first that does not fit stops admission).  LoRA requests over max_loras are skipped but keep
        their place.  Returns the budget left."""
        cfg = self.cfg
        bs = self.bs
        running = self.running
        waiting = self.waiting
        max_seqs = cfg.max_num_seqs
        skipped: list[Request] = []
        loras = self.lora_counts
        max_loras = cfg.max_loras
        caching = cfg.enable_prefix_caching
        while waiting and budget > 0 and len(running) < max_seqs:
            req = waiting[0]
            if (req.lora is not None and req.lora not in loras and len(loras) >= max_loras) or req.kv_ready > now:
                skipped.append(waiting.popleft())
                req.deferred = True
                continue
            hit_runs: Sequence[PrefixRun]
            if caching and req.chain_keys:
                hit_runs, hit_blocks, touched = self._prefix_cache_hits(req)
            else:
                hit_runs, hit_blocks, touched = (), 0, 0
            hit_tokens = hit_blocks * bs
            if _loads_remote_kv(req):  # the prefill side computed it: only the last token is left
                hit_runs, hit_blocks, touched = (), 0, 0
                hit_tokens = req.prompt_len - 1
            num_new = req.num_tokens - hit_tokens
            if num_new > budget:
                num_new = budget
            need = (hit_tokens + num_new + bs - 1) // bs - hit_blocks
            # Cached blocks nobody holds sit in the free pool: taking them costs free blocks too.
            if need + touched > self.free:
                break
            waiting.popleft()
            self._admit(req, now, hit_runs, hit_blocks, need)
            scheduled.append((req, num_new))
            budget -= num_new
        if skipped:
            waiting.extendleft(reversed(skipped))
            self._deferred = len(skipped)
        return budget

    def _prefix_cache_hits(self, req: Request) -> tuple[list[PrefixRun], int, int]:
        """The cached runs ``req``'s prompt starts with: (runs, blocks, blocks taken from the free pool).
        The last prompt token is always computed, as in vLLM."""
        limit = (req.num_tokens - 1) // self.bs
        hit_runs = []
        hit_blocks = 0
        touched = 0
        for run in self._chain(req):
            if not run.cached or hit_blocks + run.nblocks > limit:
                break
            hit_runs.append(run)
            hit_blocks += run.nblocks
            if run.refs == 0:
                touched += run.nblocks
        return hit_runs, hit_blocks, touched

    def _admit(self, req: Request, now: float, hit_runs, hit_blocks: int, need: int) -> None:
        """Move ``req`` from the queue into the batch: reference its cached runs, allocate ``need``
        private blocks, count the prefix-cache query (once per request, not after a preemption)."""
        req.deferred = False
        for run in hit_runs:
            if run.refs == 0:
                del self.evictable[run]
                self.evictable_blocks -= run.nblocks
                self.free -= run.nblocks
            run.refs += 1
        hit_tokens = hit_blocks * self.bs
        external = req.prompt_len - 1 if _loads_remote_kv(req) else 0  # its blocks are among the ``need``
        req.runs = list(hit_runs)
        req.shared_blocks = hit_blocks
        req.num_computed = hit_tokens + external
        self._allocate(need)
        req.blocks = need
        self.stats.realtime_prefill_cache += hit_tokens  # SGLang's prefill_cache: at every admission, retried too
        if req.num_preemptions == 0:
            self.stats.prefix_queries += req.num_tokens
            self.stats.prefix_hits += hit_tokens
            self.stats.cached_device += hit_tokens
            req.cached_tokens = hit_tokens
            req.external_tokens = external
        if req.scheduled_ts < 0:
            req.scheduled_ts = now
        if req.lora is not None:
            self.lora_counts[req.lora] = self.lora_counts.get(req.lora, 0) + 1
        self.running.append(req)

    def _step_duration(self, tokens: int, scheduled: list) -> float:
        """Linear in the batch (scenario.StepTime), with optional lognormal jitter."""
        st = self.cfg.step_time
        dt = st.base_s + st.per_token_s * tokens + st.per_seq_s * len(scheduled)
        if st.per_context_token_s:
            dt += st.per_context_token_s * sum(r.num_computed for r, _ in scheduled)
        if st.jitter:
            dt *= self.rng.lognormvariate(0.0, st.jitter)
        return dt

    def _step_end(self, now: float) -> None:
        scheduled = self.in_flight
        assert scheduled is not None  # on_event ends a step only while one is in flight
        self.in_flight = None
        stats = self.stats
        prev_end = self.prev_end
        bulk_itl = gen = prompt_iter = 0
        finished = None
        _count_realtime(stats, scheduled)
        for req, num_new in scheduled:
            c = req.num_computed + num_new
            req.num_computed = c
            if c < req.num_tokens:
                continue  # a prefill chunk: no token yet
            out = req.output
            if out == 0:
                # First token: the prompt counts now (vLLM's IterationStats), once per request.
                stats.h_ttft.observe(now - req.arrival)
                req.first_token_ts = now
                prompt_iter += req.prompt_len
                _count_prompt(stats, req)
                if self.cfg.enable_prefix_caching and req.chain_keys:
                    self._register_prefix(req)
            elif req.last_token_ts == prev_end:
                bulk_itl += 1
            else:
                stats.h_itl.observe(now - req.last_token_ts)
            req.output = out + 1
            req.num_tokens += 1
            req.last_token_ts = now
            gen += 1
            if req.output >= req.out_target:
                if finished is None:
                    finished = []
                finished.append(req)
        if bulk_itl:
            stats.h_itl.observe(now - prev_end, bulk_itl)
        stats.prompt_tokens += prompt_iter
        stats.gen_tokens += gen
        if gen:
            stats.h_iteration.observe(prompt_iter + gen)
            stats.h_iteration_v0.observe(prompt_iter + gen)
        if finished:
            running = self.running
            for req in finished:
                running.remove(req)
                self._release(req)
                if req.lora is not None:
                    self._lora_dec(req.lora)
                self._record_finished(req, now)
        self.prev_end = now
        stats.steps += 1
        stats.seqs_stepped += len(scheduled)
        if prompt_iter or stats.steps % SGLANG_DECODE_LOG_INTERVAL == 0:
            _log_interval(stats, now)
        self._publish(now)
        if self.cfg.max_loras and self.on_lora is not None:
            self.on_lora(self, now)
        self.next_t = now if (self.has_work and not self.stalled) else INF

    def _register_prefix(self, req: Request) -> None:
        """The prompt is computed: its shared-prefix runs become cached (if nobody beat it to it)."""
        held = len(req.runs)
        chain = self._chain(req)
        for run in chain[held:]:
            if run.cached or req.blocks < run.nblocks:
                break
            run.cached = True
            run.refs = 1
            req.blocks -= run.nblocks
            req.shared_blocks += run.nblocks
            req.runs.append(run)

    def _record_finished(self, req: Request, now: float) -> None:
        s = self.stats
        reason = "length" if req.output >= req.max_tokens else "stop"
        s.success[reason] += 1
        s.h_e2e.observe(now - req.arrival)
        s.h_queue.observe(req.scheduled_ts - req.arrival)
        s.h_prefill.observe(req.first_token_ts - req.scheduled_ts)
        s.h_inference.observe(req.last_token_ts - req.scheduled_ts)
        decode = req.last_token_ts - req.first_token_ts
        s.h_decode.observe(decode)
        s.h_tpot.observe(decode / (req.output - 1) if req.output > 1 else 0.0)
        s.h_prompt.observe(req.prompt_len)
        s.h_generation.observe(req.output)
        s.h_max_gen.observe(req.max_tokens)
        s.h_n.observe(req.n)
        s.h_max_tokens.observe(req.max_tokens)
        s.h_preemptions.observe(req.num_preemptions)
        s.h_prefill_kv.observe(req.prompt_len - req.cached_tokens)
        s.longest_seq = max(s.longest_seq, req.prompt_len + req.output)
        if self.on_finish:
            self.on_finish(self, req, now, reason)

    def _publish(self, now: float) -> None:
        s = self.stats
        s.running = len(self.running)
        s.waiting = len(self.waiting)
        s.waiting_deferred = self._deferred
        s.kv_usage = 1.0 - self.free / self.usable
        if self.cfg.kv_transfer_tokens_per_s:
            s.kv_fetch = _kv_fetch_stages(self.waiting, now)
        if self.cfg.max_loras:
            s.running_loras = tuple(sorted(self.lora_counts))
            s.waiting_loras = tuple(sorted({r.lora for r in self.waiting if r.lora is not None}))


# SGLang's scheduler logs its stats (gen_throughput and the other gauges) after every prefill batch and every
# --decode-log-interval decode batches (default 40; scheduler_metrics_mixin.py).
SGLANG_DECODE_LOG_INTERVAL = 40


def _log_interval(stats: EngineStats, now: float) -> None:
    t0, gen0, _ = stats.logged
    rate = (stats.gen_tokens - gen0) / (now - t0) if now > t0 else 0.0
    stats.logged = (now, stats.gen_tokens, rate)


def _count_realtime(stats: EngineStats, scheduled: list) -> None:
    """SGLang's realtime_tokens_total as its scheduler counts it (sgl-project/sglang,
    python/sglang/srt/managers/scheduler_components/metrics_reporter.py at 00df707e: ``report_prefill_stats`` adds
    each prefill batch's ``PrefillAdder.log_input_tokens``, the tokens of the chunks it scheduled, and
    ``report_decode_stats`` a decode batch's size every iteration): a chunked prompt counts chunk by chunk. A decode
    entry is one token of a request that has output; anything else is prefill (a retracted request's recomputation
    too, as SGLang re-prefills it). Counted at the step's end, with the simulator's other statistics (SGLang counts a
    batch when it forms it, one step earlier)."""
    for req, num_new in scheduled:
        if num_new == 1 and req.output > 0 and req.num_computed + 1 == req.num_tokens:
            stats.realtime_decode += 1
        else:
            stats.realtime_prefill_compute += num_new


def _loads_remote_kv(req: Request) -> bool:
    """A P/D decode engine's request, admitted the first time: its prompt's KV came from the prefill side (after a
    preemption it is recomputed here)."""
    return req.kv_ready > 0 and req.num_preemptions == 0


def _kv_fetch_stages(waiting, now: float) -> tuple[int, int, int]:
    """vLLM 0.33's num_requests_kv_fetch_by_stage: waiting requests whose load has not started, is in progress, or
    has finished while they are not running yet."""
    stages = [0, 0, 0]
    for r in waiting:
        if r.kv_ready and not r.num_preemptions:
            stages[0 if now < r.kv_start else 1 if now < r.kv_ready else 2] += 1
    return stages[0], stages[1], stages[2]


def _count_prompt(stats: EngineStats, req: Request) -> None:
    """A request's prompt by source, once, at its first token (vLLM's PromptTokenStats)."""
    stats.prompt_local_compute += req.prompt_len - req.cached_tokens - req.external_tokens
    stats.prompt_local_cache_hit += req.cached_tokens
    stats.prompt_external += req.external_tokens
    stats.prompt_cached += req.cached_tokens + req.external_tokens  # "local + external" (loggers.py)
