"""Where `cdk deploy` builds the training image: `local` (Docker on the deploying machine, a CDK
Docker image asset) or `codebuild` (AWS CodeBuild in the account). The `image_build` setting's
`auto` is resolved here, once per synth, from whether this machine can run Docker builds."""
from __future__ import annotations

import os
import shutil
import subprocess

LOCAL, CODEBUILD, AUTO = "local", "codebuild", "auto"
# `docker info` answers in well under a second from a running engine; a client waiting on an
# engine that never answers must not stall synth.
DOCKER_INFO_TIMEOUT_S = 30


def docker_command() -> str:
    """The container CLI that `cdk deploy` runs to build image assets: CDK_DOCKER, else docker."""
    return os.environ.get("CDK_DOCKER") or "docker"


def local_docker_works() -> tuple[bool, str]:
    """Whether this machine can build the image itself, and why (for the synth note)."""
    command = docker_command()
    path = shutil.which(command)
    if path is None:
        return False, f"no {command!r} command on PATH"
    try:
        result = subprocess.run([path, "info"], stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                timeout=DOCKER_INFO_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return False, f"`{command} info` gave no answer in {DOCKER_INFO_TIMEOUT_S} s"
    except OSError as error:
        return False, f"`{command} info` could not run ({error})"
    if result.returncode != 0:
        return False, f"`{command} info` failed (exit status {result.returncode}: no engine running)"
    return True, f"`{command} info` succeeded"


def resolve(setting: str) -> tuple[str, str | None]:
    """The build mode for `setting`, and a note for stderr when `auto` decided it. An explicit
    `local` or `codebuild` is returned as given, without asking Docker."""
    if setting != AUTO:
        return setting, None
    works, why = local_docker_works()
    mode = LOCAL if works else CODEBUILD
    where = ("on this machine with Docker" if works
             else "in the account by AWS CodeBuild during the deploy")
    return mode, (f"note: image_build=auto: {why}, so the training image is built {where}; "
                  f"keep one choice for every machine that deploys with `maskrcnn settings set "
                  f"image_build={mode}`")
