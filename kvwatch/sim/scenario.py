"""Scenarios as data: engine flags, workload, and phases that switch them over time.

A scenario is a JSON document (the presets live in ``kvwatch/scenarios/*.json``)::

    {
      "name": "kv_cache",
      "description": "...",
      "engines": 1,                      # data-parallel engines (``--engines`` overrides)
      "loop": false,                     # restart the phase list after the last phase
      "engine": {                        # vLLM server flags and the step-time model
        "model_name": "tiny-llama-dummy",
        "block_size": 32, "num_gpu_blocks": 64, "max_model_len": 1024,
        "max_num_seqs": 16, "max_num_batched_tokens": 4096,
        "enable_prefix_caching": true, "kv_bytes_per_token": 4096,
        "max_loras": 0,
        "step_time": {"base_s": 0.0033, "per_token_s": 6.1e-05, "per_seq_s": 0.0,
                      "per_context_token_s": 0.0, "jitter": 0.1}
      },
      "workload": {                      # defaults for every phase's workload
        "rate": 6.0,                     # Poisson arrivals per second (all engines together)
        "burst": 60,                     # requests sent at once when the phase starts
        "max_outstanding": 100,          # client cap on requests in flight (null = none)
        "prompt_tokens": 250,            # a number, or {"dist": "uniform", "min": .., "max": ..},
        "output_tokens": 250,            #   {"dist": "normal", "mean": .., "std": ..[, "min", "max"]},
                                         #   {"dist": "lognormal", "mean": .., "sigma": ..[, "min", "max"]}
        "ignore_eos": true,              # finish on max_tokens ("length") instead of "stop"
        "n": 1,                          # parallel samples per request (each is an engine request)
        "prefix_tokens": 0,              # shared prefix prepended to every prompt (prefix caching)
        "shared_prefix_fraction": 0.0,   # or: that share of the mean prompt is a shared prefix
        "prefix_groups": 1,              # how many distinct shared prefixes
        "lora_adapters": [],             # adapter names ...
        "lora_fraction": 0.0             # ... and the share of requests that use one
      },
      "phases": [
        {"name": "kv_cache", "duration_s": null,        # null = until the end
         "workload": {...},              # overrides of the workload above
         "engine": {"max_num_seqs": 32}, # overrides of runtime flags (max_num_seqs,
                                         #   max_num_batched_tokens, max_loras, step_time)
         "stalled": false,               # the engine stops stepping (requests stay put)
         "abort_waiting": false}         # clients abort every queued request when the phase starts
      ]
    }

Unknown keys are errors, so a typo in a user's ``--scenario-file`` is reported, not ignored.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

__all__ = [
    "Dist",
    "EngineConfig",
    "Phase",
    "Scenario",
    "ScenarioError",
    "StepTime",
    "Workload",
    "list_presets",
    "load_scenario",
    "parse_scenario",
]


class ScenarioError(ValueError):
    """A scenario file or preset is invalid; the message names the offending field."""


# --------------------------------------------------------------------------- distributions


@dataclass(frozen=True)
class Dist:
    """A token-length distribution; ``sample(rng)`` returns an int >= 1."""

    kind: str = "fixed"  # fixed | uniform | normal | lognormal
    value: float = 1.0  # fixed
    min: float | None = None
    max: float | None = None
    mean: float = 0.0  # normal / lognormal: the mean of the distribution itself
    std: float = 0.0  # normal
    sigma: float = 0.0  # lognormal: sigma of the underlying normal

    @property
    def expected(self) -> float:
        if self.kind == "fixed":
            return self.value
        if self.kind == "uniform":
            return ((self.min or 1) + (self.max or 1)) / 2.0
        return self.mean

    def sample(self, rng) -> int:
        k = self.kind
        if k == "fixed":
            v = self.value
        elif k == "uniform":
            v = rng.uniform(self.min, self.max)  # type: ignore[arg-type]
        elif k == "normal":
            v = rng.gauss(self.mean, self.std)
        else:  # lognormal with the given arithmetic mean
            mu = math.log(self.mean) - self.sigma * self.sigma / 2.0
            v = rng.lognormvariate(mu, self.sigma)
        if self.min is not None and v < self.min:
            v = self.min
        if self.max is not None and v > self.max:
            v = self.max
        return max(1, int(round(v)))


def _parse_dist(raw: Any, where: str) -> Dist:
    if isinstance(raw, bool):
        raise ScenarioError(f"{where}: expected a number or a distribution object")
    if isinstance(raw, (int, float)):
        if raw < 1:
            raise ScenarioError(f"{where}: must be >= 1")
        return Dist(kind="fixed", value=float(raw))
    if not isinstance(raw, dict):
        raise ScenarioError(f"{where}: expected a number or a distribution object")
    raw = dict(raw)
    kind = raw.pop("dist", "fixed")
    allowed = {
        "fixed": {"value"},
        "uniform": {"min", "max"},
        "normal": {"mean", "std", "min", "max"},
        "lognormal": {"mean", "sigma", "min", "max"},
    }
    if kind not in allowed:
        raise ScenarioError(f"{where}.dist: unknown distribution {kind!r} (fixed, uniform, normal, lognormal)")
    extra = set(raw) - allowed[kind]
    if extra:
        raise ScenarioError(f"{where}: unknown key(s) for {kind}: {', '.join(sorted(extra))}")
    try:
        vals = {k: float(v) for k, v in raw.items()}
    except (TypeError, ValueError):
        raise ScenarioError(f"{where}: values must be numbers") from None
    if kind == "fixed":
        if vals.get("value", 0) < 1:
            raise ScenarioError(f"{where}.value: must be >= 1")
    elif kind == "uniform":
        if "min" not in vals or "max" not in vals or not (1 <= vals["min"] <= vals["max"]):
            raise ScenarioError(f"{where}: uniform needs 1 <= min <= max")
    elif kind == "normal":
        if vals.get("mean", 0) < 1 or vals.get("std", -1) < 0:
            raise ScenarioError(f"{where}: normal needs mean >= 1 and std >= 0")
    else:
        if vals.get("mean", 0) < 1 or vals.get("sigma", -1) < 0:
            raise ScenarioError(f"{where}: lognormal needs mean >= 1 and sigma >= 0")
    if "min" in vals and "max" in vals and vals["min"] > vals["max"]:
        raise ScenarioError(f"{where}: min > max")
    return Dist(kind=kind, **vals)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- engine


@dataclass(frozen=True)
class StepTime:
    """Duration of one engine step: ``base + per_token*tokens + per_seq*seqs + per_context_token*ctx``.

    ``tokens`` are the tokens scheduled in the step (prefill chunks + one per decode), ``seqs`` the
    requests in the batch, ``ctx`` the tokens already in their KV cache (attention reads).  ``jitter``
    is the sigma of a log-normal factor on each step (seeded).  The defaults were fitted to the real
    vLLM 0.32 CPU captures in tests/fixtures/vllm-0.32.0-cpu (~3.3 ms per step plus ~61 us per token:
    ~230 steps/s at 10 tokens per step, ~52 steps/s at 256).
    """

    base_s: float = 0.0033
    per_token_s: float = 0.000061
    per_seq_s: float = 0.0
    per_context_token_s: float = 0.0
    jitter: float = 0.1


@dataclass(frozen=True)
class EngineConfig:
    model_name: str = "tiny-llama-dummy"
    block_size: int = 32
    num_gpu_blocks: int = 512
    max_model_len: int = 4096
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 4096
    enable_prefix_caching: bool = True
    kv_bytes_per_token: int = 4096
    gpu_memory_utilization: float = 0.92
    cache_dtype: str = "auto"
    max_loras: int = 0
    step_time: StepTime = field(default_factory=StepTime)

    @property
    def usable_blocks(self) -> int:
        """vLLM reserves one block (the null block); usage is reported over the rest."""
        return self.num_gpu_blocks - 1

    @property
    def kv_cache_size_tokens(self) -> int:
        return self.num_gpu_blocks * self.block_size


_ENGINE_KEYS = {f for f in EngineConfig.__dataclass_fields__}
_RUNTIME_ENGINE_KEYS = {"max_num_seqs", "max_num_batched_tokens", "max_loras", "step_time"}
_STEP_KEYS = {f for f in StepTime.__dataclass_fields__}


def _parse_step_time(raw: Any, base: StepTime, where: str) -> StepTime:
    if not isinstance(raw, dict):
        raise ScenarioError(f"{where}: expected an object")
    extra = set(raw) - _STEP_KEYS
    if extra:
        raise ScenarioError(f"{where}: unknown key(s): {', '.join(sorted(extra))}")
    vals = {}
    for k, v in raw.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
            raise ScenarioError(f"{where}.{k}: must be a number >= 0")
        vals[k] = float(v)
    st = replace(base, **vals)
    if st.base_s + st.per_token_s + st.per_seq_s <= 0:
        raise ScenarioError(f"{where}: a step must take some time (base_s, per_token_s or per_seq_s > 0)")
    return st


def _parse_engine(raw: Any, base: EngineConfig, where: str, runtime_only: bool = False) -> EngineConfig:
    if not isinstance(raw, dict):
        raise ScenarioError(f"{where}: expected an object")
    allowed = _RUNTIME_ENGINE_KEYS if runtime_only else _ENGINE_KEYS
    extra = set(raw) - allowed
    if extra:
        hint = " (a phase may only change max_num_seqs, max_num_batched_tokens, max_loras, step_time)" if runtime_only else ""
        raise ScenarioError(f"{where}: unknown key(s): {', '.join(sorted(extra))}{hint}")
    vals: dict[str, Any] = {}
    for k, v in raw.items():
        if k == "step_time":
            vals[k] = _parse_step_time(v, base.step_time, f"{where}.step_time")
        elif k in ("model_name", "cache_dtype"):
            if not isinstance(v, str) or not v:
                raise ScenarioError(f"{where}.{k}: must be a non-empty string")
            vals[k] = v
        elif k == "enable_prefix_caching":
            if not isinstance(v, bool):
                raise ScenarioError(f"{where}.{k}: must be true or false")
            vals[k] = v
        elif k == "gpu_memory_utilization":
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1:
                raise ScenarioError(f"{where}.{k}: must be in (0, 1]")
            vals[k] = float(v)
        else:
            if isinstance(v, bool) or not isinstance(v, int):
                raise ScenarioError(f"{where}.{k}: must be an integer")
            minimum = 0 if k == "max_loras" else 1
            if k == "num_gpu_blocks":
                minimum = 2
            if v < minimum:
                raise ScenarioError(f"{where}.{k}: must be >= {minimum}")
            vals[k] = v
    cfg = replace(base, **vals)
    if cfg.max_model_len > cfg.usable_blocks * cfg.block_size:
        raise ScenarioError(
            f"{where}: max_model_len {cfg.max_model_len} does not fit in the KV cache "
            f"({cfg.usable_blocks} usable blocks x {cfg.block_size} tokens); vLLM would refuse to start"
        )
    return cfg


# --------------------------------------------------------------------------- workload


@dataclass(frozen=True)
class Workload:
    rate: float = 0.0
    burst: int = 0
    max_outstanding: int | None = None
    prompt_tokens: Dist = field(default_factory=lambda: Dist(value=256.0))
    output_tokens: Dist = field(default_factory=lambda: Dist(value=128.0))
    ignore_eos: bool = True
    n: int = 1
    prefix_tokens: int = 0
    prefix_groups: int = 1
    lora_adapters: tuple[str, ...] = ()
    lora_fraction: float = 0.0


_WORKLOAD_KEYS = {f for f in Workload.__dataclass_fields__} | {"shared_prefix_fraction"}


def _parse_workload(raw: Any, base: Workload, where: str) -> Workload:
    if not isinstance(raw, dict):
        raise ScenarioError(f"{where}: expected an object")
    extra = set(raw) - _WORKLOAD_KEYS
    if extra:
        raise ScenarioError(f"{where}: unknown key(s): {', '.join(sorted(extra))}")
    vals: dict[str, Any] = {}
    for k, v in raw.items():
        if k in ("prompt_tokens", "output_tokens"):
            vals[k] = _parse_dist(v, f"{where}.{k}")
        elif k in ("rate", "lora_fraction", "shared_prefix_fraction"):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                raise ScenarioError(f"{where}.{k}: must be a number >= 0")
            if k != "rate" and v > 1:
                raise ScenarioError(f"{where}.{k}: must be between 0 and 1")
            vals[k] = float(v)
        elif k == "ignore_eos":
            if not isinstance(v, bool):
                raise ScenarioError(f"{where}.{k}: must be true or false")
            vals[k] = v
        elif k == "lora_adapters":
            if not isinstance(v, list) or not all(isinstance(a, str) and a for a in v):
                raise ScenarioError(f"{where}.{k}: must be a list of adapter names")
            if len(set(v)) != len(v):
                raise ScenarioError(f"{where}.{k}: duplicate adapter names")
            vals[k] = tuple(v)
        elif k == "max_outstanding":
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ScenarioError(f"{where}.{k}: must be an integer >= 1 or null")
            vals[k] = v
        else:  # burst, n, prefix_tokens, prefix_groups
            if isinstance(v, bool) or not isinstance(v, int):
                raise ScenarioError(f"{where}.{k}: must be an integer")
            minimum = 1 if k in ("n", "prefix_groups") else 0
            if v < minimum:
                raise ScenarioError(f"{where}.{k}: must be >= {minimum}")
            vals[k] = v
    frac = vals.pop("shared_prefix_fraction", None)
    wl = replace(base, **vals)
    if frac is not None:
        if "prefix_tokens" in raw:
            raise ScenarioError(f"{where}: give prefix_tokens or shared_prefix_fraction, not both")
        # A fraction of the (mean) prompt is the shared prefix; the rest stays random.
        mean_prompt = wl.prompt_tokens.expected
        pre = int(round(frac * mean_prompt))
        rest = _shrink_dist(wl.prompt_tokens, pre)
        wl = replace(wl, prefix_tokens=pre, prompt_tokens=rest)
    if wl.lora_fraction > 0 and not wl.lora_adapters:
        raise ScenarioError(f"{where}.lora_fraction: needs lora_adapters")
    return wl


def _shrink_dist(d: Dist, by: int) -> Dist:
    """The random part of a prompt whose first ``by`` tokens became a shared prefix."""

    def sub(x):
        return None if x is None else max(1.0, x - by)

    if d.kind == "fixed":
        return replace(d, value=max(1.0, d.value - by))
    if d.kind == "uniform":
        return replace(d, min=sub(d.min), max=sub(d.max))
    return replace(d, mean=max(1.0, d.mean - by), min=sub(d.min), max=sub(d.max))


# --------------------------------------------------------------------------- phases / scenario


@dataclass(frozen=True)
class Phase:
    name: str
    duration_s: float | None
    workload: Workload
    engine: EngineConfig
    stalled: bool = False
    abort_waiting: bool = False


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    engines: int
    engine: EngineConfig
    phases: tuple[Phase, ...]
    loop: bool = False

    def with_engines(self, n: int) -> "Scenario":
        if n < 1:
            raise ScenarioError("engines: must be >= 1")
        return replace(self, engines=n)

    @property
    def cycle_s(self) -> float | None:
        if any(p.duration_s is None for p in self.phases):
            return None
        return sum(p.duration_s for p in self.phases)  # type: ignore[misc]


_SCENARIO_KEYS = {"name", "description", "engines", "engine", "workload", "phases", "loop"}
_PHASE_KEYS = {"name", "duration_s", "workload", "engine", "stalled", "abort_waiting"}


def parse_scenario(doc: Any, default_name: str = "custom") -> Scenario:
    """Build a :class:`Scenario` from a decoded JSON document; raise :class:`ScenarioError`."""
    if not isinstance(doc, dict):
        raise ScenarioError("scenario: expected a JSON object")
    extra = set(doc) - _SCENARIO_KEYS
    if extra:
        raise ScenarioError(f"scenario: unknown key(s): {', '.join(sorted(extra))}")
    name = doc.get("name", default_name)
    if not isinstance(name, str) or not name:
        raise ScenarioError("name: must be a non-empty string")
    desc = doc.get("description", "")
    if not isinstance(desc, str):
        raise ScenarioError("description: must be a string")
    engines = doc.get("engines", 1)
    if isinstance(engines, bool) or not isinstance(engines, int) or engines < 1:
        raise ScenarioError("engines: must be an integer >= 1")
    loop = doc.get("loop", False)
    if not isinstance(loop, bool):
        raise ScenarioError("loop: must be true or false")
    engine = _parse_engine(doc.get("engine", {}), EngineConfig(), "engine")
    base_wl = _parse_workload(doc.get("workload", {}), Workload(), "workload")
    raw_phases = doc.get("phases")
    if raw_phases is None:
        raw_phases = [{"name": name}]
    if not isinstance(raw_phases, list) or not raw_phases:
        raise ScenarioError("phases: must be a non-empty list")
    phases = []
    for i, rp in enumerate(raw_phases):
        where = f"phases[{i}]"
        if not isinstance(rp, dict):
            raise ScenarioError(f"{where}: expected an object")
        extra = set(rp) - _PHASE_KEYS
        if extra:
            raise ScenarioError(f"{where}: unknown key(s): {', '.join(sorted(extra))}")
        pname = rp.get("name", f"phase{i}")
        if not isinstance(pname, str) or not pname:
            raise ScenarioError(f"{where}.name: must be a non-empty string")
        dur = rp.get("duration_s")
        if dur is not None and (isinstance(dur, bool) or not isinstance(dur, (int, float)) or dur <= 0):
            raise ScenarioError(f"{where}.duration_s: must be a number > 0 or null")
        if dur is None and i != len(raw_phases) - 1:
            raise ScenarioError(f"{where}.duration_s: only the last phase may run forever (null)")
        wl = _parse_workload(rp.get("workload", {}), base_wl, f"{where}.workload")
        eng = _parse_engine(rp.get("engine", {}), engine, f"{where}.engine", runtime_only=True)
        for flag in ("stalled", "abort_waiting"):
            if not isinstance(rp.get(flag, False), bool):
                raise ScenarioError(f"{where}.{flag}: must be true or false")
        if wl.lora_adapters and wl.lora_fraction > 0 and eng.max_loras < 1:
            raise ScenarioError(f"{where}: the workload uses LoRA adapters but engine.max_loras is 0")
        phases.append(
            Phase(
                name=pname,
                duration_s=None if dur is None else float(dur),
                workload=wl,
                engine=eng,
                stalled=rp.get("stalled", False),
                abort_waiting=rp.get("abort_waiting", False),
            )
        )
    if any(p.workload.lora_fraction > 0 for p in phases) and any(p.engine.max_loras < 1 for p in phases):
        raise ScenarioError("engine.max_loras: must stay >= 1 in every phase when any phase sends LoRA requests")
    if loop and phases[-1].duration_s is None:
        raise ScenarioError("loop: every phase needs a duration_s when the scenario loops")
    return Scenario(name=name, description=desc, engines=engines, engine=engine, phases=tuple(phases), loop=loop)


def list_presets() -> list[str]:
    """Names of the packaged presets (``kvwatch/scenarios/*.json``)."""
    pkg = resources.files("kvwatch") / "scenarios"
    return sorted(p.name[:-5] for p in pkg.iterdir() if p.name.endswith(".json"))


def load_preset_doc(name: str) -> dict:
    pkg = resources.files("kvwatch") / "scenarios"
    res = pkg / f"{name}.json"
    if not name.replace("_", "").replace("-", "").isalnum() or not res.is_file():
        raise ScenarioError(f"scenario: unknown preset {name!r} (one of: {', '.join(list_presets())})")
    return json.loads(res.read_text(encoding="utf-8"))


def load_scenario(name: str | None = None, path: str | Path | None = None, overrides: dict | None = None) -> Scenario:
    """Load a packaged preset by ``name`` or a user's JSON file by ``path``.

    ``overrides`` (a dict shaped like the document) is merged on top before parsing — handy in
    tests, e.g. ``{"engine": {"num_gpu_blocks": 4096}}``.
    """
    if path is not None:
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as e:
            raise ScenarioError(f"scenario-file: cannot read {p}: {e.strerror or e}") from None
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as e:
            raise ScenarioError(f"scenario-file: {p} is not valid JSON: {e}") from None
        default = p.stem
    else:
        doc = load_preset_doc(name or "tour")
        default = name or "tour"
    if overrides:
        doc = _deep_merge(copy.deepcopy(doc), overrides)
    return parse_scenario(doc, default_name=default)


def _deep_merge(a: dict, b: dict) -> dict:
    for k, v in b.items():
        if isinstance(v, dict) and isinstance(a.get(k), dict):
            _deep_merge(a[k], v)
        else:
            a[k] = copy.deepcopy(v)
    return a
