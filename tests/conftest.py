"""Suite-wide set-up."""

from __future__ import annotations

import signal

import pytest

# A non-interactive shell starts a background job (`bash .ci/run &`, `nohup ... &`) with SIGINT ignored, the
# ignore is inherited across exec, and Python then installs no KeyboardInterrupt handler: every kvwatch child
# the tests start would ignore the Ctrl-C they send (ci1 here: `kvwatch logs --follow` sat out its 30 s after
# SIGINT). A handled signal is reset to the default on exec, so handling it here gives children a terminal's
# Ctrl-C again.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


# -- no silent skips ---------------------------------------------------------------------------------------------
# Every test in this suite is required: a missing tool, mount or server fails with the reason, never skips. A skip
# could only hide a regression (a preset never judged, a check never run), so `make test-all` and the e2e lane pass
# --no-skips, which turns any skip (a test's, a fixture's or a whole module's) into a failure that keeps its reason.
# A test that may rightly skip somewhere would have to say so here, with the reason; none does.
def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--no-skips", action="store_true", help="fail every test that skips (CI: all are required)")


def _fail_a_skip(config: pytest.Config, report: pytest.TestReport | pytest.CollectReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail") and config.getoption("--no-skips"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped, and this run allows no skip (--no-skips: every test is required): {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    _fail_a_skip(item.config, outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):
    outcome = yield
    _fail_a_skip(collector.config, outcome.get_result())
