"""Free-space check before anything is written: a copy that would fill the disk stops with a clear
message instead of failing half-way with ENOSPC and a partial tree."""
from __future__ import annotations

import shutil
from pathlib import Path

from launch.aws import LaunchError


class StagingError(LaunchError):
    """Data staging cannot proceed; the message says why and what to do."""


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"


def ensure_free_space(target: str | Path, needed: int, *, what: str, margin: float = 0.02) -> None:
    """Raise :class:`StagingError` unless ``target``'s file system has ``needed`` bytes free (+2%).

    ``target`` may not exist yet: the nearest existing parent decides which file system it is on.
    """
    path = Path(target).resolve()
    while not path.exists():
        path = path.parent
    free = shutil.disk_usage(path).free
    if needed * (1 + margin) > free:
        raise StagingError(
            f"not enough free space for {what}: it needs {human(needed)}, {path} has {human(free)} free; "
            f"free some space or choose another directory (--stage-dir / --efs-dir)")
