#!/usr/bin/env python3
"""The CDK app: NetworkStorageStack (VPC, EFS, S3), EfsClusterStack and SageMakerStack.

The only place that reads the deployment's settings (infra/settings.py: the settings file over the
defaults, `-c key=value` over both for one command). A bad value stops synth with a one-line
message naming the key, before any construct exists.
"""
from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import dataclass

import aws_cdk as cdk

from infra import checks, image_build, outputs
from infra import settings
from infra.config import AppConfig, ConfigError
from infra.stacks.efs_cluster import EfsClusterStack
from infra.stacks.network_storage import NetworkStorageStack
from infra.stacks.sagemaker import SageMakerStack

# Stack tags: CloudFormation copies them to every resource it creates, for cost allocation.
PROJECT_TAGS = {"project": "maskrcnn-on-aws"}


@dataclass(frozen=True)
class Stacks:
    shared: NetworkStorageStack
    efs_cluster: EfsClusterStack
    sagemaker: SageMakerStack


def read_config(app: cdk.App) -> AppConfig:
    """The settings in effect, with image_build=auto decided for this machine (so the stacks only
    ever see `local` or `codebuild`)."""
    resolved = settings.resolve(app.node.get_all_context())
    for note in resolved.override_notes():
        print(note, file=sys.stderr)
    mode, note = image_build.resolve(resolved.config.image_build)
    if note:
        print(note, file=sys.stderr)
    return dataclasses.replace(resolved.config, image_build=mode)


def deploy_environment() -> cdk.Environment | None:
    """The account and region the CDK CLI found for the credentials (it sets CDK_DEFAULT_ACCOUNT
    and CDK_DEFAULT_REGION), or None without credentials: then the stacks are environment-agnostic
    and synth needs no AWS. With them, lookups (the cluster's AMI, the VPC's zones) are made once
    and kept in cdk.context.json."""
    account, region = os.environ.get("CDK_DEFAULT_ACCOUNT"), os.environ.get("CDK_DEFAULT_REGION")
    return cdk.Environment(account=account, region=region) if account and region else None


def build(app: cdk.App, env: cdk.Environment | None = None) -> Stacks:
    """Adds the three stacks to `app` (all in `env`: stacks that reference each other share one);
    raises ConfigError on bad context before adding any."""
    config = read_config(app)
    # Construct ids stay fixed (`cdk deploy EfsClusterStack -c name_prefix=...` selects by them);
    # the CloudFormation names carry the prefix, and with them every name derived from them.
    shared = NetworkStorageStack(
        app, outputs.NETWORK_STORAGE_STACK, tags=PROJECT_TAGS, env=env,
        stack_name=config.stack_name(outputs.NETWORK_STORAGE_STACK),
        existing_file_system_id=config.existing_file_system_id,
        efs_throughput_mode=config.efs_throughput_mode,
        notification_email=config.notification_email,
        availability_zones=config.availability_zones,
        lustre_storage_gib=config.fsx_lustre_storage_gib,
        lustre_zone_index=config.cluster_zone_index,
        monthly_budget_usd=config.monthly_budget_usd,
        image_build=config.image_build)
    stacks = Stacks(
        shared=shared,
        efs_cluster=EfsClusterStack(app, outputs.EFS_CLUSTER_STACK, tags=PROJECT_TAGS, env=env,
                                    stack_name=config.stack_name(outputs.EFS_CLUSTER_STACK),
                                    shared=shared, config=config),
        sagemaker=SageMakerStack(app, outputs.SAGEMAKER_STACK, tags=PROJECT_TAGS, env=env,
                                 stack_name=config.stack_name(outputs.SAGEMAKER_STACK),
                                 shared=shared, config=config),
    )
    # cdk-nag and cdk-preflight run on every synth: an unacknowledged finding fails it.
    checks.add_checks(app)
    return stacks


def main() -> int:
    app = cdk.App()
    try:
        build(app, env=deploy_environment())
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    app.synth()
    return 0


if __name__ == "__main__":
    sys.exit(main())
