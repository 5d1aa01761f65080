#!/usr/bin/env bash
# The real-vLLM e2e lane: set up (or reuse) the vLLM CPU venv, then run the e2e tests with the project venv.
# Fails loudly (non-zero) if vLLM cannot be installed or started — never a silent skip.
set -euo pipefail
cd "$(dirname "$0")/.."

PROJECT_PY="${KVWATCH_PYTHON:-.venv/bin/python}"
start=$(date +%s)
echo "== e2e: vLLM environment"
if ! vllm_py="$(bash tests/e2e/setup_vllm.sh | tail -n 1)"; then
    echo "e2e: FAILED to set up the vLLM environment" >&2
    exit 1
fi
if [[ -n "${KVWATCH_VLLM_SETUP_LOG:-}" && -f "$KVWATCH_VLLM_SETUP_LOG" ]]; then
    echo "   (.ci/run started the install early; its log:)"
    sed 's/^/   | /' "$KVWATCH_VLLM_SETUP_LOG" | tail -n 40
fi
export KVWATCH_E2E_PYTHON="$vllm_py"
echo "   vLLM python: $KVWATCH_E2E_PYTHON (setup $(( $(date +%s) - start )) s)"

echo "== e2e: pytest -m e2e tests/e2e"
set +e
"$PROJECT_PY" -m pytest -m e2e tests/e2e -p no:cacheprovider -v -ra --no-skips --tb=short --durations=0 --durations-min=1 "$@"
rc=$?
set -e
echo "== e2e: exit $rc after $(( $(date +%s) - start )) s; artefacts in artifacts/e2e/"
if [[ $rc -eq 5 ]]; then
    echo "e2e: FAILED — no e2e test was collected" >&2
    exit 1
fi
exit $rc
