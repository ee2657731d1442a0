"""Artifacts that several test files build the same way (an untrained run and its SavedModel, a
synthesized template), built once per pytest session and shared, also across pytest-xdist workers.

An artifact lives under the session's base temp directory, which every xdist worker of a session
shares (each worker's own base temp is a folder in it). One worker builds it while holding an
exclusive lock on a file next to it (``fcntl.flock``: released by the kernel if the worker dies); the
others wait on the lock. A marker file written after the build tells a finished artifact from one a
failed build left half made, which is removed and built again. Artifacts are read-only to the
tests: a test that changes one works on a copy.
"""
from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest


def session_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The base temp directory of the whole session: xdist workers' base temps sit in it."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def shared_artifact(root: Path, key: str, build: Callable[[Path], None]) -> Path:
    """The directory ``build(directory)`` fills, under ``root`` (:func:`session_root`), built by the
    first caller that asks for ``key`` (letters, digits, ``-``, ``_``, ``.``); later callers, in any
    process, get it as built."""
    if not key or not all(c.isalnum() or c in "-_." for c in key):
        raise ValueError(f"artifact key {key!r}: use letters, digits, '-', '_' and '.'")
    shelf = root / "shared-artifacts"
    shelf.mkdir(exist_ok=True)
    directory, complete = shelf / key, shelf / f"{key}.complete"
    with open(shelf / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not complete.exists():
            if directory.exists():   # a build that failed part-way, in this or another worker
                shutil.rmtree(directory)
            directory.mkdir()
            build(directory)
            complete.write_text("")
    return directory
