"""Settings from flags and ``KVWATCH_*`` environment variables (flags win), validated up front.

A bad value must stop kvwatch with exit status 2 and one line that names the setting: ``ConfigError``
carries that line.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from kvwatch.catalog import Thresholds
from kvwatch.diagnose import Hints
from kvwatch.engines import AUTO
from kvwatch.engines import names as engine_names
from kvwatch.history import MAX_SAMPLES
from kvwatch.redact import redact_url

__all__ = ["ConfigError", "DEFAULT_LISTEN", "DEFAULT_PORT", "Settings", "check_target", "load_settings"]

DEFAULT_PORT = 9847
DEFAULT_LISTEN = f"0.0.0.0:{DEFAULT_PORT}"
LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("text", "json")
_DEFAULT = Thresholds()


class ConfigError(ValueError):
    """One line, naming the setting and what to fix."""


def check_target(url: str) -> None:
    """Raises ValueError (one line, the URL redacted) unless ``url`` is an http(s) URL: the caller names the
    setting or argument it came from."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"{redact_url(url)!r} is not an http(s) URL (e.g. http://127.0.0.1:8000/metrics)")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="KVWATCH_", extra="forbid", frozen=True)

    # NoDecode: the env var is a plain comma-separated list, not JSON.
    target: Annotated[list[str], NoDecode] = Field(default_factory=lambda: ["http://127.0.0.1:8000/metrics"])
    listen: str = DEFAULT_LISTEN
    interval: float = Field(1.0, gt=0, le=3600)
    timeout: float | None = Field(None, gt=0)  # default: 80 % of the interval
    window: float = Field(10.0, gt=0)
    stale_after: float = Field(5.0, gt=0)
    history: float = Field(900.0, gt=0, le=7 * 86400)  # seconds the status page charts (kvwatch.history)
    max_body_bytes: int = Field(16 * 1024 * 1024, gt=0)
    bearer_token_file: Path | None = None
    web_config_file: Path | None = None  # the exporter-toolkit's web config: TLS and basic auth (kvwatch.webconfig)
    tls_verify: bool = True
    max_num_seqs: int | None = Field(None, gt=0)
    max_num_batched_tokens: int | None = Field(None, gt=0)
    max_model_len: int | None = Field(None, gt=0)
    admission_stall_threshold: float = Field(_DEFAULT.admission_stall, gt=0, le=1)
    preemption_risk_threshold: float = Field(_DEFAULT.preemption_risk, gt=0, le=1)
    max_engines: int = Field(64, gt=0)
    engine: str = AUTO  # how the targets' metrics are read (kvwatch.engines); auto: recognised per target
    log_level: str = "info"
    log_format: str = "text"

    @field_validator("target", mode="before")
    @classmethod
    def _split_targets(cls, v):
        if isinstance(v, str):
            v = [t.strip() for t in v.split(",") if t.strip()]
        return v

    @field_validator("target")
    @classmethod
    def _check_targets(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("at least one target URL is required")
        for url in v:
            check_target(url)
        if len(set(v)) != len(v):
            raise ValueError("the same target is listed twice")
        if len({redact_url(u) for u in v}) != len(v):
            raise ValueError("two targets differ only in their credentials (their redacted labels would be equal)")
        return v

    @field_validator("listen")
    @classmethod
    def _check_listen(cls, v: str) -> str:
        host, sep, port = v.rpartition(":")
        if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ValueError(f"{v!r} is not HOST:PORT (e.g. 0.0.0.0:{DEFAULT_PORT})")
        return v

    @field_validator("engine")
    @classmethod
    def _check_engine(cls, v: str) -> str:
        choices = (AUTO, *engine_names())
        if v.lower() not in choices:
            raise ValueError(f"{v!r} is not one of {', '.join(choices)}")
        return v.lower()

    @field_validator("log_level")
    @classmethod
    def _check_level(cls, v: str) -> str:
        if v.lower() not in LOG_LEVELS:
            raise ValueError(f"{v!r} is not one of {', '.join(LOG_LEVELS)}")
        return v.lower()

    @field_validator("log_format")
    @classmethod
    def _check_format(cls, v: str) -> str:
        if v.lower() not in LOG_FORMATS:
            raise ValueError(f"{v!r} is not one of {', '.join(LOG_FORMATS)}")
        return v.lower()

    @field_validator("bearer_token_file", "web_config_file")
    @classmethod
    def _check_readable_file(cls, v: Path | None) -> Path | None:
        if v is not None and not v.is_file():
            raise ValueError(f"{str(v)!r} is not a readable file")
        return v

    @model_validator(mode="after")
    def _check_relations(self):
        if self.timeout is not None and self.timeout >= self.interval:
            raise ValueError(f"--timeout ({self.timeout:g}) must be shorter than --interval ({self.interval:g})")
        if self.preemption_risk_threshold < self.admission_stall_threshold:
            raise ValueError("--preemption-risk-threshold must be >= --admission-stall-threshold")
        if self.bearer_token_file is not None and any("@" in urlsplit(u).netloc for u in self.target):
            raise ValueError(
                "a target with user:password@ uses basic auth, which --bearer-token-file would "
                "override: give one of the two (as Prometheus does)"
            )
        if self.history_samples > MAX_SAMPLES:
            raise ValueError(
                f"--history ({self.history:g}) / --interval ({self.interval:g}) keeps more than {MAX_SAMPLES} "
                "samples per engine: lower --history or raise --interval"
            )
        if self.window < 2 * self.interval:
            raise ValueError(f"--window ({self.window:g}) must cover at least two --interval ({self.interval:g})")
        return self

    @property
    def stall_seconds(self) -> float:
        """No progress for this long with requests present is a stall: at least 3 scrapes, so one slow
        scrape is never mistaken for one."""
        return max(_DEFAULT.stall_seconds, 3 * self.interval)

    @property
    def hints(self) -> Hints:
        return Hints(self.max_num_seqs, self.max_num_batched_tokens, self.max_model_len)

    @property
    def thresholds(self) -> Thresholds:
        return Thresholds(
            admission_stall=self.admission_stall_threshold,
            preemption_risk=self.preemption_risk_threshold,
            stall_seconds=self.stall_seconds,
        )

    @property
    def history_samples(self) -> int:
        """Rows per ring of the status page's history: one scrape per interval at most, plus the first."""
        return math.ceil(self.history / self.interval) + 1

    @property
    def scrape_timeout(self) -> float:
        return self.timeout if self.timeout is not None else 0.8 * self.interval

    @property
    def listen_host(self) -> str:
        return self.listen.rpartition(":")[0].strip("[]") or "0.0.0.0"

    @property
    def listen_port(self) -> int:
        return int(self.listen.rpartition(":")[2])


def _one_line(err: ValidationError) -> str:
    e = err.errors()[0]
    loc = ".".join(str(x) for x in e.get("loc", ()) if not isinstance(x, int))
    msg = e.get("msg", "invalid").removeprefix("Value error, ")
    if loc:
        flag = "--" + loc.replace("_", "-")
        return f"invalid setting {flag} (env KVWATCH_{loc.upper()}): {msg}"
    return f"invalid setting {msg}"


def load_settings(**overrides) -> Settings:
    """Settings from the environment, with ``overrides`` (the flags given) on top."""
    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as err:
        raise ConfigError(_one_line(err)) from None
