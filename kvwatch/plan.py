"""``kvwatch plan``: how many requests a GPU will hold, before vLLM starts.

From a Hugging Face ``config.json`` and the flags vLLM will get, this does vLLM's own KV-cache arithmetic
(the V1 engine), read from its source:

- ``vllm/config/model.py`` / ``vllm/transformers_utils/model_arch_config_convertor.py``: layers, KV heads
  (``get_total_num_kv_heads``: ``n_head_kv``, ``num_kv_heads``, ``num_key_value_heads``,
  ``multi_query_group_num``, ``num_attention_groups``, else ``num_attention_heads``), KV heads per GPU
  (``get_num_kv_heads``: ``max(1, total // tensor_parallel_size)``, 1 for MLA), head size
  (``get_head_size``: ``kv_lora_rank + qk_rope_head_dim`` for MLA, else ``head_dim``, else
  ``hidden_size // num_attention_heads``), the derived ``max_model_len`` (the smallest length key, RoPE-scaled).
- ``vllm/v1/kv_cache_interface.py``: a page (one block of one layer) is ``2 x block_size x kv_heads x
  head_size x dtype_bytes`` (``FullAttentionSpec``, K and V), ``block_size x head_size x dtype_bytes`` for
  MLA (``MLAAttentionSpec``: one latent vector per token); a request at ``max_model_len`` holds
  ``cdiv(max_model_len, block_size)`` blocks per full-attention group and ``cdiv(min(window - 1 +
  max_num_batched_tokens, max_model_len), block_size) + 1`` per sliding-window group (``SlidingWindowSpec``).
- ``vllm/v1/core/kv_cache_utils.py``: layers are grouped by spec (one group when all layers agree; the
  hybrid rule of ``_get_kv_cache_groups_uniform_page_size`` otherwise), ``num_blocks = memory //
  page_size // layers_per_group`` (``get_num_blocks``), the "KV cache size: N tokens" line is
  ``num_blocks // groups x block_size`` and the "Maximum concurrency for L tokens per request: X.XXx" line
  is ``num_blocks / blocks a request at L holds`` (``get_max_concurrency_for_kv_cache_config``; whole blocks,
  so 1,000 tokens in blocks of 16 cost 63 blocks, not 62.5).
- ``vllm/utils/torch_utils.py`` ``STR_DTYPE_TO_TORCH_DTYPE``: ``fp8`` is one byte; ``auto`` is the model's
  dtype, and ``--dtype auto`` serves a float32 checkpoint in 16 bits (``_resolve_auto_dtype``).

Everything here is a pure function of its arguments; ``kvwatch/cli.py`` reads the file and the flags.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from kvwatch.catalog import Action, Bottleneck, Thresholds

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "Capacity",
    "Deployment",
    "Model",
    "Plan",
    "PlanError",
    "WhatIf",
    "as_dict",
    "binding_limit",
    "budget_sequences",
    "capacity",
    "estimate_parameters",
    "kv_bytes_per_token",
    "kv_cache_blocks",
    "kv_cache_tokens",
    "kv_heads_per_gpu",
    "max_concurrency",
    "model_from_config",
    "plan",
    "render_text",
    "what_ifs",
]

GIB = 1 << 30
DEFAULT_BLOCK_SIZE = 16  # vLLM's default on CUDA; the CPU build and some MLA backends use others: pass --block-size
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default --gpu-memory-utilization
PREFIX_SHARE = 0.5  # the what-if: half of every prompt is a prefix all requests share (a system prompt)
UTILIZATION_STEP = 0.05
UTILIZATION_CEILING = Thresholds().gpu_memory_utilization_ceiling  # activations and CUDA graphs need the rest

# vLLM's model types whose MLA cache this sizes (is_deepseek_mla lists more; DeepSeek V3.2/V4 add an indexer
# or compressed caches of other page sizes).
MLA_MODEL_TYPES = frozenset({"deepseek_v2", "deepseek_v3", "kimi_k2"})
# Model types whose vLLM implementation applies a model-level sliding_window to every layer (no layer_types).
ALL_LAYERS_SLIDE = frozenset({"llama", "mistral", "mixtral"})
# Dense decoders whose parameter count is the plain transformer sum (estimate_parameters).
DENSE_DECODERS = frozenset({"llama", "mistral", "qwen2", "qwen3"})
# Keys of configs with state-space, linear-attention or other non-paged layers: sized differently by vLLM.
_HYBRID_KEYS = (
    "layers_block_type",
    "hybrid_override_pattern",
    "attn_layer_indices",
    "ssm_state_size",
    "mamba_d_state",
    "linear_attn_config",
    "full_attn_idxs",
    "attn_type_list",
)
_LENGTH_KEYS = (  # vLLM's derive_max_model_len_and_key: the smallest of these
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_target_positions",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
MAX_LAYERS = 4096  # a sanity bound: a hostile config.json must not make us build a billion-layer model
_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 2, "float": 2}  # float32: served in 16 bits


class PlanError(ValueError):
    """One line saying what to fix (a config.json it cannot size, contradictory flags)."""


# ---------------------------------------------------------------------------------------- the model


@dataclass(frozen=True)
class Model:
    """What vLLM's KV-cache sizing reads from a config.json."""

    name: str
    model_type: str
    num_layers: int
    num_attention_heads: int
    total_kv_heads: int
    head_size: int
    mla: bool
    dtype: str  # the model's dtype as vLLM serves it: bfloat16 or float16 (float32 checkpoints: 16-bit)
    windows: tuple[int | None, ...]  # per attention layer: its sliding window, None for full attention
    derived_max_model_len: int | None = None
    max_len_key: str | None = None
    parameters: int | None = None  # estimate_parameters, dense decoders only
    kv_cache_scheme: bool = False  # the checkpoint's quantization_config sets a KV cache scheme (often FP8)

    @property
    def attention(self) -> str:
        if self.mla:
            return "MLA"
        sliding = sum(w is not None for w in self.windows)
        if not sliding:
            return "full attention"
        return f"sliding window on {sliding} of {self.num_layers} layers"


def _text_config(cfg: dict) -> dict:
    """vLLM's hf_text_config: a multimodal config keeps the language model's fields under text_config."""
    tc = cfg.get("text_config")
    if isinstance(tc, dict) and "num_hidden_layers" not in cfg:
        return {**cfg, **tc}
    return cfg


def _positive(tc: dict, key: str) -> int:
    v = tc.get(key)
    if v is None:
        raise PlanError(f"config.json has no {key}: give the Hugging Face config.json of a decoder model")
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise PlanError(f"config.json's {key} is {v!r}: it must be a positive integer")
    return v


def _unsupported(tc: dict, model_type: str) -> str | None:
    """Why vLLM's cache for this architecture is not the paged attention this module sizes, if it is not."""
    if tc.get("is_encoder_decoder"):
        return "an encoder-decoder model (its cross-attention cache is sized from the encoder length)"
    if any(k in tc for k in _HYBRID_KEYS) or "mamba" in model_type:
        return "a hybrid with state-space or linear-attention layers (their per-request state is not paged KV)"
    if tc.get("attention_chunk_size"):
        return "chunked local attention (Llama 4): its layers hold attention_chunk_size + the step budget"
    if tc.get("kv_lora_rank") is not None and model_type not in MLA_MODEL_TYPES:
        return f"MLA of model_type {model_type!r} (sized here: {', '.join(sorted(MLA_MODEL_TYPES))})"
    if tc.get("interleaved_sliding_window") is not None:
        return "interleaved_sliding_window (give the config.json that lists layer_types)"
    return None


def _total_kv_heads(tc: dict) -> int:
    if tc.get("multi_query") and not tc.get("new_decoder_architecture"):
        return 1  # Falcon / GPTBigCode multi-query: one KV head
    for key in ("n_head_kv", "num_kv_heads", "num_key_value_heads", "multi_query_group_num", "num_attention_groups"):
        if tc.get(key) is not None:
            return _positive(tc, key)
    return _positive(tc, "num_attention_heads")


def _head_size(tc: dict, mla: bool) -> int:
    if mla:
        return _positive(tc, "kv_lora_rank") + _positive(tc, "qk_rope_head_dim")
    for key in ("head_dim", "hidden_size_per_head"):
        if tc.get(key):
            return _positive(tc, key)
    size = _positive(tc, "hidden_size") // _positive(tc, "num_attention_heads")
    if size == 0:
        raise PlanError("config.json's hidden_size // num_attention_heads is 0: it needs head_dim")
    return size


def _dtype(cfg: dict, tc: dict) -> str:
    name = cfg.get("torch_dtype") or cfg.get("dtype") or tc.get("torch_dtype") or tc.get("dtype") or "float32"
    if not isinstance(name, str) or name not in _DTYPE_BYTES:
        raise PlanError(f"config.json's torch_dtype {name!r} is not one vLLM serves (bfloat16, float16, float32)")
    return "float16" if name in ("float16", "half") else "bfloat16" if name == "bfloat16" else "16-bit"


def _layer_windows(tc: dict, model_type: str, layers: int) -> tuple[int | None, ...]:
    """Each layer's sliding window, as the config says (vLLM's get_sliding_window: none if use_sliding_window
    is false); a model-level window without layer_types slides every layer only where vLLM applies it so."""
    window = None if tc.get("use_sliding_window") is False else tc.get("sliding_window")
    types = tc.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != layers:
            raise PlanError(f"config.json's layer_types must list {layers} layers (num_hidden_layers)")
        if other := sorted({repr(t) for t in types if t not in ("full_attention", "sliding_attention")}):
            raise PlanError(f"not supported: layer_types {other} (only full_attention and sliding_attention are sized)")
        if "sliding_attention" in types and (not isinstance(window, int) or isinstance(window, bool) or window <= 0):
            raise PlanError("config.json's layer_types has sliding_attention layers but no sliding_window size")
        return tuple(window if t == "sliding_attention" else None for t in types)
    if window is None:
        return (None,) * layers
    if not isinstance(window, int) or isinstance(window, bool) or window <= 0:
        raise PlanError(f"config.json's sliding_window is {window!r}: it must be a positive integer or null")
    if model_type in ALL_LAYERS_SLIDE:
        return (window,) * layers
    raise PlanError(
        f"not supported: config.json sets sliding_window {window} but no layer_types, and which layers of a "
        f"{model_type!r} model slide is in vLLM's model code (add the layer_types transformers gives it)"
    )


def _derived_max_model_len(tc: dict) -> tuple[int | None, str | None]:
    """vLLM's derived max_model_len (derive_max_model_len_and_key, _get_and_verify_max_len): the smallest
    length key (Command-R's model_max_length wins), times the RoPE scaling factor except for su, longrope and
    llama3 scaling; YaRN scales its original_max_position_embeddings."""
    found = [(v, k) for k in _LENGTH_KEYS if isinstance(v := tc.get(k), int) and not isinstance(v, bool) and v > 0]
    if found and isinstance(tc.get("model_max_length"), int):
        found = [(tc["model_max_length"], "model_max_length")]
    if not found:
        return None, None
    length, key = min(found)
    rope = tc.get("rope_scaling") if isinstance(tc.get("rope_scaling"), dict) else tc.get("rope_parameters")
    if isinstance(rope, dict) and (rope.get("rope_type") or rope.get("type")) not in ("su", "longrope", "llama3"):
        factor = rope.get("factor") or 1.0
        original = rope.get("original_max_position_embeddings")
        if (rope.get("rope_type") or rope.get("type")) == "yarn" and isinstance(original, int) and original > 0:
            length = original
        if isinstance(factor, int | float) and factor > 0:
            length = int(length * factor)
    return length, key


def model_from_config(cfg: Any) -> Model:
    """The ``Model`` of a parsed config.json; ``PlanError`` for one vLLM does not size as paged attention."""
    if not isinstance(cfg, dict):
        raise PlanError("config.json must be a JSON object (a Hugging Face model config)")
    tc = _text_config(cfg)
    model_type = str(tc.get("model_type") or cfg.get("model_type") or "")
    if not model_type:
        raise PlanError("config.json has no model_type: give the Hugging Face config.json of a decoder model")
    if why := _unsupported(tc, model_type):
        raise PlanError(f"not supported: {why}")
    if model_type in ("deepseek_v32", "deepseek_v4") or tc.get("compress_ratios") or tc.get("index_topk"):
        raise PlanError("not supported: DeepSeek V3.2/V4 sparse attention (an indexer cache of another page size)")
    mla = model_type in MLA_MODEL_TYPES and tc.get("kv_lora_rank") is not None
    layers = _positive(tc, "num_hidden_layers")
    if layers > MAX_LAYERS:
        raise PlanError(f"config.json's num_hidden_layers is {layers}: no decoder has more than {MAX_LAYERS:,}")
    archs = cfg.get("architectures")
    name = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else model_type
    max_len, key = _derived_max_model_len(tc)
    return Model(
        name=name,
        model_type=model_type,
        num_layers=layers,
        num_attention_heads=_positive(tc, "num_attention_heads"),
        total_kv_heads=1 if mla else _total_kv_heads(tc),
        head_size=_head_size(tc, mla),
        mla=mla,
        dtype=_dtype(cfg, tc),
        windows=(None,) * layers if mla else _layer_windows(tc, model_type, layers),
        derived_max_model_len=max_len,
        max_len_key=key,
        parameters=estimate_parameters(cfg),
        kv_cache_scheme=_kv_cache_scheme(cfg),
    )


def _kv_cache_scheme(cfg: dict) -> bool:
    """llm-compressor and ModelOpt checkpoints may quantize the KV cache: vLLM's ``auto`` then follows them."""
    q = cfg.get("quantization_config")
    inner = q.get("quantization") if isinstance(q, dict) else None
    keys = ("kv_cache_scheme", "kv_cache_quant_algo")
    return any(isinstance(c, dict) and any(c.get(k) for k in keys) for c in (q, inner))


def estimate_parameters(cfg: dict) -> int | None:
    """Parameters of a dense Llama-style decoder (llama, mistral, qwen2, qwen3), summed from its shapes:
    embeddings (+ an untied LM head), per layer q/k/v/o (+ q/k/v biases for Qwen2, q/k norms for Qwen3),
    a gated MLP and two norms, a final norm. None for anything else (MoE, quantized, other families): their
    weights are not this sum times two bytes, so ``--weights-gib`` must say."""
    tc = _text_config(cfg)
    moe = any(tc.get(k) for k in ("num_local_experts", "n_routed_experts", "num_experts", "moe_intermediate_size"))
    if tc.get("model_type") not in DENSE_DECODERS or moe or "quantization_config" in cfg or tc is not cfg:
        return None
    try:
        hidden, vocab, inter = (_positive(tc, k) for k in ("hidden_size", "vocab_size", "intermediate_size"))
        layers, heads, kv = (
            _positive(tc, "num_hidden_layers"),
            _positive(tc, "num_attention_heads"),
            _total_kv_heads(tc),
        )
        head = _head_size(tc, False)
    except PlanError:
        return None
    qwen2, qwen3 = tc["model_type"] == "qwen2", tc["model_type"] == "qwen3"
    attn = hidden * heads * head + 2 * hidden * kv * head + heads * head * hidden
    if tc.get("attention_bias", qwen2):  # Qwen2 has q/k/v biases without saying so in its config
        attn += heads * head + 2 * kv * head + (hidden if tc.get("attention_bias") and not qwen2 else 0)
    per_layer = attn + 3 * hidden * inter + 2 * hidden + (2 * head if qwen3 else 0)
    if tc.get("mlp_bias"):
        per_layer += 2 * inter + hidden
    embeddings = vocab * hidden * (1 if tc.get("tie_word_embeddings", False) else 2)
    return embeddings + layers * per_layer + hidden


# ---------------------------------------------------------------------------------------- the deployment


@dataclass(frozen=True)
class Deployment:
    """vLLM's flags that size the KV cache, and the workload. Memory comes one of two ways: vLLM's
    ``--kv-cache-memory-bytes`` (per GPU, exact), or the GPU's memory x ``--gpu-memory-utilization`` minus
    the weights (an upper bound: vLLM also subtracts the activation peak, non-torch memory and CUDA graphs,
    which only a profile run on the GPU measures)."""

    kv_cache_memory_bytes: int | None = None
    gpu_memory_gib: float | None = None
    gpu_memory_utilization: float | None = None
    weights_gib: float | None = None  # the whole model's; each GPU holds weights_gib / tensor_parallel_size
    tensor_parallel_size: int = 1
    kv_cache_dtype: str = "auto"
    block_size: int = DEFAULT_BLOCK_SIZE
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    prefix_share: float = 0.0  # share of each prompt that is a prefix every request shares (what-if only)
    # vLLM's VLLM_ALLOW_LONG_MAX_MODEL_LEN: a --max-model-len past config.json's derived maximum starts (with a warning)
    allow_long_max_model_len: bool = False

    @property
    def workload(self) -> int | None:
        """Tokens per sequence at full length (prompt + output), if the workload is given."""
        if self.prompt_tokens is None or self.output_tokens is None:
            return None
        return self.prompt_tokens + self.output_tokens

    @property
    def utilization(self) -> float:
        u = self.gpu_memory_utilization
        return DEFAULT_GPU_MEMORY_UTILIZATION if u is None else u


def check_deployment(d: Deployment) -> None:
    """Contradictory or missing flags, named as on the command line."""
    if (d.kv_cache_memory_bytes is None) == (d.gpu_memory_gib is None):
        raise PlanError("give either --kv-cache-memory-bytes or --gpu-memory-gib (with --gpu-memory-utilization)")
    if d.kv_cache_memory_bytes is not None:
        if d.gpu_memory_utilization is not None or d.weights_gib is not None:
            raise PlanError(
                "--kv-cache-memory-bytes fixes the KV memory (vLLM then ignores --gpu-memory-utilization): "
                "drop --gpu-memory-utilization and --weights-gib, or give --gpu-memory-gib instead"
            )
    if not 0 < d.utilization <= 1:
        raise PlanError(f"--gpu-memory-utilization must be in (0, 1], got {d.utilization:g}")
    if d.kv_cache_dtype not in ("auto", "fp8"):
        raise PlanError(f"--kv-cache-dtype must be auto or fp8, got {d.kv_cache_dtype!r}")
    if (d.prompt_tokens is None) != (d.output_tokens is None):
        raise PlanError("give --prompt-tokens and --output-tokens together (the workload is both)")


def check_parallel(model: Model, tp: int) -> None:
    """vLLM's own refusals (ModelConfig.verify_with_parallel_config, the attention layers' asserts)."""
    if model.num_attention_heads % tp:
        raise PlanError(
            f"--tensor-parallel-size {tp}: vLLM needs num_attention_heads ({model.num_attention_heads}) divisible by it"
        )
    kv = model.total_kv_heads
    if not model.mla and (kv % tp if kv >= tp else tp % kv):
        raise PlanError(f"--tensor-parallel-size {tp}: {kv} KV heads can be neither split nor replicated evenly")


# ---------------------------------------------------------------------------------------- vLLM's arithmetic


def kv_dtype_bytes(kv_cache_dtype: str) -> int:
    """Bytes per cached element: fp8 is one byte, auto is the model's 16-bit dtype."""
    return 1 if kv_cache_dtype == "fp8" else 2


def kv_heads_per_gpu(model: Model, tensor_parallel_size: int) -> int:
    """vLLM's get_num_kv_heads: split across the TP ranks, replicated when fewer than them; MLA's latent is one."""
    return 1 if model.mla else max(1, model.total_kv_heads // tensor_parallel_size)


def layer_bytes_per_token(model: Model, tensor_parallel_size: int = 1, kv_cache_dtype: str = "auto") -> int:
    """One layer's cache for one token on one GPU: K and V per KV head (FullAttentionSpec), or MLA's one
    latent of kv_lora_rank + qk_rope_head_dim (MLAAttentionSpec)."""
    elements = model.head_size * kv_heads_per_gpu(model, tensor_parallel_size) * (1 if model.mla else 2)
    return elements * kv_dtype_bytes(kv_cache_dtype)


def kv_bytes_per_token(model: Model, tensor_parallel_size: int = 1, kv_cache_dtype: str = "auto") -> int:
    """KV-cache bytes one token costs on each GPU, all layers."""
    return model.num_layers * layer_bytes_per_token(model, tensor_parallel_size, kv_cache_dtype)


def kv_cache_groups(model: Model) -> tuple[tuple[int | None, ...], int]:
    """vLLM's KV cache groups (each group's sliding window, None for full attention) and layers per group.

    One group when every layer has the same spec; otherwise the hybrid rule of
    ``_get_kv_cache_groups_uniform_page_size``: groups of the smallest type's layer count (the largest when it
    is under 1.5x the smallest), each type padded up to whole groups."""
    counts: dict[int | None, int] = {}
    for w in model.windows:
        counts[w] = counts.get(w, 0) + 1
    if len(counts) == 1:
        return (model.windows[0],), model.num_layers
    smallest, largest = min(counts.values()), max(counts.values())
    size = largest if largest < smallest * 1.5 else smallest
    groups = tuple(w for w, n in counts.items() for _ in range(math.ceil(n / size)))
    return groups, size


def kv_cache_blocks(model: Model, memory_bytes: int, d: Deployment) -> int:
    """vLLM's get_num_blocks: memory // page_size // layers per group."""
    page = d.block_size * layer_bytes_per_token(model, d.tensor_parallel_size, d.kv_cache_dtype)
    _, per_group = kv_cache_groups(model)
    return max(0, memory_bytes // page // per_group)


def kv_cache_tokens(model: Model, num_blocks: int, block_size: int) -> int:
    """The "KV cache size: N tokens" of vLLM's start-up log (_report_kv_cache_config)."""
    groups, _ = kv_cache_groups(model)
    return num_blocks // len(groups) * block_size


def blocks_per_request(model: Model, tokens: int, d: Deployment, shared_blocks: int = 0) -> int:
    """Blocks one request of ``tokens`` tokens holds, over all groups (vLLM's max_memory_usage_bytes / page
    size): whole blocks per full-attention group, less the prefix blocks it shares; the window (+ the step's
    tokens and one block of slack) per sliding-window group."""
    total = 0
    for window in kv_cache_groups(model)[0]:
        if window is None:
            total += math.ceil(tokens / d.block_size) - shared_blocks
        else:
            if d.max_num_batched_tokens is None:
                raise PlanError(
                    "this model has sliding-window layers, whose per-request KV vLLM sizes by the step budget: "
                    "give --max-num-batched-tokens (the server's value)"
                )
            held = min(window - 1 + d.max_num_batched_tokens, tokens)
            total += math.ceil(held / d.block_size) + 1
    return total


def max_concurrency(model: Model, num_blocks: int, tokens: int, d: Deployment, shared_blocks: int = 0) -> float:
    """Requests of ``tokens`` tokens the cache holds at once, each at full length: vLLM's "Maximum
    concurrency for L tokens per request" with L = tokens. Shared prefix blocks are held once."""
    full_groups = sum(w is None for w in kv_cache_groups(model)[0])
    return (num_blocks - shared_blocks * full_groups) / blocks_per_request(model, tokens, d, shared_blocks)


def max_model_len_that_fits(model: Model, num_blocks: int, d: Deployment, upto: int) -> int:
    """The longest max_model_len whose one request fits (vLLM's estimate_max_model_len: a binary search)."""
    lo, hi, best = 1, upto, 0
    while lo <= hi:
        mid = (lo + hi) // 2
        if blocks_per_request(model, mid, d) <= num_blocks:
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    return best


def binding_limit(limits: dict[Bottleneck, float]) -> Bottleneck:
    """The limit that binds first: the one that admits the fewest sequences (KV first among equals)."""
    return min(limits, key=lambda b: (limits[b], b is not Bottleneck.KV_CACHE))


# ---------------------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class Capacity:
    """One deployment's numbers, per GPU."""

    kv_memory_bytes: int
    weights_bytes_per_gpu: int | None  # None when --kv-cache-memory-bytes gave the memory
    kv_heads_per_gpu: int
    kv_bytes_per_token: int
    num_blocks: int
    kv_cache_tokens: int
    max_model_len: int
    max_concurrency_at_max_model_len: float
    max_concurrency_at_workload: float | None
    limits: dict[Bottleneck, float]
    binding_limit: Bottleneck
    starts: bool  # False: one request at max_model_len does not fit, and vLLM refuses to start
    max_model_len_that_fits: int


def weights_bytes(model: Model, d: Deployment) -> int:
    """The whole model's weights: --weights-gib, else the parameter estimate at the model's 16-bit dtype."""
    if d.weights_gib is not None:
        return int(d.weights_gib * GIB)
    if model.parameters is None:
        raise PlanError(
            f"--gpu-memory-gib needs --weights-gib for {model.name}: only a dense Llama-style decoder's weights "
            "can be estimated from config.json (not MoE, quantized or multimodal models)"
        )
    return model.parameters * 2


def kv_memory_bytes(model: Model, d: Deployment) -> tuple[int, int | None]:
    """KV memory per GPU and the weights per GPU it leaves out (None with --kv-cache-memory-bytes)."""
    if d.kv_cache_memory_bytes is not None:
        return d.kv_cache_memory_bytes, None
    assert d.gpu_memory_gib is not None  # check_deployment
    weights = weights_bytes(model, d) // d.tensor_parallel_size  # TP shards the weights
    memory = int(d.gpu_memory_gib * GIB * d.utilization) - weights
    if memory <= 0:
        raise PlanError(
            f"no memory left for the KV cache: {d.gpu_memory_gib:g} GiB x {d.utilization:g} is less than the "
            f"{weights / GIB:.2f} GiB of weights per GPU: raise --gpu-memory-utilization or --tensor-parallel-size"
        )
    return memory, weights


def _max_model_len(model: Model, d: Deployment) -> int:
    length = d.max_model_len or model.derived_max_model_len
    if length is None:
        raise PlanError("config.json gives no maximum length (max_position_embeddings): give --max-model-len")
    derived = model.derived_max_model_len
    if derived and length > derived and not d.allow_long_max_model_len:
        # vLLM's _get_and_verify_max_len (vllm/config/model.py) raises ValueError at start-up unless the env var is set
        raise PlanError(
            f"--max-model-len {length:,} exceeds config.json's {model.max_len_key} ({derived:,}): vLLM refuses to "
            f"start unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 is set (for kvwatch plan too)"
        )
    if d.workload is not None and d.workload > length:
        raise PlanError(
            f"--prompt-tokens + --output-tokens ({d.workload}) exceed max_model_len ({length}): vLLM rejects such "
            "requests; give a longer --max-model-len or a shorter workload"
        )
    return length


def _limits(model: Model, blocks: int, d: Deployment, max_len: int) -> tuple[float | None, dict[Bottleneck, float]]:
    """Concurrency at the workload, and every limit's sequences: the KV cache's (at the workload, else at
    max_model_len), max_num_seqs, and the token budget's steady state: each sequence costs prompt + output
    tokens of step budget over its ~output steps, so B x output / (prompt + output) sequences keep every step
    full (Little's law; prefix-cache hits are prompt tokens not computed)."""
    at_workload = None
    if d.workload is not None and d.prompt_tokens is not None and d.output_tokens is not None:
        shared = int(d.prompt_tokens * d.prefix_share) // d.block_size
        at_workload = max_concurrency(model, blocks, d.workload, d, shared)
    kv = at_workload if at_workload is not None else blocks / blocks_per_request(model, max_len, d)
    limits: dict[Bottleneck, float] = {Bottleneck.KV_CACHE: kv}
    if d.max_num_seqs is not None:
        limits[Bottleneck.MAX_NUM_SEQS] = float(d.max_num_seqs)
    if d.max_num_batched_tokens is not None and d.prompt_tokens is not None and d.output_tokens is not None:
        computed = d.prompt_tokens - int(d.prompt_tokens * d.prefix_share) // d.block_size * d.block_size
        limits[Bottleneck.TOKEN_BUDGET] = budget_sequences(d.max_num_batched_tokens, computed, d.output_tokens)
    return at_workload, limits


def budget_sequences(budget: float, computed_prompt_tokens: float, output_tokens: float) -> float:
    """Sequences a per-step token budget keeps in flight: each costs its computed prompt plus one token per
    output step over ~output steps, so budget x output / (prompt + output) keep every step full."""
    return budget * output_tokens / (computed_prompt_tokens + output_tokens)


def capacity(model: Model, d: Deployment) -> Capacity:
    """vLLM's KV cache for this model and deployment, and what binds first."""
    check_deployment(d)
    check_parallel(model, d.tensor_parallel_size)
    max_len = _max_model_len(model, d)
    memory, weights = kv_memory_bytes(model, d)
    blocks = kv_cache_blocks(model, memory, d)
    if blocks == 0:
        raise PlanError(f"{memory:,} bytes of KV memory hold no block of {d.block_size} tokens: vLLM cannot start")
    need = blocks_per_request(model, max_len, d)
    at_workload, limits = _limits(model, blocks, d, max_len)
    return Capacity(
        kv_memory_bytes=memory,
        weights_bytes_per_gpu=weights,
        kv_heads_per_gpu=kv_heads_per_gpu(model, d.tensor_parallel_size),
        kv_bytes_per_token=kv_bytes_per_token(model, d.tensor_parallel_size, d.kv_cache_dtype),
        num_blocks=blocks,
        kv_cache_tokens=kv_cache_tokens(model, blocks, d.block_size),
        max_model_len=max_len,
        max_concurrency_at_max_model_len=blocks / need,
        max_concurrency_at_workload=at_workload,
        limits=limits,
        binding_limit=binding_limit(limits),
        starts=need <= blocks,
        max_model_len_that_fits=max_len if need <= blocks else max_model_len_that_fits(model, blocks, d, max_len),
    )


@dataclass(frozen=True)
class WhatIf:
    """One change, and the capacity it gives (None, with a note, where the change does not apply)."""

    change: str
    action: Action | None
    capacity: Capacity | None
    note: str = ""


def _try(model: Model, change: str, action: Action | None, d: Deployment, note: str = "") -> WhatIf:
    try:
        return WhatIf(change, action, capacity(model, d), note)
    except PlanError as e:
        return WhatIf(change, action, None, str(e))


def _utilization_what_if(model: Model, d: Deployment) -> WhatIf:
    action = Action.RAISE_GPU_MEMORY_UTILIZATION
    if d.gpu_memory_gib is None:
        return WhatIf("--gpu-memory-utilization", action, None, "n/a: --kv-cache-memory-bytes fixes the KV memory")
    higher = min(UTILIZATION_CEILING, round(d.utilization + UTILIZATION_STEP, 2))
    if higher <= d.utilization:
        return WhatIf(
            f"--gpu-memory-utilization {higher:g}", action, None, "already at the ceiling: activations need the rest"
        )
    return _try(model, f"--gpu-memory-utilization {higher:g}", action, replace(d, gpu_memory_utilization=higher))


def what_ifs(model: Model, d: Deployment, max_len: int) -> tuple[WhatIf, ...]:
    """The changes side by side: FP8 KV cache, half the max_model_len, a higher gpu_memory_utilization, half
    of each prompt a shared prefix, twice the tensor parallelism."""
    half = max_len // 2
    fp8 = (
        _try(model, "--kv-cache-dtype fp8", Action.FP8_KV_CACHE, replace(d, kv_cache_dtype="fp8"))
        if d.kv_cache_dtype == "auto"
        else WhatIf("--kv-cache-dtype fp8", Action.FP8_KV_CACHE, None, "already fp8")
    )
    prefix = f"{PREFIX_SHARE:.0%} of each prompt a shared prefix"
    shared = (
        _try(model, prefix, Action.ENABLE_PREFIX_CACHING, replace(d, prefix_share=PREFIX_SHARE))
        if d.workload is not None
        else WhatIf(prefix, Action.ENABLE_PREFIX_CACHING, None, "needs --prompt-tokens and --output-tokens")
    )
    tp = 2 * d.tensor_parallel_size
    return (
        fp8,
        _try(model, f"--max-model-len {half}", Action.REDUCE_MAX_MODEL_LEN, replace(d, max_model_len=half)),
        _utilization_what_if(model, d),
        shared,
        _try(
            model, f"--tensor-parallel-size {tp}", None, replace(d, tensor_parallel_size=tp), f"{tp} GPUs per replica"
        ),
    )


@dataclass(frozen=True)
class Plan:
    model: Model
    deployment: Deployment
    capacity: Capacity
    what_if: tuple[WhatIf, ...]
    notes: tuple[str, ...] = field(default=())


def _notes(model: Model, d: Deployment, cap: Capacity) -> tuple[str, ...]:
    notes = []
    if not cap.starts:
        notes.append(
            f"vLLM refuses to start: one request at max_model_len {cap.max_model_len:,} needs more KV than the cache "
            f"holds; the longest that fits is {cap.max_model_len_that_fits:,} (--max-model-len)"
        )
    if d.max_model_len is None:
        notes.append(
            f"max_model_len {cap.max_model_len:,} is config.json's {model.max_len_key}: pass --max-model-len to match the server"
        )
    elif model.derived_max_model_len and d.max_model_len > model.derived_max_model_len:
        notes.append(
            f"--max-model-len exceeds config.json's {model.max_len_key} ({model.derived_max_model_len:,}): vLLM starts "
            "only because VLLM_ALLOW_LONG_MAX_MODEL_LEN=1, and warns that positions past it give NaN (RoPE) or CUDA "
            "errors"
        )
    if cap.weights_bytes_per_gpu is not None:
        source = (
            "--weights-gib" if d.weights_gib is not None else f"estimated: {model.parameters:,} parameters x 2 bytes"
        )
        notes.append(
            f"KV memory = GPU memory x utilization - weights ({source}): an upper bound, vLLM also "
            "subtracts the activation peak, non-torch memory and CUDA graphs it measures at start-up"
        )
    if model.kv_cache_scheme and d.kv_cache_dtype == "auto":
        notes.append(
            "config.json's quantization_config sets a KV cache scheme: vLLM's --kv-cache-dtype auto may then "
            "be fp8; pass --kv-cache-dtype fp8 to plan for it"
        )
    if model.mla:
        notes.append("MLA backends on GPUs may force --block-size 64 (FlashMLA): pass the block size the server logs")
    return tuple(notes)


def plan(model: Model, d: Deployment) -> Plan:
    cap = capacity(model, d)
    return Plan(model, d, cap, what_ifs(model, d, cap.max_model_len), _notes(model, d, cap))


# ---------------------------------------------------------------------------------------- output


def _capacity_dict(c: Capacity) -> dict:
    return {
        "kv_memory_bytes": c.kv_memory_bytes,
        "weights_bytes_per_gpu": c.weights_bytes_per_gpu,
        "kv_heads_per_gpu": c.kv_heads_per_gpu,
        "kv_bytes_per_token": c.kv_bytes_per_token,
        "kv_cache_blocks": c.num_blocks,
        "kv_cache_tokens": c.kv_cache_tokens,
        "max_model_len": c.max_model_len,
        "max_concurrency_at_max_model_len": c.max_concurrency_at_max_model_len,
        "max_concurrency_at_workload": c.max_concurrency_at_workload,
        "limits": {str(b): v for b, v in c.limits.items()},
        "binding_limit": str(c.binding_limit),
        "starts": c.starts,
        "max_model_len_that_fits": c.max_model_len_that_fits,
    }


def as_dict(p: Plan) -> dict:
    """The ``--json`` document: the plan's numbers at the top level, the model and the what-ifs beside them."""
    m, d = p.model, p.deployment
    doc: dict[str, Any] = {
        "model": {
            "name": m.name,
            "model_type": m.model_type,
            "attention": m.attention,
            "num_layers": m.num_layers,
            "total_kv_heads": m.total_kv_heads,
            "head_size": m.head_size,
            "dtype": m.dtype,
            "parameters_estimate": m.parameters,
        },
        "tensor_parallel_size": d.tensor_parallel_size,
        "kv_cache_dtype": "fp8" if d.kv_cache_dtype == "fp8" else m.dtype,
        "block_size": d.block_size,
        "workload": None
        if d.workload is None
        else {"prompt_tokens": d.prompt_tokens, "output_tokens": d.output_tokens},
        **_capacity_dict(p.capacity),
    }
    doc["what_if"] = [
        {
            "change": w.change,
            "action": None if w.action is None else str(w.action),
            "kv_cache_tokens": None if w.capacity is None else w.capacity.kv_cache_tokens,
            "max_concurrency_at_max_model_len": None
            if w.capacity is None
            else w.capacity.max_concurrency_at_max_model_len,
            "max_concurrency_at_workload": None if w.capacity is None else w.capacity.max_concurrency_at_workload,
            "binding_limit": None if w.capacity is None else str(w.capacity.binding_limit),
            "note": w.note,
        }
        for w in p.what_if
    ]
    doc["notes"] = list(p.notes)
    return doc


def _size(n: float) -> str:
    return f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / (1 << 20):.2f} MiB"


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:,.2f}"


def _header(p: Plan) -> list[str]:
    m, d, c = p.model, p.deployment, p.capacity
    kv_dtype = "fp8" if d.kv_cache_dtype == "fp8" else m.dtype
    heads = "1 MLA latent" if m.mla else f"{c.kv_heads_per_gpu} of {m.total_kv_heads} KV heads"
    memory = (
        f"--kv-cache-memory-bytes {d.kv_cache_memory_bytes}"
        if c.weights_bytes_per_gpu is None
        else f"{d.gpu_memory_gib:g} GiB x {d.utilization:g} - {_size(c.weights_bytes_per_gpu)} weights"
    )
    lines = [
        f"{m.name} ({m.model_type}): {m.num_layers} layers, {m.attention}, "
        f"{m.total_kv_heads} KV heads x {m.head_size}, {kv_dtype} KV cache",
        f"  KV memory per GPU      {_size(c.kv_memory_bytes)} ({memory})",
        f"  KV bytes per token     {c.kv_bytes_per_token:,} B per GPU (TP {d.tensor_parallel_size}: {heads} on each GPU)",
        f"  KV cache               {c.kv_cache_tokens:,} tokens ({c.num_blocks:,} blocks of {d.block_size})",
        f"  max concurrency        {c.max_concurrency_at_max_model_len:.2f}x at max_model_len {c.max_model_len:,} "
        "(vLLM's start-up line)",
    ]
    if d.workload is not None:
        lines.append(
            f"                         {_x(c.max_concurrency_at_workload)} sequences of {d.workload:,} tokens "
            f"({d.prompt_tokens:,} prompt + {d.output_tokens:,} output), each at full length"
        )
    return lines


def _limit_lines(p: Plan) -> list[str]:
    c, d = p.capacity, p.deployment
    at = (
        f"{d.workload:,}-token sequences"
        if d.workload is not None
        else f"sequences of max_model_len {c.max_model_len:,}"
    )
    lines = [f"  limits ({at}):"]
    missing = {
        Bottleneck.MAX_NUM_SEQS: "not given (--max-num-seqs; vLLM's default depends on version and GPU)",
        Bottleneck.TOKEN_BUDGET: "not given (--max-num-batched-tokens with --prompt-tokens/--output-tokens)",
    }
    for b in (Bottleneck.KV_CACHE, Bottleneck.MAX_NUM_SEQS, Bottleneck.TOKEN_BUDGET):
        if b in c.limits:
            mark = "   <- binds first" if b is c.binding_limit else ""
            lines.append(f"    {b:<14} {c.limits[b]:>10,.2f} sequences{mark}")
        else:
            lines.append(f"    {b:<14} {missing[b]}")
    return lines


def _what_if_lines(p: Plan) -> list[str]:
    rows = [("as planned", p.capacity, "")] + [(w.change, w.capacity, w.note) for w in p.what_if]
    lines = [f"  {'what if':<40} {'KV tokens':>12} {'x at max_model_len':>19} {'at workload':>12}  binds"]
    for change, c, note in rows:
        if c is None:
            lines.append(f"  {change:<40} {note}")
            continue
        lines.append(
            f"  {change:<40} {c.kv_cache_tokens:>12,} {c.max_concurrency_at_max_model_len:>19,.2f} "
            f"{_x(c.max_concurrency_at_workload):>12}  {c.binding_limit}" + (f"  ({note})" if note else "")
        )
    return lines


def render_text(p: Plan) -> str:
    lines = [*_header(p), "", *_limit_lines(p), "", *_what_if_lines(p)]
    if p.notes:
        lines += ["", *(f"  note: {n}" for n in p.notes)]
    return "\n".join(lines)
