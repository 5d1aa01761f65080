"""The vLLM 0.33 fixtures, written at test time by ``tests/fixtures/vllm-0.33/make.py`` from the real 0.32
captures (deterministic, ~300 bodies: 12 MB that need not be committed). ``fixtures()`` is the folder holding
``text/<scenario>/`` and ``openmetrics/<scenario>/``, written once per process."""

from __future__ import annotations

import atexit
import functools
import importlib.util
import shutil
import tempfile
from pathlib import Path
from types import ModuleType

SOURCE = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.33"

__all__ = ["SOURCE", "fixtures", "make"]


@functools.cache
def make() -> ModuleType:
    spec = importlib.util.spec_from_file_location("v033_make", SOURCE / "make.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@functools.cache
def fixtures() -> Path:
    out = Path(tempfile.mkdtemp(prefix="kvwatch-v033-"))
    atexit.register(shutil.rmtree, out, True)
    make().write(out)
    return out
