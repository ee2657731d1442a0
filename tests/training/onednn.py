"""Run some of a test file's tests again in a process with TensorFlow's oneDNN kernels on.

The suite runs with oneDNN off (tests/conftest.py); TensorFlow's Eigen kernels have no NCHW
MaxPool, so the NCHW cases need a process of their own with it on."""
import os
import subprocess
import sys
from pathlib import Path


def run_with_onednn(test_file: str, keyword: str) -> subprocess.CompletedProcess:
    """``pytest test_file -k keyword`` with ``TF_ENABLE_ONEDNN_OPTS=1``; asserts it exits 0 and skips nothing."""
    run = subprocess.run([sys.executable, "-m", "pytest", test_file, "-q", "-p", "no:cacheprovider", "-n", "0",
                          "-k", keyword],
                         env={**os.environ, "TF_ENABLE_ONEDNN_OPTS": "1"}, capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[2], timeout=900)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    summary = run.stdout.strip().splitlines()[-1]
    assert " skipped" not in summary, run.stdout[-4000:]
    return run
