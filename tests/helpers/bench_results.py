"""``vllm bench serve --save-result`` files for the report's tests, shaped as vLLM 0.32 writes them.

The keys and their order are vLLM's (``vllm/benchmarks/serve.py``: ``main`` writes date .. max_concurrency, then
``benchmark``'s result; ``--percentile-metrics`` ttft,tpot,itl by default, ``--metric-percentiles`` 99). ``date`` is
the end of the run in local time, as vLLM takes it (``datetime.now()`` after ``benchmark`` returns). The fields a
real run writes per request (``ttfts``, ``itls``, ``generated_texts`` ...) are left out: the report reads none.
Real results from the e2e lane, when kept, live in ``tests/fixtures/bench/``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

__all__ = ["vllm_result", "write_result"]


def vllm_result(
    end: float, duration: float, concurrency: int | None, ttft_p99_ms: float, itl_p99_ms: float, **extra
) -> dict:
    doc = {
        "date": time.strftime("%Y%m%d-%H%M%S", time.localtime(end)),
        "endpoint_type": "vllm",
        "backend": "vllm",
        "label": None,
        "model_id": "tiny-llama-dummy",
        "tokenizer_id": "tiny-llama-dummy",
        "num_prompts": 40,
        "request_rate": "inf",
        "burstiness": 1.0,
        "max_concurrency": concurrency,
        "duration": duration,
        "completed": 40,
        "failed": 0,
        "total_input_tokens": 40 * 300,
        "total_output_tokens": 40 * 150,
        "request_throughput": 40 / duration,
        "request_goodput": None,
        "output_throughput": 40 * 150 / duration,
        "total_token_throughput": 40 * 450 / duration,
        "max_output_tokens_per_s": 400.0,
        "max_concurrent_requests": concurrency or 40,
    }
    for metric, p99 in (("ttft", ttft_p99_ms), ("tpot", itl_p99_ms), ("itl", itl_p99_ms)):
        doc.update(
            {
                f"mean_{metric}_ms": p99 / 3,
                f"median_{metric}_ms": p99 / 4,
                f"std_{metric}_ms": p99 / 5,
                f"p99_{metric}_ms": p99,
            }
        )
    doc.update(extra)
    return doc


def write_result(path: Path, doc: dict) -> Path:
    path.write_text(json.dumps(doc))
    return path
