"""`kvwatch demo` is the README's "run it" command: it must show kvwatch doing its whole job."""

import re
import subprocess
import sys

import pytest

from tests.helpers.ports import free_port

# Both start `python -m kvwatch demo` (the first runs it for 20 s): outside the fast lane.
pytestmark = pytest.mark.slow


def test_demo_plain_shows_at_least_three_bottlenecks():
    port = free_port()
    r = subprocess.run(
        [sys.executable, "-m", "kvwatch", "demo", "--duration", "20", "--plain", "--listen", f"127.0.0.1:{port}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    # The status page's URL comes first: the one thing to open.
    assert r.stdout.splitlines()[0] == f"kvwatch demo: open http://127.0.0.1:{port}/ in a browser: the live status page"
    assert f"http://127.0.0.1:{port}/metrics" in r.stdout and "/api/v1/diagnosis" in r.stdout
    states = set(re.findall(r"engine \d+: (\w+)", r.stdout))
    assert len(states) >= 3, r.stdout
    assert "kv_cache" in states, r.stdout
    assert "-> fp8_kv_cache" in r.stdout  # the fix is shown, not just the state


def test_demo_bad_setting_is_one_line_exit_2():
    r = subprocess.run(
        [sys.executable, "-m", "kvwatch", "demo", "--scenario", "nope", "--duration", "1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
