"""A test that needs what this machine lacks skips outside CI and fails in CI (tests/machine.py)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

NEEDS_MISSING = '''
from machine import require

def test_needs_a_missing_tool():
    require("needs a tool this machine lacks")

def test_needs_nothing_missing():
    require(None)
'''


@pytest.mark.parametrize("ci, outcome", [("", "1 passed, 1 skipped"), ("true", "1 failed, 1 passed")])
def test_a_missing_requirement_skips_outside_ci_and_fails_in_ci(tmp_path, ci, outcome):
    (tmp_path / "test_needs.py").write_text(NEEDS_MISSING)
    env = {**os.environ, "CI": ci, "PYTHONPATH": str(Path(__file__).parent)}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                          "-o", "addopts=", str(tmp_path / "test_needs.py")],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert outcome in run.stdout, run.stdout[-2000:]
    if ci:
        assert "needs a tool this machine lacks: CI runs as root" in run.stdout


def test_python_interpreter_finds_a_working_build_or_says_what_is_missing():
    import subprocess
    import sys

    from machine import python_interpreter

    running = f"{sys.version_info.major}.{sys.version_info.minor}"
    found, missing = python_interpreter(running)
    assert missing is None
    version = subprocess.run([str(found), "-c", "import sys; print(sys.version_info[:2])"],
                             capture_output=True, text=True, check=True).stdout
    assert version.strip() == str(tuple(sys.version_info[:2]))
    found, missing = python_interpreter("3.99")
    assert found is None and missing.startswith("Python 3.99 is not installed")
