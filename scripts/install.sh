#!/usr/bin/env bash
# Installs everything this project needs into ./.venv and the CDK CLI into ./node_modules.
# Idempotent: safe to re-run; pip's wheel cache makes re-runs fast.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
PIP=".venv/bin/python -m pip"
$PIP install --quiet --upgrade pip setuptools wheel
$PIP install --quiet -r requirements.txt
# tf-keras without its dependencies: otherwise pip pulls the full `tensorflow` wheel over tensorflow-cpu.
$PIP install --quiet --no-deps -c constraints.txt tf-keras
# Horovod compiles against the installed TensorFlow, so it comes last and without build isolation.
if ! .venv/bin/python -c "import horovod.tensorflow" 2>/dev/null; then
  HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
  HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS="-j$(nproc)" \
    $PIP install --quiet --no-build-isolation -c constraints.txt horovod
fi
$PIP install --quiet --no-deps -e .

# CDK CLI, pinned in package.json / package-lock.json.
if [ -f package-lock.json ]; then npm ci --silent --no-audit --no-fund; else npm install --silent --no-audit --no-fund; fi
