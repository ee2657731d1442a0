"""EC2 instance types the cluster accepts, and which of them each known AMI family can drive.

One table, so validation (infra/config.py), the launch template (EFA) and the docs agree. GPU counts
are informational here; at boot each node compares `nvidia-smi -L` with what DescribeInstanceTypes
says the instance has, and fails its boot when the driver sees fewer GPUs.
"""
from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class InstanceTypeInfo:
    gpus: int
    efa: bool          # supports an Elastic Fabric Adapter interface
    note: str = ""

    @property
    def cpu_only(self) -> bool:
        return self.gpus == 0


INSTANCE_TYPES: dict[str, InstanceTypeInfo] = {
    # The original cluster's types (8 x V100). No current Deep Learning AMI's driver drives them:
    # listed so that choosing one fails with a message that says why.
    "p3.16xlarge": InstanceTypeInfo(gpus=8, efa=False, note="V100"),
    "p3dn.24xlarge": InstanceTypeInfo(gpus=8, efa=True, note="V100"),
    # A100 / H100.
    "p4d.24xlarge": InstanceTypeInfo(gpus=8, efa=True),
    "p5.48xlarge": InstanceTypeInfo(gpus=8, efa=True),
    # A10G.
    "g5.xlarge": InstanceTypeInfo(gpus=1, efa=False),
    "g5.2xlarge": InstanceTypeInfo(gpus=1, efa=False),
    "g5.4xlarge": InstanceTypeInfo(gpus=1, efa=False),
    "g5.8xlarge": InstanceTypeInfo(gpus=1, efa=True),
    "g5.12xlarge": InstanceTypeInfo(gpus=4, efa=True),
    "g5.16xlarge": InstanceTypeInfo(gpus=1, efa=True),
    "g5.24xlarge": InstanceTypeInfo(gpus=4, efa=True),
    "g5.48xlarge": InstanceTypeInfo(gpus=8, efa=True),
    # CPU only: cheap tests of the cluster wiring (boot, EFS, SSH, hostfile); not for training.
    "c5.xlarge": InstanceTypeInfo(gpus=0, efa=False, note="CPU only, for wiring tests"),
    "m5.xlarge": InstanceTypeInfo(gpus=0, efa=False, note="CPU only, for wiring tests"),
}

EFA_INSTANCE_TYPES = tuple(name for name, info in INSTANCE_TYPES.items() if info.efa)


@dataclass(frozen=True)
class AmiFamily:
    """AMIs published under one SSM parameter path (every release of one DLAMI), and the GPU
    instance families their NVIDIA driver supports (from the AMI's release notes). CPU-only types
    boot on any of them: there is no GPU to drive."""
    description: str
    ssm_parameter: re.Pattern[str]
    gpu_families: tuple[str, ...]

    def supports(self, instance_type: str) -> bool:
        return (INSTANCE_TYPES[instance_type].cpu_only
                or instance_type.split(".", 1)[0] in self.gpu_families)

    def supported_types(self) -> tuple[str, ...]:
        return tuple(name for name in INSTANCE_TYPES if self.supports(name))


AMI_FAMILIES: tuple[AmiFamily, ...] = (
    # The boot script is written for Ubuntu (apt-get, the ubuntu user, /dev/sda1 root device).
    # Its release notes list G4dn, G5, G6, Gr6, G6e, P4d, P4de, P5, P5e, P5en and newer: the
    # current driver branch dropped V100 (P3, P3dn).
    AmiFamily(
        description="Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu)",
        ssm_parameter=re.compile(r"^/aws/service/deeplearning/ami/x86_64/"
                                 r"base-oss-nvidia-driver-gpu-ubuntu-(22|24)\.04/"),
        gpu_families=("g4dn", "g5", "g6", "gr6", "g6e", "p4d", "p4de", "p5", "p5e", "p5en")),
)


def ami_family(ssm_parameter: str) -> AmiFamily | None:
    return next((f for f in AMI_FAMILIES if f.ssm_parameter.match(ssm_parameter)), None)
