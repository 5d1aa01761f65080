"""``kvwatch plan``: vLLM's KV-cache arithmetic before deployment.

Proof on real vLLM: for the tiny model of tests/fixtures/vllm-0.32.0-cpu and each run's flags (read from its
server log's ``non-default args``), ``plan`` gives the KV cache size and the maximum concurrency that vLLM itself
printed at start-up (read from the same log). For public models, whose config.json values are written out below
with the model each comes from, the bytes per token match the architecture arithmetic written out by hand.
Everything runs in-process (``kvwatch.cli.main``): no subprocess, no network.
"""

from __future__ import annotations

import ast
import json
import math
import re

import pytest

from kvwatch import plan as P
from kvwatch.catalog import Action, Bottleneck
from kvwatch.cli import main
from tests.helpers.recordings import FIXTURES

MODEL_CONFIG = FIXTURES / "model-config.json"
RUNS = sorted(p.parent.name for p in FIXTURES.glob("*/server.log"))
GIB = 1 << 30

# vLLM 0.32's start-up line (kv_cache_utils.py), named after the device:
# "CPU KV cache size: 2,048 tokens, Maximum concurrency for 1,024 tokens per request: 2.00x"
KV_LINE = re.compile(r"KV cache size: ([\d,]+) tokens, Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x")
ARGS_LINE = re.compile(r"non-default args: (\{.*\})")


def vllm_printed(run: str) -> tuple[int, int, str]:
    """(KV cache tokens, max_model_len, concurrency as printed) from the run's server log."""
    found = KV_LINE.findall((FIXTURES / run / "server.log").read_text())
    assert len(found) == 1, run
    tokens, max_len, concurrency = found[0]
    return int(tokens.replace(",", "")), int(max_len.replace(",", "")), concurrency


def server_args(run: str) -> dict:
    """The flags vLLM got, as its API server logged them."""
    (found,) = ARGS_LINE.findall((FIXTURES / run / "server.log").read_text())
    return ast.literal_eval(found)


def bench_flags(run: str) -> dict[str, int]:
    """The benchmark's flags (config.txt: 'server flags | benchmark flags')."""
    words = (FIXTURES / run / "config.txt").read_text().split("|")[1].split()
    return {k: int(v) for k, v in zip(words[::2], words[1::2], strict=True) if v.isdigit()}


def run_plan(argv: list[str], capsys) -> tuple[int, str, str]:
    try:
        rc = main(["plan", *argv])
    except SystemExit as e:  # argparse's errors
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


def plan_json(argv: list[str], capsys) -> dict:
    rc, out, err = run_plan([*argv, "--json"], capsys)
    assert rc == 0, err
    return json.loads(out)


def fixture_flags(run: str) -> list[str]:
    a = server_args(run)
    flags = ["--model-config", str(MODEL_CONFIG), "--kv-cache-memory-bytes", str(a["kv_cache_memory_bytes"])]
    return flags + ["--block-size", str(a["block_size"]), "--max-model-len", str(a["max_model_len"])]


# ---------------------------------------------------------------------------------------- real vLLM


def test_the_fixtures_hold_the_runs_this_file_checks():
    assert {"kv_cache", "max_num_seqs", "token_budget"} <= set(RUNS)
    assert len({server_args(r)["kv_cache_memory_bytes"] for r in RUNS}) >= 3  # three KV sizes, 8 MiB to 256 MiB


@pytest.mark.parametrize("run", RUNS)
def test_plan_gives_the_kv_cache_size_and_concurrency_real_vllm_printed(run, capsys):
    tokens, max_len, concurrency = vllm_printed(run)
    doc = plan_json(fixture_flags(run), capsys)
    assert doc["kv_cache_tokens"] == tokens
    assert doc["max_model_len"] == max_len
    assert f"{doc['max_concurrency_at_max_model_len']:.2f}" == concurrency  # vLLM prints %.2f
    # the tiny model by hand: K and V x 4 layers x 8 KV heads x head_dim 32 x 2 bytes (bfloat16)
    assert doc["kv_bytes_per_token"] == 2 * 4 * 8 * 32 * 2


@pytest.mark.parametrize("run", ["kv_cache", "max_num_seqs", "token_budget"])
def test_the_limit_plan_says_binds_first_is_the_one_the_real_run_hit(run, capsys):
    """Each capture is named after the limit that bound while requests waited; plan, given the same server
    flags and the benchmark's lengths, names the same one."""
    a, b = server_args(run), bench_flags(run)
    flags = fixture_flags(run) + ["--max-num-seqs", str(a["max_num_seqs"])]
    prompt = b["--random-input-len"] + b.get("--random-prefix-len", 0)
    flags += ["--prompt-tokens", str(prompt), "--output-tokens", str(b["--random-output-len"])]
    if "max_num_batched_tokens" in a:
        flags += ["--max-num-batched-tokens", str(a["max_num_batched_tokens"])]
    doc = plan_json(flags, capsys)
    assert doc["binding_limit"] == Bottleneck(run)
    assert min(doc["limits"], key=doc["limits"].get) == run


def test_a_request_holds_whole_blocks_as_vllm_counts_them(capsys):
    # 1,000 tokens in blocks of 32 hold 32 blocks (not 31.25): 64 blocks / 32 = 2.00x, where tokens / length
    # would say 2,048 / 1,000 = 2.05x
    flags = fixture_flags("kv_cache")
    doc = plan_json([*flags[:-1], "1000", "--prompt-tokens", "700", "--output-tokens", "300"], capsys)
    assert doc["max_concurrency_at_max_model_len"] == 64 / math.ceil(1000 / 32) == 2.0
    assert doc["max_concurrency_at_workload"] == 2.0


def test_token_budget_limit_is_the_steady_state_of_a_full_step(capsys):
    # token_budget capture: 256-token steps, 1800 + 30 tokens per request: 256 x 30 / 1830 sequences
    a, b = server_args("token_budget"), bench_flags("token_budget")
    flags = fixture_flags("token_budget") + ["--max-num-batched-tokens", str(a["max_num_batched_tokens"])]
    prompt, out = b["--random-input-len"], b["--random-output-len"]
    doc = plan_json(flags + ["--prompt-tokens", str(prompt), "--output-tokens", str(out)], capsys)
    assert doc["limits"]["token_budget"] == pytest.approx(256 * 30 / 1830)


# ---------------------------------------------------------------------------------------- public models
# Values from each model's config.json on Hugging Face (the model id is above each); only the fields vLLM's
# KV sizing or the parameter estimate read, plus enough of the rest to be recognisable.

# meta-llama/Llama-3.1-8B-Instruct
LLAMA_31_8B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 131072,
    "rope_scaling": {"factor": 8.0, "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "attention_bias": False,
    "mlp_bias": False,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 128256,
}
# meta-llama/Llama-3.1-70B-Instruct
LLAMA_31_70B = {
    **LLAMA_31_8B,
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
}
# Qwen/Qwen2.5-7B-Instruct
QWEN25_7B = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "max_position_embeddings": 32768,
    "max_window_layers": 28,
    "sliding_window": 131072,
    "use_sliding_window": False,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 152064,
}
# mistralai/Mistral-7B-Instruct-v0.3
MISTRAL_7B_V03 = {
    "architectures": ["MistralForCausalLM"],
    "model_type": "mistral",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 32768,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 32768,
}
# mistralai/Mistral-7B-v0.1: the same shape with a 4096-token sliding window on every layer
MISTRAL_7B_V01 = {**MISTRAL_7B_V03, "sliding_window": 4096, "vocab_size": 32000}
del MISTRAL_7B_V01["head_dim"]
# deepseek-ai/DeepSeek-V2-Lite (MLA, MoE)
DEEPSEEK_V2_LITE = {
    "architectures": ["DeepseekV2ForCausalLM"],
    "model_type": "deepseek_v2",
    "hidden_size": 2048,
    "intermediate_size": 10944,
    "moe_intermediate_size": 1408,
    "n_routed_experts": 64,
    "n_shared_experts": 2,
    "num_experts_per_tok": 6,
    "first_k_dense_replace": 1,
    "num_hidden_layers": 27,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "kv_lora_rank": 512,
    "q_lora_rank": None,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "max_position_embeddings": 163840,
    "rope_scaling": {"factor": 40, "original_max_position_embeddings": 4096, "type": "yarn"},
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 102400,
}
# openai/gpt-oss-20b: sliding (128 tokens) and full attention alternate over 24 layers
GPT_OSS_20B = {
    "architectures": ["GptOssForCausalLM"],
    "model_type": "gpt_oss",
    "hidden_size": 2880,
    "head_dim": 64,
    "num_hidden_layers": 24,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "num_local_experts": 32,
    "layer_types": ["sliding_attention", "full_attention"] * 12,
    "sliding_window": 128,
    "max_position_embeddings": 131072,
    "quantization_config": {"quant_method": "mxfp4"},
    "torch_dtype": "bfloat16",
    "vocab_size": 201088,
}


@pytest.mark.parametrize(
    ("cfg", "tp", "expected"),
    [
        # K and V x layers x KV heads (per GPU) x head_dim x 2 bytes (bfloat16)
        (LLAMA_31_8B, 1, 2 * 32 * 8 * 128 * 2),  # 131072 B
        (LLAMA_31_70B, 1, 2 * 80 * 8 * 128 * 2),
        (LLAMA_31_70B, 4, 2 * 80 * 2 * 128 * 2),  # 8 KV heads over 4 GPUs: 2 on each
        (LLAMA_31_70B, 16, 2 * 80 * 1 * 128 * 2),  # fewer KV heads than GPUs: one (replicated) on each
        (QWEN25_7B, 1, 2 * 28 * 4 * 128 * 2),  # head_dim = 3584 / 28
        (QWEN25_7B, 2, 2 * 28 * 2 * 128 * 2),
        (MISTRAL_7B_V03, 1, 2 * 32 * 8 * 128 * 2),
        (MISTRAL_7B_V01, 1, 2 * 32 * 8 * 128 * 2),  # a window caps what a request holds, not a token's size
        # MLA: one latent of kv_lora_rank + qk_rope_head_dim per layer (no separate V), the same on every GPU
        (DEEPSEEK_V2_LITE, 1, 27 * (512 + 64) * 2),  # 31104 B
        (DEEPSEEK_V2_LITE, 2, 27 * (512 + 64) * 2),
        (GPT_OSS_20B, 1, 2 * 24 * 8 * 64 * 2),
    ],
)
def test_bytes_per_token_is_the_architecture_arithmetic(cfg, tp, expected):
    model = P.model_from_config(cfg)
    assert P.kv_bytes_per_token(model, tp) == expected
    assert P.kv_bytes_per_token(model, tp, "fp8") * 2 == expected  # fp8: one byte per element


@pytest.mark.parametrize(
    ("cfg", "published"),
    # the parameter counts the models' Hugging Face pages give ("Model size")
    [(LLAMA_31_8B, "8.03"), (LLAMA_31_70B, "70.6"), (QWEN25_7B, "7.62"), (MISTRAL_7B_V03, "7.25")],
)
def test_the_weights_estimate_is_the_published_parameter_count(cfg, published):
    decimals = len(published.split(".")[1])
    assert f"{P.estimate_parameters(cfg) / 1e9:.{decimals}f}" == published


def test_no_weights_estimate_for_moe_or_quantized_models():
    assert P.estimate_parameters(DEEPSEEK_V2_LITE) is None
    assert P.estimate_parameters(GPT_OSS_20B) is None
    assert P.estimate_parameters({**LLAMA_31_8B, "quantization_config": {"quant_method": "awq"}}) is None


def test_gpu_memory_path_is_memory_times_utilization_minus_weights(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA_31_8B))
    doc = plan_json(
        [
            "--model-config",
            str(path),
            "--gpu-memory-gib",
            "80",
            "--gpu-memory-utilization",
            "0.9",
            "--max-model-len",
            "8192",
        ],
        capsys,
    )
    weights = 8_030_261_248 * 2  # the estimate: 8.03 B parameters in bfloat16
    memory = int(80 * GIB * 0.9) - weights
    page = 16 * 2 * 8 * 128 * 2  # one block of 16 tokens of one layer
    blocks = memory // page // 32
    assert (doc["kv_memory_bytes"], doc["weights_bytes_per_gpu"], doc["kv_cache_blocks"]) == (memory, weights, blocks)
    assert doc["kv_cache_tokens"] == blocks * 16
    assert doc["max_concurrency_at_max_model_len"] == blocks / (8192 // 16)
    assert any("upper bound" in n for n in doc["notes"])


def test_tensor_parallelism_shards_the_weights_and_the_heads(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA_31_70B))
    flags = ["--model-config", str(path), "--gpu-memory-gib", "80", "--tensor-parallel-size", "4"]
    doc = plan_json([*flags, "--weights-gib", "131.5", "--max-model-len", "32768"], capsys)
    weights = int(131.5 * GIB) // 4
    blocks = (int(80 * GIB * 0.9) - weights) // (16 * 2 * 2 * 128 * 2) // 80  # 2 KV heads per GPU
    assert (doc["weights_bytes_per_gpu"], doc["kv_cache_blocks"], doc["kv_heads_per_gpu"]) == (weights, blocks, 2)


def test_mla_model_on_the_kv_bytes_path(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(DEEPSEEK_V2_LITE))
    doc = plan_json(
        ["--model-config", str(path), "--kv-cache-memory-bytes", str(20 * GIB), "--block-size", "64"], capsys
    )
    blocks = 20 * GIB // (64 * 576 * 2) // 27
    assert (doc["kv_cache_blocks"], doc["kv_cache_tokens"], doc["max_model_len"]) == (blocks, blocks * 64, 163840)
    assert doc["max_concurrency_at_max_model_len"] == blocks / (163840 // 64)
    assert doc["model"]["attention"] == "MLA"


# ---------------------------------------------------------------------------------------- sliding windows


def test_every_layer_sliding_caps_a_request_at_window_plus_step_budget():
    # vLLM's SlidingWindowSpec: cdiv(min(window - 1 + max_num_batched_tokens, max_model_len), block) + 1 blocks
    model = P.model_from_config(MISTRAL_7B_V01)
    d = P.Deployment(kv_cache_memory_bytes=40 * GIB, max_model_len=32768, max_num_batched_tokens=8192)
    cap = P.capacity(model, d)
    blocks = 40 * GIB // (16 * 2 * 8 * 128 * 2) // 32
    assert (cap.num_blocks, cap.kv_cache_tokens) == (blocks, blocks * 16)
    assert cap.max_concurrency_at_max_model_len == blocks / (math.ceil((4096 - 1 + 8192) / 16) + 1)
    with pytest.raises(P.PlanError, match="--max-num-batched-tokens"):
        P.capacity(model, P.Deployment(kv_cache_memory_bytes=40 * GIB, max_model_len=32768))


def test_hybrid_layers_share_one_pool_in_groups():
    # 12 sliding + 12 full layers: two groups of 12 (vLLM's _get_kv_cache_groups_uniform_page_size); a request
    # holds blocks in both, the log's size is num_blocks // 2 groups x block_size
    model = P.model_from_config(GPT_OSS_20B)
    assert P.kv_cache_groups(model) == ((128, None), 12)
    d = P.Deployment(kv_cache_memory_bytes=30 * GIB, max_model_len=131072, max_num_batched_tokens=8192)
    cap = P.capacity(model, d)
    blocks = 30 * GIB // (16 * 2 * 8 * 64 * 2) // 12
    assert (cap.num_blocks, cap.kv_cache_tokens) == (blocks, blocks // 2 * 16)
    per_request = 131072 // 16 + math.ceil((128 - 1 + 8192) / 16) + 1
    assert cap.max_concurrency_at_max_model_len == blocks / per_request


def test_five_to_one_pattern_is_grouped_by_the_smaller_count():
    # Gemma-3-27B's shape: 62 layers, every sixth full: 52 sliding in 6 groups of 10 (padded), 10 full in 1
    types = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(62)]
    cfg = {**MISTRAL_7B_V03, "model_type": "gemma3_text", "num_hidden_layers": 62, "layer_types": types}
    groups, per_group = P.kv_cache_groups(P.model_from_config({**cfg, "sliding_window": 1024}))
    assert (sorted(groups, key=str), per_group) == ([1024] * 6 + [None], 10)


# ---------------------------------------------------------------------------------------- what-ifs and output


def test_what_ifs_side_by_side(capsys):
    doc = plan_json(
        fixture_flags("kv_cache") + ["--max-num-seqs", "16", "--prompt-tokens", "250", "--output-tokens", "250"], capsys
    )
    rows = {w["action"]: w for w in doc["what_if"]}
    assert {k for w in doc["what_if"] for k in w} >= {"change", "kv_cache_tokens", "max_concurrency_at_workload"}
    fp8 = rows[Action.FP8_KV_CACHE]
    assert (fp8["change"], fp8["kv_cache_tokens"]) == ("--kv-cache-dtype fp8", 2 * doc["kv_cache_tokens"])
    assert fp8["max_concurrency_at_workload"] == 2 * doc["max_concurrency_at_workload"]
    shorter = rows[Action.REDUCE_MAX_MODEL_LEN]
    assert shorter["change"] == "--max-model-len 512"
    assert shorter["max_concurrency_at_max_model_len"] == 2 * doc["max_concurrency_at_max_model_len"]
    assert shorter["kv_cache_tokens"] == doc["kv_cache_tokens"]  # the same memory
    assert rows[Action.RAISE_GPU_MEMORY_UTILIZATION]["kv_cache_tokens"] is None  # the KV bytes are fixed
    # half of each 250-token prompt shared: 3 whole blocks of 32 held once, 13 of 16 blocks per request
    assert rows[Action.ENABLE_PREFIX_CACHING]["max_concurrency_at_workload"] == (64 - 3) / 13
    tp = rows[None]
    assert (tp["change"], tp["kv_cache_tokens"]) == ("--tensor-parallel-size 2", 2 * doc["kv_cache_tokens"])


def test_utilization_what_if_stops_at_the_ceiling(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA_31_8B))
    flags = ["--model-config", str(path), "--gpu-memory-gib", "80", "--max-model-len", "8192"]

    def raised(u):
        doc = plan_json([*flags, "--gpu-memory-utilization", u], capsys)
        return next(w for w in doc["what_if"] if w["action"] == Action.RAISE_GPU_MEMORY_UTILIZATION), doc

    w, doc = raised("0.9")
    assert w["change"] == "--gpu-memory-utilization 0.95" and w["kv_cache_tokens"] > doc["kv_cache_tokens"]
    assert raised("0.93")[0]["change"] == "--gpu-memory-utilization 0.95"
    assert raised("0.95")[0]["kv_cache_tokens"] is None


def test_tp_what_if_that_vllm_refuses_says_why(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(QWEN25_7B))  # 28 heads: TP 8 does not divide them
    doc = plan_json(
        ["--model-config", str(path), "--kv-cache-memory-bytes", str(GIB), "--tensor-parallel-size", "4"], capsys
    )
    tp = next(w for w in doc["what_if"] if w["change"] == "--tensor-parallel-size 8")
    assert tp["kv_cache_tokens"] is None and "num_attention_heads (28)" in tp["note"]


def test_text_output_says_the_numbers(capsys):
    flags = fixture_flags("kv_cache") + ["--max-num-seqs", "16", "--prompt-tokens", "250", "--output-tokens", "250"]
    doc = plan_json(flags, capsys)
    rc, out, _ = run_plan(flags, capsys)
    assert rc == 0
    assert f"{doc['kv_bytes_per_token']:,} B per GPU" in out
    assert f"{doc['kv_cache_tokens']:,} tokens ({doc['kv_cache_blocks']:,} blocks of 32)" in out
    assert f"{doc['max_concurrency_at_max_model_len']:.2f}x at max_model_len 1,024" in out
    assert re.search(rf"{Bottleneck.KV_CACHE}\s+4\.00 sequences\s+<- binds first", out)
    assert "--kv-cache-dtype fp8" in out and "--tensor-parallel-size 2" in out


def test_a_cache_too_small_for_max_model_len_says_vllm_will_not_start(capsys):
    doc = plan_json(
        ["--model-config", str(MODEL_CONFIG), "--kv-cache-memory-bytes", "8388608", "--max-model-len", "4096"], capsys
    )
    # 8 MiB / (16 x 4 KiB) = 128 blocks of 16 = 2048 tokens: a 4096-token request does not fit
    assert (doc["starts"], doc["max_model_len_that_fits"]) == (False, 2048)
    assert any("refuses to start" in n for n in doc["notes"])


def test_a_checkpoint_that_quantizes_its_kv_cache_is_pointed_out(tmp_path, capsys):
    cfg = {
        **LLAMA_31_8B,
        "quantization_config": {"quant_method": "compressed-tensors", "kv_cache_scheme": {"num_bits": 8}},
    }
    flags = ["--model-config", _write(tmp_path, cfg), "--kv-cache-memory-bytes", str(GIB)]
    assert any("--kv-cache-dtype fp8" in n for n in plan_json(flags, capsys)["notes"])
    assert not any("quantization_config" in n for n in plan_json([*flags, "--kv-cache-dtype", "fp8"], capsys)["notes"])


def test_the_docs_example_is_what_the_command_prints(capsys):
    readme = (FIXTURES.parents[2] / "docs" / "planning.md").read_text().splitlines()
    start = next(i for i, line in enumerate(readme) if line.startswith("    $ kvwatch plan "))
    command, i = readme[start].removeprefix("    $ kvwatch plan "), start
    while command.endswith("\\"):
        i += 1
        command = command[:-1] + readme[i].strip()
    shown = []
    for line in readme[i + 1 :]:
        if line and not line.startswith("    "):
            break
        shown.append(line[4:])
    rc, out, _ = run_plan(command.split(), capsys)
    assert rc == 0
    assert out.rstrip("\n").splitlines() == [x.rstrip() for x in shown[: len(out.rstrip().splitlines())]]
    assert "".join(shown[len(out.rstrip().splitlines()) :]).strip() == ""


@pytest.mark.parametrize(
    ("cfg", "expected"),
    [
        (LLAMA_31_8B, 131072),  # llama3 RoPE scaling: max_position_embeddings as it is
        (DEEPSEEK_V2_LITE, 4096 * 40),  # YaRN: original_max_position_embeddings x factor
        (
            {**QWEN25_7B, "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}},
            131072,
        ),
        ({**MISTRAL_7B_V03, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}, 65536),
        ({**MISTRAL_7B_V03, "max_sequence_length": 8192}, 8192),  # the smallest length key
    ],
)
def test_the_default_max_model_len_is_the_one_vllm_derives(cfg, expected):
    assert P.model_from_config(cfg).derived_max_model_len == expected


def test_binding_limit_is_the_smallest():
    limits = {Bottleneck.KV_CACHE: 40.0, Bottleneck.MAX_NUM_SEQS: 32.0, Bottleneck.TOKEN_BUDGET: 51.2}
    assert P.binding_limit(limits) is Bottleneck.MAX_NUM_SEQS
    assert P.binding_limit({Bottleneck.MAX_NUM_SEQS: 8.0, Bottleneck.KV_CACHE: 8.0}) is Bottleneck.KV_CACHE


# ---------------------------------------------------------------------------------------- bad input


def _write(tmp_path, cfg) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return str(path)


@pytest.mark.parametrize(
    ("cfg", "flags", "says"),
    [
        ({k: v for k, v in LLAMA_31_8B.items() if k != "num_hidden_layers"}, [], "num_hidden_layers"),
        ({**LLAMA_31_8B, "num_key_value_heads": -8}, [], "num_key_value_heads"),
        ({**LLAMA_31_8B, "model_type": "jamba", "attn_layer_indices": [4]}, [], "not supported"),
        ({**LLAMA_31_8B, "layer_types": ["linear_attention"] * 32}, [], "not supported"),
        ({**LLAMA_31_8B, "is_encoder_decoder": True}, [], "not supported"),
        ({**LLAMA_31_8B, "model_type": "gemma2", "sliding_window": 4096}, [], "layer_types"),
        ({**LLAMA_31_8B, "torch_dtype": "int4"}, [], "torch_dtype"),
        (LLAMA_31_8B, ["--tensor-parallel-size", "3"], "--tensor-parallel-size 3"),
        (LLAMA_31_8B, ["--prompt-tokens", "100"], "--output-tokens"),
        (
            LLAMA_31_8B,
            ["--prompt-tokens", "9000", "--output-tokens", "1", "--max-model-len", "8192"],
            "--max-model-len",
        ),
        (
            LLAMA_31_8B,
            ["--gpu-memory-gib", "80", "--kv-cache-memory-bytes", "1"],
            "--kv-cache-memory-bytes or --gpu-memory-gib",
        ),
        (LLAMA_31_8B, ["--gpu-memory-utilization", "0.9"], "--gpu-memory-utilization"),
        (LLAMA_31_8B, ["--block-size", "-16"], "--block-size"),
        (LLAMA_31_8B, ["--max-num-seqs", "0"], "--max-num-seqs"),
        (LLAMA_31_8B, ["--kv-cache-dtype", "int4"], "--kv-cache-dtype"),
        (LLAMA_31_8B, ["--kv-cache-memory-bytes", "1000"], "no block"),
    ],
)
def test_bad_input_exits_2_with_one_line_saying_what_to_fix(tmp_path, capsys, cfg, flags, says):
    argv = ["--model-config", _write(tmp_path, cfg), *flags]
    if not any(f in flags for f in ("--gpu-memory-gib", "--kv-cache-memory-bytes")):
        argv += ["--kv-cache-memory-bytes", str(8 * GIB)]
    rc, out, err = run_plan(argv, capsys)
    assert rc == 2 and not out
    assert len(err.strip().splitlines()) == 1, err
    assert says in err


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--gpu-memory-gib", "80"], "--weights-gib"),  # an MoE's weights are not estimated
        (["--gpu-memory-gib", "16", "--weights-gib", "200"], "no memory left"),
    ],
)
def test_gpu_memory_path_needs_weights_it_can_trust(tmp_path, capsys, flags, says):
    rc, _, err = run_plan(["--model-config", _write(tmp_path, DEEPSEEK_V2_LITE), *flags], capsys)
    assert rc == 2 and len(err.strip().splitlines()) == 1 and says in err


@pytest.mark.parametrize("content", ["", "not json", "[1, 2]", '{"model_type": 3}', "[" * 100000, "\udcff"])
def test_an_unreadable_config_file_exits_2(tmp_path, capsys, content):
    path = tmp_path / "config.json"
    path.write_bytes(content.encode("utf-8", "surrogateescape"))
    rc, _, err = run_plan(["--model-config", str(path), "--kv-cache-memory-bytes", "1000000"], capsys)
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "--model-config" in err


HOSTILE = [None, -1, 0, 10**12, 1.5, "x", [], {}, True]


@pytest.mark.parametrize("key", sorted(DEEPSEEK_V2_LITE.keys() | LLAMA_31_8B.keys() | {"head_dim", "layer_types"}))
def test_any_value_in_any_field_is_a_plan_or_a_plan_error(key):
    d = P.Deployment(kv_cache_memory_bytes=8 * GIB, max_model_len=4096, max_num_batched_tokens=2048)
    outcomes = {}
    for base in (LLAMA_31_8B, DEEPSEEK_V2_LITE, MISTRAL_7B_V01):
        for value in HOSTILE:
            try:
                outcomes[(base["model_type"], repr(value))] = type(P.plan(P.model_from_config({**base, key: value}), d))
            except Exception as e:  # noqa: BLE001 - the point: which kinds of exception come out
                outcomes[(base["model_type"], repr(value))] = type(e)
    assert {o for o in outcomes.values()} <= {P.Plan, P.PlanError}, outcomes


@pytest.mark.parametrize("allow", [None, "0", "yes"])
def test_a_max_model_len_past_the_models_exits_2_as_vllm_refuses_it(tmp_path, capsys, monkeypatch, allow):
    """Issue 25 point 4: vLLM's _get_and_verify_max_len (vllm/config/model.py) raises at start-up when --max-model-len
    exceeds the derived maximum, unless VLLM_ALLOW_LONG_MAX_MODEL_LEN is "1" or "true" (vllm/envs.py); "yes" is not."""
    monkeypatch.delenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", raising=False)
    if allow is not None:
        monkeypatch.setenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", allow)
    argv = ["--model-config", _write(tmp_path, LLAMA_31_8B), "--kv-cache-memory-bytes", str(8 * GIB)]
    rc, out, err = run_plan([*argv, "--max-model-len", "200000"], capsys)
    assert rc == 2 and not out and len(err.strip().splitlines()) == 1, err
    assert "--max-model-len 200,000 exceeds config.json's max_position_embeddings (131,072)" in err
    assert "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1" in err
    assert run_plan([*argv, "--max-model-len", "131072"], capsys)[0] == 0  # at the maximum: starts


@pytest.mark.parametrize("allow", ["1", " TRUE "])
def test_vllms_long_length_override_lets_plan_size_the_longer_length(tmp_path, capsys, monkeypatch, allow):
    monkeypatch.setenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", allow)
    argv = ["--model-config", _write(tmp_path, LLAMA_31_8B), "--kv-cache-memory-bytes", str(8 * GIB)]
    doc = plan_json([*argv, "--max-model-len", "200000"], capsys)
    assert doc["max_model_len"] == 200000
    assert any("only because VLLM_ALLOW_LONG_MAX_MODEL_LEN=1" in n for n in doc["notes"]), doc["notes"]
