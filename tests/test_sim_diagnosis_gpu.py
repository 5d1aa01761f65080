"""The GPU-regime presets (kvwatch/scenarios/gpu_*.json), each diagnosed as named by a real ``kvwatch run`` over
HTTP in real time, as tests/test_sim_diagnosis.py does for the others: its own kvwatch process and event loop
(one module, one pytest-xdist worker), so neither group's simulators hold up the other's polls."""

from __future__ import annotations

import pytest

from tests.helpers.sim_judge import CASES
from tests.test_sim_diagnosis import Observation, assert_named, observe_and_print

pytestmark = pytest.mark.slow  # real time: one kvwatch process and nine simulators for ~40 s

GPU_PRESETS = [p for p in CASES if p.startswith("gpu_")]


@pytest.fixture(scope="module")
def observation(tmp_path_factory) -> Observation:
    return observe_and_print(tmp_path_factory, GPU_PRESETS)


@pytest.mark.parametrize("preset", GPU_PRESETS)
def test_gpu_preset_is_diagnosed_as_named(observation, preset):
    assert_named(observation, preset)
