# Developer and CI entry points. Set up once: `bash .ci/run` (everything), or `python3 -m venv .venv &&
# .venv/bin/pip install -e '.[test]' && bash .ci/install-tools.sh` (what the non-e2e tests need).
#
#   make test       the fast lane: pytest -q -n 2 (pyproject's addopts: not e2e, not slow)
#   make test-all   every test but the real-vLLM lane, slow ones included (WORKERS=3 pytest-xdist workers)
#   make ci         what .ci/run runs after installing: generated files, test-all, benchmark ratios, e2e
#   make e2e        the real-vLLM lane (bash .ci/e2e.sh; installs vLLM's CPU build on first use)
#   make bench      the benchmark (python -m bench; ARGS=--quick for a smoke run)
#   make generate   rewrite the generated dashboards, PrometheusRule, runbook links and docs tables
#   make lint       ruff check and ruff format --check of the whole tree; mypy of kvwatch, bench, grafana, docs, alerts
#   make screenshot rewrite docs/status-page.png, the README's picture (kvwatch demo in headless Chromium, ~1 min)
#
# ARGS is passed on to pytest / bench, e.g. `make test ARGS='-k parse -x'`.

PY ?= .venv/bin/python
ARGS ?=
# pytest-xdist workers for test-all: most of its time is real time spent waiting on Prometheus, Alertmanager and
# simulators, not CPU, so three workers on two cores cut it from ~11 to ~5 minutes. --dist loadfile keeps a
# module's tests (and its module-scoped servers) on one worker. WORKERS=0 runs it serially.
WORKERS ?= 3
PYTEST := $(PY) -m pytest
LINT_PATHS := .

# The steps share one machine (and the e2e lane wants all of it): never run them side by side under -j.
.NOTPARALLEL:
.PHONY: test test-all ci e2e bench bench-check generate check-generated lint screenshot

test:
	$(PYTEST) -q -n 2 $(ARGS)

# pytest exits 5 when it collects nothing: make fails on any non-zero status, but say why. -rs prints the reason of
# any skip; --no-skips (tests/conftest.py) fails every test that skips: all are required.
test-all:
	@echo "=== unit, integration and pipeline tests (all but e2e) ($$(date +%T))"
	@$(PYTEST) -q -rs --no-skips -p no:cacheprovider -m 'not e2e' -n $(WORKERS) --dist loadfile --durations=15 $(ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make: pytest collected no tests" >&2; fi; exit $$rc

# What CI runs (.ci/run, after its install steps).
ci: check-generated lint test-all bench-check e2e

check-generated:
	@echo "=== generated files are up to date ($$(date +%T))"
	$(PY) grafana/generate.py --check
	$(PY) alerts/generate.py --check
	$(PY) docs/generate.py --check

generate:
	$(PY) grafana/generate.py
	$(PY) alerts/generate.py
	$(PY) docs/generate.py

# The gates, each a goal with a shared machine's margin, and why: bench/__main__.py GATES.
bench-check:
	@echo "=== benchmark: cycle/parse-baseline <= 0.35 (goal 0.2, missed today: see bench/__main__.py GATES), each engine adapter/parse-baseline <= 0.25 (0.5 under 100 samples) and its cycle <= vLLM's, peak RSS of kvwatch run <= 68 MiB (goal 64), targets per core at 1 Hz >= 200 ($$(date +%T))"
	$(PY) -m bench --only cycle,engines,memory,fanin --check

bench:
	$(PY) -m bench $(ARGS)

e2e:
	@echo "=== e2e: a real vLLM server (CPU build) ($$(date +%T))"
	KVWATCH_PYTHON=$(PY) bash .ci/e2e.sh $(ARGS)

# All three run, so one report shows every finding; fails if any did.
lint:
	@rc=0; \
	echo "=== ruff check"; $(PY) -m ruff check $(LINT_PATHS) || rc=1; \
	echo "=== ruff format --check"; $(PY) -m ruff format --check $(LINT_PATHS) || rc=1; \
	echo "=== mypy (kvwatch/, bench/, grafana/, docs/; alerts/ apart)"; $(PY) -m mypy || rc=1; $(PY) -m mypy alerts || rc=1; \
	exit $$rc

# Not part of `generate`: a picture is never byte-identical twice, so no check can hold it. Run it when the page
# looks different (CONTRIBUTING.md, "The status page").
screenshot:
	$(PY) docs/screenshot.py
