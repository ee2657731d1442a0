"""The training image, built by `cdk deploy` from docker/Dockerfile and pushed to the CDK assets
repository. Synth never runs Docker: it copies the build context into cdk.out."""
from __future__ import annotations

import json
from pathlib import Path

from aws_cdk import IgnoreMode
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_iam as iam
from constructs import Construct

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = "docker/Dockerfile"
# Never part of the image, even inside a copied folder.
_ALWAYS_EXCLUDED = ("**/__pycache__", "**/*.pyc", "**/.pytest_cache")


def dockerfile_copy_sources(dockerfile: Path) -> tuple[str, ...]:
    """The build-context paths that the Dockerfile's COPY and ADD instructions read (copies from
    other build stages, `--from=...`, read no context)."""
    sources: list[str] = []
    for line in dockerfile.read_text().replace("\\\n", " ").splitlines():
        words = line.split()
        if not words or words[0].upper() not in ("COPY", "ADD"):
            continue
        if any(w.startswith("--from") for w in words):
            continue
        args = [w for w in words[1:] if not w.startswith("--")]
        if args and args[0].startswith("["):        # exec form: COPY ["src", ..., "dest"]
            args = json.loads(" ".join(args))
        sources += args[:-1]
    return tuple(dict.fromkeys(s.rstrip("/") for s in sources))


def build_context_excludes(directory: Path, file: str) -> list[str]:
    """Everything but the Dockerfile and what it copies, in .dockerignore syntax.

    The asset hash (the image tag) is the hash of the staged context, and the tag is written into
    the nodes' user data: a context of "the repository minus a list" would change the tag whenever
    infra/ or a README changed, and a replacement node would then pull an image whose code differs
    from the running nodes'. Derived from the Dockerfile, the context cannot drift from it.
    """
    keep = (file, *dockerfile_copy_sources(directory / file))
    return ["*", *(f"!{path}" for path in keep), *_ALWAYS_EXCLUDED]


class TrainingImage(Construct):
    """One image for every path: the EC2 cluster nodes run it as a long-lived container and
    SageMaker runs it as the training job's algorithm image. Deploying either stack publishes it;
    the tag is the content hash, so both stacks share one image."""

    def __init__(self, scope: Construct, id: str, *, directory: Path = REPO_ROOT,
                 file: str = DOCKERFILE) -> None:
        super().__init__(scope, id)
        self.asset = ecr_assets.DockerImageAsset(
            self, "Asset",
            directory=str(directory),
            file=file,
            exclude=build_context_excludes(directory, file),
            ignore_mode=IgnoreMode.DOCKER,
            platform=ecr_assets.Platform.LINUX_AMD64,
        )
        self.image_uri: str = self.asset.image_uri

    def grant_pull(self, grantee: iam.IGrantable) -> iam.Grant:
        return self.asset.repository.grant_pull(grantee)
