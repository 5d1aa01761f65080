"""Build the tiny dummy-weight Llama that the e2e lane serves with vLLM — no download.

Writes into OUT_DIR:
  config.json            a LlamaForCausalLM config (hidden 256, 4 layers, 8 heads, 8 KV heads, head_dim 32)
                         => 2 (K,V) x 4 layers x 8 heads x 32 x 2 bytes (bf16) = 4 KiB of KV cache per token,
                         so ``--kv-cache-memory-bytes 16777216`` gives exactly 4096 KV tokens.
  tokenizer.json         a byte-level BPE tokenizer trained with the ``tokenizers`` package on local text
                         (the running Python's own standard-library sources, read in a fixed order)
  tokenizer_config.json  so transformers/vLLM load it as a PreTrainedTokenizerFast
  generation_config.json

vLLM serves it with ``--load-format dummy`` (random weights), so no weights file is written.

Run with the e2e venv's Python (it has ``tokenizers``):  python make_model.py OUT_DIR
Idempotent: an OUT_DIR that already holds a complete model is left as it is.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import sysconfig
from pathlib import Path

VOCAB_SIZE = 2000  # the trained vocabulary; the model's vocab_size is the tokenizer's actual size
BOS, EOS = "<s>", "</s>"
CORPUS_BYTES = 3_000_000

MODEL_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "head_dim": 32,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-05,
    "rope_theta": 10000.0,
    "torch_dtype": "bfloat16",
    "bos_token_id": 0,
    "eos_token_id": 1,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
}

#: bytes of KV cache per token for MODEL_CONFIG in bf16 (K and V, every layer)
KV_BYTES_PER_TOKEN = (
    2 * MODEL_CONFIG["num_hidden_layers"] * MODEL_CONFIG["num_key_value_heads"] * MODEL_CONFIG["head_dim"] * 2
)


def corpus_files(limit_bytes: int = CORPUS_BYTES) -> list[str]:
    """Local text to train on: standard-library sources, sorted, up to ``limit_bytes``."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files, total = [], 0
    for path in sorted(stdlib.glob("*.py")):
        size = path.stat().st_size
        files.append(str(path))
        total += size
        if total >= limit_bytes:
            break
    if not files:
        raise SystemExit(f"no training text found under {stdlib}")
    return files


def build_tokenizer(out: Path) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=[BOS, EOS],  # ids 0 and 1, matching bos/eos_token_id
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train(corpus_files(), trainer)
    assert tok.token_to_id(BOS) == 0 and tok.token_to_id(EOS) == 1
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": BOS,
                "eos_token": EOS,
                "add_bos_token": False,
                "add_eos_token": False,
                "model_max_length": MODEL_CONFIG["max_position_embeddings"],
                "clean_up_tokenization_spaces": False,
            },
            indent=1,
        )
    )
    return tok.get_vocab_size()


def build(out: Path) -> Path:
    done = out / ".complete"
    if done.exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    vocab = build_tokenizer(out)
    config = dict(MODEL_CONFIG, vocab_size=vocab)
    (out / "config.json").write_text(json.dumps(config, indent=1))
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 0, "eos_token_id": 1, "do_sample": False}, indent=1)
    )
    done.write_text(json.dumps({"vocab_size": vocab, "kv_bytes_per_token": KV_BYTES_PER_TOKEN}))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out_dir", type=Path)
    args = p.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    out = build(args.out_dir)
    print(json.loads((out / ".complete").read_text())["vocab_size"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
