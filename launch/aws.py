"""AWS session, credential check and CloudFormation stack outputs, shared by every launcher.

Output names come from infra/outputs.py (the stacks write them, the launchers read them); errors
name the stack, the output and what to do, before any job or upload is started.
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import boto3
from botocore.exceptions import ClientError, NoRegionError

from infra.outputs import PRIVATE_SUBNET_IDS, TRAINING_SECURITY_GROUP_ID


class LaunchError(RuntimeError):
    """A user-facing problem: the message says what is wrong and how to fix it."""


# The SageMaker SDK's own switch for its client-side role check (sagemaker.core.helper.iam_role_resolver).
SDK_VALIDATE_ROLE_ENV = "SAGEMAKER_VALIDATE_ROLE"


@contextlib.contextmanager
def stack_role_trusted() -> Iterator[None]:
    """Build SageMaker SDK objects without the SDK's client-side check of the training role.

    ModelTrainer simulates the role's policies (iam:SimulatePrincipalPolicy) when the caller may, and
    raises when the simulation denies: the stack's role is scoped to its own bucket and file system, so
    a simulation without those resources can deny what SageMaker allows. The role is the stack's own,
    made for these jobs; SageMaker still checks it when the job is created, and names what is missing.
    """
    previous = os.environ.get(SDK_VALIDATE_ROLE_ENV)
    os.environ[SDK_VALIDATE_ROLE_ENV] = "false"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(SDK_VALIDATE_ROLE_ENV, None)
        else:
            os.environ[SDK_VALIDATE_ROLE_ENV] = previous


def make_session(region: str | None = None, profile: str | None = None) -> boto3.session.Session:
    """A boto3 session with credentials and a region, or a :class:`LaunchError` saying how to set them."""
    session = boto3.session.Session(region_name=region, profile_name=profile)
    if session.get_credentials() is None:
        raise LaunchError(
            "no AWS credentials found: configure them with `aws configure` or `aws sso login`, "
            "set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, or run where an IAM role is attached "
            "(notebook instance, EC2 instance profile)")
    if not session.region_name:
        raise LaunchError("no AWS region set: pass --region, or set AWS_REGION / AWS_DEFAULT_REGION")
    return session


def stack_outputs(session: boto3.session.Session, stack_name: str) -> dict[str, str]:
    """``{OutputKey: OutputValue}`` of a deployed stack."""
    cfn = session.client("cloudformation")
    try:
        stacks = cfn.describe_stacks(StackName=stack_name)["Stacks"]
    except ClientError as err:
        if "does not exist" in str(err):
            raise LaunchError(
                f"stack {stack_name!r} does not exist in {session.region_name}: deploy it with "
                f"`cdk deploy {stack_name}` or pass the right --stack/--region") from None
        raise
    except NoRegionError:
        raise LaunchError("no AWS region set: pass --region, or set AWS_REGION") from None
    stack = stacks[0]
    if stack["StackStatus"].endswith("_FAILED") or stack["StackStatus"].startswith("DELETE"):
        raise LaunchError(f"stack {stack_name!r} is in state {stack['StackStatus']}: "
                          f"fix or redeploy it with `cdk deploy {stack_name}`")
    return {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}


def require_output(outputs: dict[str, str], name: str, stack_name: str) -> str:
    """The value of output ``name``; a clear error when the deployed stack lacks it."""
    value = outputs.get(name)
    if not value:
        raise LaunchError(
            f"stack {stack_name!r} has no output {name!r} (it has: {', '.join(sorted(outputs)) or 'none'}); "
            f"it was probably deployed from an older version of this app: run `cdk deploy {stack_name}`")
    return value


def training_networking(outputs: dict[str, str], stack_name: str) -> tuple[list[str], str]:
    """The private subnets and training security group a SageMaker job of ``stack_name`` runs in,
    checked to look like AWS ids (a clear error names the output otherwise)."""
    subnets = [s.strip() for s in require_output(outputs, PRIVATE_SUBNET_IDS, stack_name).split(",")
               if s.strip()]
    security_group = require_output(outputs, TRAINING_SECURITY_GROUP_ID, stack_name)
    if not subnets or not all(s.startswith("subnet-") for s in subnets):
        raise LaunchError(f"output {PRIVATE_SUBNET_IDS}={subnets!r} of {stack_name} is not "
                          f"a list of subnet ids")
    if not security_group.startswith("sg-"):
        raise LaunchError(f"output {TRAINING_SECURITY_GROUP_ID}={security_group!r} of "
                          f"{stack_name} is not a security group id")
    return subnets, security_group
