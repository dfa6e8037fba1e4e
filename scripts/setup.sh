#!/usr/bin/env bash
# Create ./.venv and install kernelsynth with its dev extras. Idempotent. Shows pip's progress
# and stops at the first step that fails, with that step's exit status.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
START=$SECONDS

step() { printf '==> %s (%ds so far)\n' "$*" "$((SECONDS - START))"; }

# pip with its progress lines; only the "WARNING: Location" noise of editable installs is
# filtered out. grep's own status is ignored (it is 1 when every line was filtered); pip's is
# what counts. pip prints nothing while it unpacks and installs (minutes for the dev extras), so
# a heartbeat line says it is still at work every SETUP_HEARTBEAT_S seconds (default 30).
BEAT=""
trap 'if [ -n "$BEAT" ]; then kill "$BEAT" 2>/dev/null; fi' EXIT  # no heartbeat outlives us
pip_install() {
  local status
  # sleep's own output goes nowhere: the loop is killed but its sleep runs out, and that must
  # not hold the caller's pipe open meanwhile
  ( while sleep "${SETUP_HEARTBEAT_S:-30}" >/dev/null 2>&1; do
      printf '    ... pip still working (%ds so far)\n' "$((SECONDS - START))"
    done ) &
  BEAT=$!
  set +e
  .venv/bin/python -m pip install --disable-pip-version-check --progress-bar off "$@" 2>&1 \
    | grep --line-buffered -v '^WARNING: Location'
  status=${PIPESTATUS[0]}
  kill "$BEAT"
  wait "$BEAT" 2>/dev/null
  BEAT=""
  set -e
  if [ "$status" -ne 0 ]; then
    echo "setup: 'pip install $*' failed with exit status $status" >&2
    exit "$status"
  fi
}

if [ ! -x .venv/bin/python ]; then
  step "creating .venv with $PY"
  "$PY" -m venv .venv
fi
# The CPU build of torch first: a bare `torch` requirement would pull a multi-GB CUDA build.
step "installing torch 2.13.0 (CPU build)"
pip_install "torch==2.13.0"
step "installing kernelsynth and its dev extras"
pip_install -e ".[dev]"
step "checking the packages import"
.venv/bin/python -c "import torch, pipeline, verifier, schemas, sources, flows"
step "done"
