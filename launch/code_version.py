"""A short hash of the training code (every file under training/), so the health check can tell that
all nodes run the same image. ``python -m launch.code_version`` prints it."""
from __future__ import annotations

import hashlib
from pathlib import Path

import training

TRAINING_DIR = Path(training.__file__).resolve().parent


def code_version(root: Path = TRAINING_DIR) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                       and p.suffix != ".pyc"):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


if __name__ == "__main__":
    print(code_version())
