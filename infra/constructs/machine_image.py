"""The cluster nodes' AMI: the latest of a Deep Learning AMI family (its public SSM parameter,
resolved by CloudFormation at each deploy) or a pinned AMI id, so that replacement and scale-out
nodes run the same driver, CUDA and NCCL as the nodes already running."""
from __future__ import annotations

import jsii
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


def cluster_machine_image(*, ssm_parameter: str, ami_id: str | None) -> ec2.IMachineImage:
    if ami_id:
        return PinnedLinuxImage(ami_id)
    return ec2.MachineImage.from_ssm_parameter(ssm_parameter, os=ec2.OperatingSystemType.LINUX)
