"""tests/shared_artifacts.py: an artifact is built once for all processes of a session, never
used half built, and rebuilt after a build that failed."""
import subprocess
import sys
from pathlib import Path

import pytest

from shared_artifacts import shared_artifact

TESTS = Path(__file__).resolve().parent

# A process that asks for the artifact "slow": its build takes a while and counts itself in builds.log.
ASK = """
import sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[2])
from shared_artifacts import shared_artifact
root = Path(sys.argv[1])
def build(directory):
    with open(root / "builds.log", "a") as log:
        log.write("built\\n")
    time.sleep(1.0)
    (directory / "content").write_text("whole")
print((shared_artifact(root, "slow", build) / "content").read_text())
"""


def test_processes_asking_at_once_get_one_build(tmp_path):
    asking = [subprocess.Popen([sys.executable, "-c", ASK, str(tmp_path), str(TESTS)], stdout=subprocess.PIPE,
                               text=True) for _ in range(3)]
    outputs = [p.communicate(timeout=60)[0] for p in asking]
    assert [p.returncode for p in asking] == [0, 0, 0]
    assert outputs == ["whole\n"] * 3          # each waited for the whole artifact
    assert (tmp_path / "builds.log").read_text() == "built\n"


def test_a_failed_build_is_removed_and_built_again(tmp_path):
    def failing(directory):
        (directory / "part").write_text("half")
        raise RuntimeError("the build failed")

    with pytest.raises(RuntimeError, match="the build failed"):
        shared_artifact(tmp_path, "model", failing)
    built = []

    def build(directory):
        built.append(sorted(p.name for p in directory.iterdir()))
        (directory / "whole").write_text("")

    directory = shared_artifact(tmp_path, "model", build)
    assert built == [[]]                       # started from an empty directory, not the half-built one
    assert sorted(p.name for p in directory.iterdir()) == ["whole"]
    assert shared_artifact(tmp_path, "model", build) == directory and len(built) == 1   # not built again


def test_a_key_that_is_no_plain_name_is_refused(tmp_path):
    with pytest.raises(ValueError, match="artifact key '../x'"):
        shared_artifact(tmp_path, "../x", lambda directory: None)
