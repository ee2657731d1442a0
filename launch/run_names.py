"""Run names, one rule for both paths: a new run gets a name no earlier run has (the EC2 cluster's
Slurm job and log directory, the SageMaker training job and its log subdirectory)."""
from __future__ import annotations

import re
import secrets
import time

from launch.aws import LaunchError

DEFAULT_BASE = "maskrcnn"
# SageMaker's training-job name pattern (also a safe directory and Slurm job name), at most 63 chars.
_NAME = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")


def new_run_name(base: str = DEFAULT_BASE) -> str:
    """The base name, the UTC time and 4 random hex digits."""
    return f"{base}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{secrets.token_hex(2)}"


def check_run_name(name: str) -> str:
    if not _NAME.match(name):
        raise LaunchError(f"run name {name!r}: use letters, digits and single hyphens, at most 63 "
                          f"characters, starting and ending with a letter or digit")
    return name
