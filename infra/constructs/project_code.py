"""The project's code and walkthrough notebook as a zip asset, which the SageMaker notebook's
lifecycle script unpacks into the Jupyter root, so the notebook opens ready to use."""
from __future__ import annotations

from pathlib import Path

from aws_cdk import IgnoreMode
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3_assets as s3_assets
from constructs import Construct

REPO_ROOT = Path(__file__).resolve().parents[2]
# What a notebook user needs: the launchers (and the output names they import), the trainer (to
# read its config), the walkthrough notebook, the docs and the pinned requirements. Everything
# else (virtual env, node_modules, data, cdk.out, tests) stays out: a list of what to keep, so a
# new large folder cannot slip in.
KEEP = ("README.md", "constraints.txt", "pyproject.toml", "docs", "notebooks",
        "launch", "training", "examples", "infra/__init__.py", "infra/outputs.py",
        "infra/node_contract.py")
_ALWAYS_EXCLUDED = ("**/__pycache__", "**/*.pyc", "**/.ipynb_checkpoints")


class ProjectCode(Construct):
    def __init__(self, scope: Construct, id: str, *, directory: Path = REPO_ROOT) -> None:
        super().__init__(scope, id)
        self.asset = s3_assets.Asset(
            self, "Asset", path=str(directory), ignore_mode=IgnoreMode.DOCKER,
            exclude=["*", *(f"!{path}" for path in KEEP), *_ALWAYS_EXCLUDED])
        self.s3_url: str = self.asset.s3_object_url

    def grant_download(self, grantee: iam.IGrantable) -> None:
        """s3:GetObject on this one object (not the whole assets bucket)."""
        iam.Grant.add_to_principal(
            grantee=grantee, actions=["s3:GetObject"],
            resource_arns=[self.asset.bucket.arn_for_objects(self.asset.s3_object_key)])
