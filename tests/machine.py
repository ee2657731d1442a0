"""What this machine must offer the tests that use it, and what happens when it does not.

Outside CI a test that needs something missing here (root for namespaces, sshd, unshare, the AWS
CLI) skips with the reason. In CI (``CI=true``) those tests are expected to run, so a missing
requirement fails the test instead of hiding it as a skip.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def require(missing: str | None) -> None:
    """Skip (or, in CI, fail) the calling test when ``missing`` names what this machine lacks."""
    if not missing:
        return
    if in_ci():
        pytest.fail(f"{missing}: CI runs as root after scripts/install.sh, so this test must run there, "
                    f"not skip", pytrace=False)
    pytest.skip(missing)


def python_interpreter(version: str) -> tuple[Path | None, str | None]:
    """An interpreter of Python ``version`` ("3.10") that runs on this machine: a pyenv build
    (``$PYENV_ROOT``, by default ~/.pyenv), else ``python3.10`` on the PATH (not pyenv's shim, which
    refuses a version that is not selected). Returns (path, None) or (None, what is missing)."""
    root = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")
    builds = sorted(root.glob(f"versions/{version}.*/bin/python{version}"),
                    key=lambda p: [int(n) if n.isdigit() else -1 for n in p.parts[-3].split(".")],
                    reverse=True)
    for candidate in [*builds, shutil.which(f"python{version}")]:
        if candidate and subprocess.run([str(candidate), "-c", "import venv"],
                                        capture_output=True).returncode == 0:
            return Path(candidate), None
    return None, (f"Python {version} is not installed: no pyenv build under {root}/versions/{version}.* "
                  f"and no working python{version} on the PATH (e.g. `pyenv install {version}`)")


def child_pids(pid: int) -> set[int]:
    """The processes whose parent is ``pid`` (from /proc/<pid>/stat: the field after the command)."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if stat.rsplit(")", 1)[1].split()[1] == str(pid):
                found.add(int(entry))
    return found
