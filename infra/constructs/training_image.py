"""The training image, built by `cdk deploy` from docker/Dockerfile and pushed to the CDK assets
repository. Synth never runs Docker: it copies the build context into cdk.out."""
from __future__ import annotations

from pathlib import Path

from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_iam as iam
from constructs import Construct

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = "docker/Dockerfile"

# The build context is the repository root, so the Dockerfile can COPY constraints.txt (the one
# place with versions), training/ and launch/. Everything below is left out of the context: it is
# either large (virtual env, node_modules, data), generated, or irrelevant to the image, and
# leaving it out keeps the asset hash (the image tag) from changing when it changes.
BUILD_CONTEXT_EXCLUDES = (
    ".venv", "node_modules", "cdk.out", ".git", ".pytest_cache", "tests", "data", "runs",
    "bench", "docs", "notebooks", "*.md", "*.egg-info", "**/__pycache__", "**/*.pyc",
)


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
            exclude=list(BUILD_CONTEXT_EXCLUDES),
            platform=ecr_assets.Platform.LINUX_AMD64,
        )
        self.image_uri: str = self.asset.image_uri

    def grant_pull(self, grantee: iam.IGrantable) -> iam.Grant:
        return self.asset.repository.grant_pull(grantee)
