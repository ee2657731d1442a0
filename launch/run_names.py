"""Run names, one rule for both paths: a new run gets a name no earlier run has (the EC2 cluster's
Slurm job and log directory, the SageMaker run's log subdirectory and the tag on its training jobs).
Naming an existing run is refused unless the caller resumes it, and resuming needs a run that exists
and that no other job writes. Both paths write runs to the same directory, /efs/logs, so that
directory is the record of runs: the cluster checks it on the master; the SageMaker launcher checks
it where it sees EFS (the notebook), and everywhere the training jobs tagged with the run name."""
from __future__ import annotations

import re
import secrets
import time

from launch.aws import LaunchError

DEFAULT_BASE = "maskrcnn"
MAX_LENGTH = 63
# SageMaker's training-job name pattern and length limit: the strictest place a run name goes (also a
# safe directory name, Slurm job name and SageMaker tag value). The pattern alone allows longer names:
# its repeated group may hold any number of hyphens.
_NAME = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")


def _valid(name: str) -> bool:
    return len(name) <= MAX_LENGTH and _NAME.match(name) is not None


def new_run_name(base: str = DEFAULT_BASE) -> str:
    """The base name, the UTC time and 4 random hex digits."""
    name = f"{base}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{secrets.token_hex(2)}"
    if not _valid(name):
        longest = MAX_LENGTH - (len(name) - len(base))
        raise LaunchError(f"base name {base!r}: a new run is named <base>-<UTC time>-<4 hex digits>, so the "
                          f"base must be letters, digits and hyphens, at most {longest} characters, "
                          f"starting and ending with a letter or digit")
    return name


def check_run_name(name: str) -> str:
    if not _valid(name):
        raise LaunchError(f"run name {name!r}: use letters, digits and hyphens, at most {MAX_LENGTH} "
                          f"characters, starting and ending with a letter or digit")
    return name
