"""Scenarios as data: engine flags, workload, and phases that switch them over time.

A scenario is a JSON document (the presets live in ``kvwatch/scenarios/*.json``)::

    {
      "name": "kv_cache",
      "description": "...",
      "sources": ["..."],                # where calibrated figures come from (optional)
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

Unknown keys are errors, so a typo in a user's ``--scenario-file`` is reported, not ignored.  The
pydantic models below are both the validation (strict: ``true`` is not 1, ``4.0`` is not an integer)
and the objects the simulator runs; a bad document raises :class:`ScenarioError` with one line that
names the first bad field by its path, e.g. ``phases[2].workload.rate: ...``.
"""

from __future__ import annotations

import copy
import json
import math
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

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


class _Model(BaseModel):
    # strict: a JSON true is not the number 1, 4.0 is not an integer, "3" is not a number.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


# --------------------------------------------------------------------------- distributions


class _Dist(_Model):
    def sample(self, rng) -> int:
        """A token length >= 1, clamped to [min, max] where the distribution has them."""
        v, lo, hi = self._draw(rng), getattr(self, "min", None), getattr(self, "max", None)
        v = v if lo is None else max(v, lo)
        v = v if hi is None else min(v, hi)
        return max(1, int(round(v)))

    def shrink(self, by: int):
        """The random part of a prompt whose first ``by`` tokens became a shared prefix."""
        keys = [k for k in ("value", "mean", "min", "max") if getattr(self, k, None) is not None]
        return self.model_copy(update={k: max(1.0, getattr(self, k) - by) for k in keys})

    def _draw(self, rng) -> float:
        raise NotImplementedError  # each distribution draws its own way


class Fixed(_Dist):
    dist: Literal["fixed"] = "fixed"
    value: float = Field(ge=1)

    @property
    def expected(self) -> float:
        return self.value

    def _draw(self, rng) -> float:
        return self.value


class _Bounded(_Dist):
    min: float | None = None
    max: float | None = None

    @model_validator(mode="after")
    def _ordered(self):
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError("min > max")
        return self


class Uniform(_Bounded):
    dist: Literal["uniform"] = "uniform"
    min: float = Field(ge=1)
    max: float = Field(ge=1)

    @property
    def expected(self) -> float:
        return (self.min + self.max) / 2.0

    def _draw(self, rng) -> float:
        return rng.uniform(self.min, self.max)


class Normal(_Bounded):
    dist: Literal["normal"] = "normal"
    mean: float = Field(ge=1)
    std: float = Field(ge=0)

    @property
    def expected(self) -> float:
        return self.mean

    def _draw(self, rng) -> float:
        return rng.gauss(self.mean, self.std)


class Lognormal(_Bounded):
    dist: Literal["lognormal"] = "lognormal"
    mean: float = Field(ge=1)  # the mean of the distribution itself
    sigma: float = Field(ge=0)  # of the underlying normal

    @property
    def expected(self) -> float:
        return self.mean

    def _draw(self, rng) -> float:
        return rng.lognormvariate(math.log(self.mean) - self.sigma * self.sigma / 2.0, self.sigma)


def _dist_kind(v: Any) -> str | None:
    """Which branch of :data:`Dist` validates ``v``: its ``dist`` key, ``number`` for a bare number."""
    if isinstance(v, dict):
        kind = v.get("dist", "fixed")
        return kind if isinstance(kind, str) else None
    if isinstance(v, (int, float)):  # bools too: the number branch rejects them
        return "number"
    return getattr(v, "dist", None)  # an already validated distribution


# A token-length distribution: a number (fixed) or {"dist": ..., ...}; ``sample(rng)`` is an int >= 1.
if TYPE_CHECKING:  # what a validated field holds: the number branch's AfterValidator makes it a Fixed
    Dist = Fixed | Uniform | Normal | Lognormal
else:
    Dist = Annotated[
        Annotated[Fixed, Tag("fixed")]
        | Annotated[Uniform, Tag("uniform")]
        | Annotated[Normal, Tag("normal")]
        | Annotated[Lognormal, Tag("lognormal")]
        | Annotated[float, Field(ge=1), AfterValidator(lambda v: Fixed(value=v)), Tag("number")],
        Discriminator(
            _dist_kind,
            custom_error_type="dist",
            custom_error_message="expected a number or a distribution (dist: fixed, uniform, normal, lognormal)",
        ),
    ]
_DIST_FIELDS = ("prompt_tokens", "output_tokens")


# --------------------------------------------------------------------------- engine


class StepTime(_Model):
    """Duration of one engine step: ``base + per_token*tokens + per_seq*seqs + per_context_token*ctx``.

    ``tokens`` are the tokens scheduled in the step (prefill chunks + one per decode), ``seqs`` the
    requests in the batch, ``ctx`` the tokens already in their KV cache (attention reads).  ``jitter``
    is the sigma of a log-normal factor on each step (seeded).  The defaults were fitted to the real
    vLLM 0.32 CPU captures in tests/fixtures/vllm-0.32.0-cpu (~3.3 ms per step plus ~61 us per token:
    ~230 steps/s at 10 tokens per step, ~52 steps/s at 256).
    """

    base_s: float = Field(0.0033, ge=0)
    per_token_s: float = Field(0.000061, ge=0)
    per_seq_s: float = Field(0.0, ge=0)
    per_context_token_s: float = Field(0.0, ge=0)
    jitter: float = Field(0.1, ge=0)

    @model_validator(mode="after")
    def _takes_time(self):
        if self.base_s + self.per_token_s + self.per_seq_s <= 0:
            raise ValueError("a step must take some time (base_s, per_token_s or per_seq_s > 0)")
        return self


class EngineConfig(_Model):
    model_config = ConfigDict(protected_namespaces=())  # model_name is vLLM's word, not pydantic's

    model_name: str = Field("tiny-llama-dummy", min_length=1)
    block_size: int = Field(32, ge=1)
    num_gpu_blocks: int = Field(512, ge=2)
    max_model_len: int = Field(4096, ge=1)
    max_num_seqs: int = Field(256, ge=1)
    max_num_batched_tokens: int = Field(4096, ge=1)
    enable_prefix_caching: bool = True
    kv_bytes_per_token: int = Field(4096, ge=1)
    gpu_memory_utilization: float = Field(0.92, gt=0, le=1)
    cache_dtype: str = Field("auto", min_length=1)
    max_loras: int = Field(0, ge=0)
    step_time: StepTime = StepTime()

    @property
    def usable_blocks(self) -> int:
        """vLLM reserves one block (the null block); usage is reported over the rest."""
        return self.num_gpu_blocks - 1

    @property
    def kv_cache_size_tokens(self) -> int:
        return self.num_gpu_blocks * self.block_size

    @model_validator(mode="after")
    def _fits(self):
        if self.max_model_len > self.usable_blocks * self.block_size:
            raise ValueError(
                f"max_model_len {self.max_model_len} does not fit in the KV cache "
                f"({self.usable_blocks} usable blocks x {self.block_size} tokens); vLLM would refuse to start"
            )
        return self


_RUNTIME_ENGINE_KEYS = ("max_num_seqs", "max_num_batched_tokens", "max_loras", "step_time")


# --------------------------------------------------------------------------- workload


class Workload(_Model):
    rate: float = Field(0.0, ge=0)
    burst: int = Field(0, ge=0)
    max_outstanding: int | None = Field(None, ge=1)
    prompt_tokens: Dist = Fixed(value=256.0)
    output_tokens: Dist = Fixed(value=128.0)
    ignore_eos: bool = True
    n: int = Field(1, ge=1)
    prefix_tokens: int = Field(0, ge=0)
    prefix_groups: int = Field(1, ge=1)
    lora_adapters: tuple[Annotated[str, Field(min_length=1)], ...] = Field((), strict=False)  # a JSON list
    lora_fraction: float = Field(0.0, ge=0, le=1)
    # Only while a layer of the document is validated: _workload turns it into prefix_tokens.
    shared_prefix_fraction: float | None = Field(None, ge=0, le=1)

    @field_validator("lora_adapters")
    @classmethod
    def _distinct(cls, v):
        if len(set(v)) != len(v):
            raise ValueError("duplicate adapter names")
        return v

    @field_validator("lora_fraction")
    @classmethod
    def _has_adapters(cls, v, info: ValidationInfo):
        if v > 0 and not info.data.get("lora_adapters"):
            raise ValueError("needs lora_adapters")
        return v


# --------------------------------------------------------------------------- phases / scenario


class Phase(_Model):
    name: str = Field(min_length=1)
    duration_s: float | None = Field(None, gt=0)
    workload: Workload
    engine: EngineConfig
    stalled: bool = False
    abort_waiting: bool = False

    @model_validator(mode="after")
    def _lora_fits(self):
        if self.workload.lora_adapters and self.workload.lora_fraction > 0 and self.engine.max_loras < 1:
            raise ValueError("the workload uses LoRA adapters but engine.max_loras is 0")
        return self


class Scenario(_Model):
    name: str = Field(min_length=1)
    description: str = ""
    # Where each calibrated figure comes from (the GPU presets cite model configs, logs and benchmarks).
    sources: tuple[Annotated[str, Field(min_length=1)], ...] = Field((), strict=False)  # a JSON list
    engines: int = Field(1, ge=1)
    loop: bool = False
    engine: EngineConfig
    workload: Workload  # every phase's defaults; each phase holds its own
    phases: tuple[Phase, ...] = Field(min_length=1, strict=False)  # a JSON list

    @model_validator(mode="after")
    def _phases_fit_together(self):
        # Checks across phases: pydantic would blame the whole document, so each message names its field.
        for i, p in enumerate(self.phases[:-1]):
            if p.duration_s is None:
                raise ValueError(f"phases[{i}].duration_s: only the last phase may run forever (null)")
        if any(p.workload.lora_fraction > 0 for p in self.phases) and any(p.engine.max_loras < 1 for p in self.phases):
            raise ValueError("engine.max_loras: must stay >= 1 in every phase when any phase sends LoRA requests")
        if self.loop and self.phases[-1].duration_s is None:
            raise ValueError("loop: every phase needs a duration_s when the scenario loops")
        return self

    def with_engines(self, n: int) -> Scenario:
        if n < 1:
            raise ScenarioError("engines: must be >= 1")
        return self.model_copy(update={"engines": n})

    @property
    def cycle_s(self) -> float | None:
        if any(p.duration_s is None for p in self.phases):
            return None
        return sum(p.duration_s for p in self.phases)  # type: ignore[misc]


# --------------------------------------------------------------------------- parsing

_M = TypeVar("_M", bound=_Model)

# pydantic's wording where it speaks Python (classes, tuples) to someone editing JSON
_PLAIN = {
    "extra_forbidden": "unknown key",
    "model_type": "expected an object",
    "tuple_type": "expected a list",
    "too_short": "must not be empty",
}


def _check(model: type[_M], data: Any, where: str) -> _M:
    """``model.model_validate(data)``, or a one-line ScenarioError: the first bad field's path and why."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        path = where
        for prev, key in zip((None, *err["loc"]), err["loc"], strict=False):
            if prev in _DIST_FIELDS:
                continue  # the branch of the Dist union pydantic took, not a key of the document
            path += f"[{key}]" if isinstance(key, int) else f".{key}"
        msg = _PLAIN.get(err["type"], err["msg"].removeprefix("Value error, "))
        raise ScenarioError(f"{path.lstrip('.')}: {msg}" if path else msg) from None


def _over(base: _M, raw: Any, where: str) -> _M:
    """``raw``, one layer of the document, validated over ``base``: the keys it leaves out keep base's values."""
    return _check(type(base), {**dict(base), **raw} if isinstance(raw, dict) else raw, where)


def _engine(base: EngineConfig, raw: Any, where: str, runtime_only: bool = False) -> EngineConfig:
    if isinstance(raw, dict):
        frozen = sorted(set(raw) - set(_RUNTIME_ENGINE_KEYS))
        if runtime_only and frozen:  # the rest are server flags: a restart, not a phase
            raise ScenarioError(f"{where}.{frozen[0]}: a phase may only change {', '.join(_RUNTIME_ENGINE_KEYS)}")
        if isinstance(raw.get("step_time"), dict):  # step_time, too, is overridden key by key
            raw = {**raw, "step_time": {**dict(base.step_time), **raw["step_time"]}}
    return _over(base, raw, where)


def _workload(base: Workload, raw: Any, where: str) -> Workload:
    wl = _over(base, raw, where)
    if wl.shared_prefix_fraction is None:
        return wl
    if "prefix_tokens" in raw:
        raise ScenarioError(f"{where}: give prefix_tokens or shared_prefix_fraction, not both")
    # That share of this layer's mean prompt becomes the shared prefix; the rest stays random.
    pre = int(round(wl.shared_prefix_fraction * wl.prompt_tokens.expected))
    return wl.model_copy(
        update={"prefix_tokens": pre, "prompt_tokens": wl.prompt_tokens.shrink(pre), "shared_prefix_fraction": None}
    )


def _phase(raw: Any, i: int, engine: EngineConfig, workload: Workload) -> Phase:
    where = f"phases[{i}]"
    if isinstance(raw, dict):
        raw = {
            "name": f"phase{i}",
            **raw,
            "workload": _workload(workload, raw.get("workload", {}), f"{where}.workload"),
            "engine": _engine(engine, raw.get("engine", {}), f"{where}.engine", runtime_only=True),
        }
    return _check(Phase, raw, where)


def parse_scenario(doc: Any, default_name: str = "custom") -> Scenario:
    """Build a :class:`Scenario` from a decoded JSON document; raise :class:`ScenarioError`."""
    if not isinstance(doc, dict):
        raise ScenarioError("scenario: expected a JSON object")
    doc = {"name": default_name, **doc}
    engine = _engine(EngineConfig(), doc.get("engine", {}), "engine")
    workload = _workload(Workload(), doc.get("workload", {}), "workload")
    phases = doc.get("phases")
    if phases is None:  # one phase named after the scenario (a bad name is reported as name's)
        phases = [{"name": doc["name"]} if isinstance(doc["name"], str) and doc["name"] else {}]
    if isinstance(phases, list):
        phases = [_phase(p, i, engine, workload) for i, p in enumerate(phases)]
    return _check(Scenario, {**doc, "engine": engine, "workload": workload, "phases": phases}, "")


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
