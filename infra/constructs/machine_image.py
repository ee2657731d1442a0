"""The cluster nodes' AMI: a Deep Learning AMI family's public SSM parameter, read once and kept,
or a pinned AMI id, so that replacement and scale-out nodes run the same driver, CUDA and NCCL as
the nodes already running.

Kept through CDK's context cache: with the account and region known (a synth or deploy with
credentials), the CDK CLI reads the parameter at the first synth and records its value in
cdk.context.json, and every later synth uses the recorded AMI until that entry is reset
(docs/infra.md, "The cluster's AMI"). Offline, with no account, the parameter stays a
CloudFormation parameter (CDK refuses a context lookup in an environment-agnostic stack)."""
from __future__ import annotations

import jsii
from aws_cdk import ContextProvider
from aws_cdk import aws_ec2 as ec2
from constructs import Construct


@jsii.implements(ec2.IMachineImage)
class PinnedLinuxImage:
    """One AMI id, used as is in every region the template deploys to (AMI ids are regional:
    pin the id of the region you deploy in)."""

    def __init__(self, image_id: str) -> None:
        self.image_id = image_id

    def get_image(self, scope: Construct) -> ec2.MachineImageConfig:
        return ec2.MachineImageConfig(image_id=self.image_id,
                                      os_type=ec2.OperatingSystemType.LINUX,
                                      user_data=ec2.UserData.for_linux())


# The value the first synth with credentials sees before the CDK CLI has made the lookup (CDK
# synthesizes once with a stand-in, asks the CLI for the missing value, then synthesizes again
# with it). CDK's own stand-in, "dummy-value-for-<parameter>", fails CloudFormation's template
# validation (an ImageId must look like one), and a synth that fails ends the command before the
# CLI makes the lookup. An id of the right shape that names no AMI.
LOOKUP_PENDING_AMI = "ami-00000000000000000"
# CDK's SSM parameter context provider (cloud_assembly_schema.ContextProvider.SSM_PARAMETER_PROVIDER),
# as StringParameter.value_from_lookup names it: the cdk.context.json key is
# ssm:account=<account>:parameterName=<parameter>:region=<region>.
SSM_PARAMETER_PROVIDER = "ssm"


def cluster_machine_image(scope: Construct, *, ssm_parameter: str, ami_id: str | None,
                          cached_in_context: bool) -> ec2.IMachineImage:
    """``ami_id`` when set; else ``ssm_parameter``'s AMI: when ``cached_in_context`` (the stack's
    account and region are known) read by the CDK CLI at the first synth and kept in
    cdk.context.json, as `MachineImage.from_ssm_parameter(..., cached_in_context=True)` does (the
    same context key), with a stand-in of an AMI id's shape; else a CloudFormation parameter."""
    if ami_id:
        return PinnedLinuxImage(ami_id)
    if cached_in_context:
        image_id = ContextProvider.get_value(
            scope, provider=SSM_PARAMETER_PROVIDER,
            props={"parameterName": ssm_parameter}, dummy_value=LOOKUP_PENDING_AMI).value
        return PinnedLinuxImage(image_id)
    return ec2.MachineImage.from_ssm_parameter(ssm_parameter, os=ec2.OperatingSystemType.LINUX)
