"""Which engine the simulator speaks: each engine's renderer, where it serves it and what it refuses.

``kvwatch sim --engine NAME`` / ``SimServer(engine=NAME)``: the same simulation (kvwatch.sim.engine, vLLM's V1
scheduler model) printed as that engine's ``/metrics``. The names are kvwatch.engines' (``--engine`` of
``kvwatch run``), so a simulated target is read by the adapter of the same name; ``triton-trtllm`` (Triton's
TensorRT-LLM backend) is read by the ``trtllm`` adapter.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from . import exposition, exposition_llamacpp, exposition_sglang, exposition_triton, exposition_trtllm

__all__ = ["EXPOSITIONS", "Exposition", "by_name"]


@dataclass(frozen=True, slots=True)
class Exposition:
    name: str  # the simulator's --engine value
    title: str
    render: Callable[..., str]  # render(sim, version) -> the metrics body
    metrics_path: str = "/metrics"
    versions: tuple[str, ...] = ()  # --metrics-version values (vLLM's); others speak one version
    one_engine: str = ""  # why it serves one engine only ("": data-parallel engines allowed)
    adapter: str = ""  # kvwatch.engines' name for the engine, if not ``name``
    # A second path the engine serves beside its metrics, and its body for ``sim`` (llama.cpp's /slots): what the
    # adapter's kvwatch.engines.ExtraSource reads
    extra_path: str = ""
    render_extra: Callable[..., bytes] | None = None

    @property
    def engine(self) -> str:
        """The kvwatch engine (``kvwatch run --engine``) that reads this exposition."""
        return self.adapter or self.name


EXPOSITIONS: dict[str, Exposition] = {
    e.name: e
    for e in (
        Exposition("vllm", "vLLM", exposition.render, versions=exposition.METRICS_VERSIONS),
        Exposition("sglang", "SGLang", exposition_sglang.render),
        Exposition(
            "trtllm",
            "TensorRT-LLM (trtllm-serve)",
            exposition_trtllm.render,
            metrics_path="/prometheus/metrics",
            one_engine="trtllm-serve runs one executor and labels no rank",
        ),
        Exposition(
            "triton-trtllm",
            "TensorRT-LLM (Triton backend)",
            exposition_triton.render,
            one_engine="Triton's TensorRT-LLM backend reports one executor per model version",
            adapter="trtllm",
        ),
        Exposition(
            "llamacpp",
            "llama.cpp (llama-server)",
            exposition_llamacpp.render,
            one_engine="a llama.cpp server is one engine (its metrics have no labels)",
            extra_path="/slots",
            render_extra=exposition_llamacpp.render_slots,
        ),
    )
}


def by_name(name: str) -> Exposition:
    try:
        return EXPOSITIONS[name]
    except KeyError:
        raise ValueError(f"engine: {name!r} is not one of {', '.join(EXPOSITIONS)}") from None
