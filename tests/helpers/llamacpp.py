"""A real llama.cpp server for the tests: a tiny random model written at test time, and llama.cpp's own HTTP server
(the PyPI wheel ``xllamacpp``, pinned in pyproject's test extras) as a subprocess on a free loopback port.

    model = make_tiny_gguf(tmp_path / "tiny.gguf")                 # ~7 MB, 0.4 s, no download
    with llamacpp_server(model, tmp_path / "llama.log", parallel=2, ctx_size=1024) as server:
        server.url                                                 # "http://127.0.0.1:PORT"
        server.metrics()                                           # the /metrics text (llamacpp: families)
        server.slots()                                             # the /slots JSON (a list, one per slot)
        server.complete("hello", n_predict=64)                     # POST /completion -> httpx.Response
    # stopped by PID (SIGTERM, then SIGKILL to its process group), also when the body raised

The model is a llama-architecture GGUF with random F16 weights and a byte-fallback vocabulary (``<unk>``, ``<s>``,
``</s>`` and the 256 ``<0xNN>`` byte tokens, llama.cpp's SPM tokenizer): any text tokenises, one token per UTF-8
byte plus BOS, so a prompt's length in tokens is known without asking the server. It generates noise; send
``ignore_eos`` so that each request produces exactly ``n_predict`` tokens. On two shared cores with one thread it
decodes ~450 tokens/s per slot (~900/s with two slots busy): size the load from that.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.helpers.ports import HOST, free_port
from tests.helpers.process import Process

__all__ = ["LlamaCppServer", "llamacpp_server", "make_tiny_gguf", "prompt_of_tokens"]

REPO_ROOT = Path(__file__).resolve().parents[2]
# The byte-fallback vocabulary: 3 special tokens, then one token per byte value.
SPECIAL_TOKENS = (b"<unk>", b"<s>", b"</s>")
BOS_ID, EOS_ID, UNK_ID = 1, 2, 0


def make_tiny_gguf(
    path: Path | str,
    *,
    n_embd: int = 256,
    n_layer: int = 4,
    n_head: int = 4,
    n_ff: int = 768,
    n_ctx_train: int = 4096,
    seed: int = 0,
) -> Path:
    """Write a random llama-architecture model to ``path`` (GGUF, F16 matrices) and return the path.

    Tensor names and shapes are llama.cpp's for ``LLM_ARCH_LLAMA`` (gguf-py's ``MODEL_TENSORS``); numpy's shape is
    the reverse of ggml's ``ne``, so ``(n_vocab, n_embd)`` is a ``[n_embd, n_vocab]`` embedding. Norm weights are
    ones and F32 (llama.cpp keeps 1-D tensors in F32)."""
    import gguf
    import numpy as np

    path = Path(path)
    rng = np.random.default_rng(seed)
    tokens = [*SPECIAL_TOKENS, *(f"<0x{b:02X}>".encode() for b in range(256))]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL] + [gguf.TokenType.BYTE] * 256
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("kvwatch-tiny-random")
    writer.add_context_length(n_ctx_train)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head)
    writer.add_rope_dimension_count(n_embd // n_head)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * len(tokens))
    writer.add_token_types(types)
    writer.add_bos_token_id(BOS_ID)
    writer.add_eos_token_id(EOS_ID)
    writer.add_unk_token_id(UNK_ID)
    writer.add_add_space_prefix(False)  # SPM would prepend "▁" (3 bytes, so 3 tokens here) to every prompt

    def matrix(name: str, rows: int, cols: int) -> None:
        writer.add_tensor(name, (rng.standard_normal((rows, cols)) * 0.02).astype(np.float16))

    def norm(name: str) -> None:
        writer.add_tensor(name, np.ones(n_embd, np.float32))

    matrix("token_embd.weight", len(tokens), n_embd)
    for i in range(n_layer):
        norm(f"blk.{i}.attn_norm.weight")
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            matrix(f"blk.{i}.{name}.weight", n_embd, n_embd)
        norm(f"blk.{i}.ffn_norm.weight")
        matrix(f"blk.{i}.ffn_gate.weight", n_ff, n_embd)
        matrix(f"blk.{i}.ffn_up.weight", n_ff, n_embd)
        matrix(f"blk.{i}.ffn_down.weight", n_embd, n_ff)
    norm("output_norm.weight")
    matrix("output.weight", len(tokens), n_embd)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def prompt_of_tokens(n: int, tag: int = 0) -> str:
    """A prompt that the tiny model's byte vocabulary tokenises to exactly ``n`` tokens with BOS: ASCII without
    spaces (SPM escapes a space as "▁", three bytes, so three tokens), one token a byte. It starts with ``tag``:
    prompts with different tags share no prefix, so llama.cpp's prompt cache cannot serve one from another."""
    if n < 1:
        raise ValueError("a prompt has at least BOS")
    text = f"{tag:06d}:" + "kvwatch-llama.cpp-load;" * (n // 23 + 1)
    return text[: n - 1]


@dataclass
class LlamaCppServer:
    """A running server: its address, its process, and one call per endpoint the tests read."""

    url: str
    process: Process
    parallel: int
    ctx_size: int

    def _get(self, path: str, timeout: float = 10.0) -> httpx.Response:
        return httpx.get(self.url + path, timeout=timeout, trust_env=False)

    def metrics(self) -> str:
        """The ``/metrics`` body (Prometheus text, ``llamacpp:`` families)."""
        response = self._get("/metrics")
        response.raise_for_status()
        return response.text

    def slots(self) -> list[dict[str, Any]]:
        """The ``/slots`` JSON: one object per slot."""
        response = self._get("/slots")
        response.raise_for_status()
        return response.json()

    def complete(self, prompt: str, n_predict: int, timeout: float = 120.0, **options: Any) -> httpx.Response:
        """POST ``/completion`` (llama.cpp's native API) with ``ignore_eos``; the response, whatever its status."""
        body = {"prompt": prompt, "n_predict": n_predict, "ignore_eos": True, **options}
        return httpx.post(self.url + "/completion", json=body, timeout=timeout, trust_env=False)

    @property
    def pid(self) -> int:
        return self.process.pid


@contextmanager
def llamacpp_server(
    model: Path | str,
    log_path: Path | str,
    *,
    parallel: int = 2,
    ctx_size: int = 1024,
    batch_size: int | None = None,
    ubatch_size: int | None = None,
    kv_unified: bool = False,
    cache_type_k: str | None = None,
    cache_type_v: str | None = None,
    threads: int = 1,
    metrics: bool = True,
    slots: bool = True,
    timeout: float = 60.0,
) -> Iterator[LlamaCppServer]:
    """llama.cpp's server on a free loopback port with ``--metrics`` and ``--slots`` (by default), ``parallel``
    slots sharing ``ctx_size`` tokens of context; ready (``/health`` 200) when this yields, stopped by PID after."""
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "tests.helpers.llamacpp_server",
        "--model",
        str(model),
        "--host",
        HOST,
        "--port",
        str(port),
        "--parallel",
        str(parallel),
        "--ctx-size",
        str(ctx_size),
        "--threads",
        str(threads),
    ]
    for flag, value in (
        ("--batch-size", batch_size),
        ("--ubatch-size", ubatch_size),
        ("--cache-type-k", cache_type_k),
        ("--cache-type-v", cache_type_v),
    ):
        if value is not None:
            argv += [flag, str(value)]
    argv += ["--kv-unified"] * kv_unified + ["--metrics"] * metrics + ["--slots"] * slots
    with Process(argv, log_path, name="llama.cpp server", cwd=REPO_ROOT) as process:
        url = f"http://{HOST}:{port}"
        # /health answers 503 while the model loads, 200 once the slots are ready (server.cpp's handle_health).
        process.wait_for_url(url + "/health", timeout=timeout)
        yield LlamaCppServer(url=url, process=process, parallel=parallel, ctx_size=ctx_size)
