"""What this machine must offer the tests that use it, and what happens when it does not.

Outside CI a test that needs something missing here (root for namespaces, sshd, unshare, the AWS
CLI) skips with the reason. In CI (``CI=true``) those tests are expected to run, so a missing
requirement fails the test instead of hiding it as a skip.
"""
from __future__ import annotations

import os
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
