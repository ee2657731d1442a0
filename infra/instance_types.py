"""EC2 instance types the cluster accepts, and which of them each known AMI family can drive.

One table, so validation (infra/config.py), the launch template (EFA interfaces), the pre-flight
(vCPU quotas), the cost estimates and the docs agree. GPU counts are informational here; at boot
each node compares `nvidia-smi -L` with what DescribeInstanceTypes says the instance has, and fails
its boot when the driver sees fewer GPUs.

Prices are on-demand Linux list prices in us-east-1 (USD per hour) as AWS published them after its
June 2025 price change for P4 and P5; other regions differ by up to ~30%, and every figure computed
from them is stated as an estimate. None: no price recorded here (the estimate says so).
"""
from __future__ import annotations

import re
from dataclasses import dataclass


# Service Quotas codes of the EC2 vCPU quotas that cap running on-demand instances, by family.
VCPU_QUOTAS = {
    "P": ("L-417A185B", "Running On-Demand P instances"),
    "G": ("L-DB2E81BA", "Running On-Demand G and VT instances"),
    "standard": ("L-1216C47A", "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances"),
}
ELASTIC_IP_QUOTA = ("L-0263D0A3", "EC2-VPC Elastic IPs")

# Service Quotas codes of the EC2 vCPU quotas that cap running and requested Spot Instances. Names
# and AWS defaults (0 vCPUs each but Standard's 5): the EC2 User Guide's "Spot Instance quotas"
# (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/using-spot-limits.html); codes: the Service
# Quotas console links of AWS's "Amazon EC2 instance type quotas" table. P has two, by generation;
# G and VT and Standard count the same families as their On-Demand quotas.
SPOT_VCPU_QUOTAS = {
    "P2-P4": ("L-7212CCBC", "All P4, P3 and P2 Spot Instance Requests"),
    "P5": ("L-C4BD4855", "All P5 Spot Instance Requests"),
    "G": ("L-3819A6DF", "All G and VT Spot Instance Requests"),
    "standard": ("L-34B43A08", "All Standard (A, C, D, H, I, M, R, T, Z) Spot Instance Requests"),
}
# The P Spot quota of each generation (the digits after "p": p4d -> 4, p5en -> 5). No quota's name
# covers P6 (p6-b200), and AWS's pages do not say which Spot quota counts it: none is recorded.
SPOT_P_GENERATIONS = {"2": "P2-P4", "3": "P2-P4", "4": "P2-P4", "5": "P5"}


@dataclass(frozen=True)
class InstanceTypeInfo:
    gpus: int
    vcpus: int
    # Network cards that carry an Elastic Fabric Adapter (0: no EFA). AWS's "Maximize network
    # bandwidth" page: one EFA interface per card, device index 0 on card 0 and 1 on the others.
    efa_cards: int
    price_per_hour: float | None
    note: str = ""

    @property
    def efa(self) -> bool:
        return self.efa_cards > 0

    @property
    def cpu_only(self) -> bool:
        return self.gpus == 0



INSTANCE_TYPES: dict[str, InstanceTypeInfo] = {
    # The original cluster's types (8 x V100). No current Deep Learning AMI's driver drives them:
    # listed so that choosing one fails with a message that says why.
    "p3.16xlarge": InstanceTypeInfo(8, 64, 0, 24.48, note="V100"),
    "p3dn.24xlarge": InstanceTypeInfo(8, 96, 1, 31.212, note="V100"),
    # A100, H100, H200, B200.
    "p4d.24xlarge": InstanceTypeInfo(8, 96, 4, 21.96, note="A100"),
    "p5.48xlarge": InstanceTypeInfo(8, 192, 32, 55.04, note="H100"),
    "p5e.48xlarge": InstanceTypeInfo(8, 192, 32, None, note="H200"),
    "p5en.48xlarge": InstanceTypeInfo(8, 192, 16, None, note="H200"),
    "p6-b200.48xlarge": InstanceTypeInfo(8, 192, 8, None, note="B200"),
    # A10G.
    "g5.xlarge": InstanceTypeInfo(1, 4, 0, 1.006, note="A10G"),
    "g5.2xlarge": InstanceTypeInfo(1, 8, 0, 1.212, note="A10G"),
    "g5.4xlarge": InstanceTypeInfo(1, 16, 0, 1.624, note="A10G"),
    "g5.8xlarge": InstanceTypeInfo(1, 32, 1, 2.448, note="A10G"),
    "g5.12xlarge": InstanceTypeInfo(4, 48, 1, 5.672, note="A10G"),
    "g5.16xlarge": InstanceTypeInfo(1, 64, 1, 4.096, note="A10G"),
    "g5.24xlarge": InstanceTypeInfo(4, 96, 1, 8.144, note="A10G"),
    "g5.48xlarge": InstanceTypeInfo(8, 192, 1, 16.288, note="A10G"),
    # CPU only: cheap tests of the cluster wiring (boot, EFS, SSH, hostfile); not for training.
    "c5.xlarge": InstanceTypeInfo(0, 4, 0, 0.17, note="CPU only, for wiring tests"),
    "m5.xlarge": InstanceTypeInfo(0, 4, 0, 0.192, note="CPU only, for wiring tests"),
}

# SageMaker AI's on-demand prices of the ml.* types the launchers use, USD per hour in us-east-1:
# training jobs (launch/sagemaker) and the notebook instance (ml.t3.medium, which training does not
# offer). SageMaker charges more per hour than EC2 does for the same hardware (the managed service
# is included). None: no price recorded here (for ml.p4d and ml.p5, AWS's June 2025 cut of the EC2
# P4 and P5 prices left no dated SageMaker figure at hand): `maskrcnn cost` and a finished job's cost
# line read it from AWS's Price List (launch/price_list.py).
SAGEMAKER_PRICES: dict[str, float | None] = {
    "ml.p3.16xlarge": 28.152,
    "ml.p3dn.24xlarge": 35.894,
    "ml.p4d.24xlarge": None,
    "ml.p5.48xlarge": None,
    "ml.g5.xlarge": 1.408,
    "ml.g5.2xlarge": 1.515,
    "ml.g5.4xlarge": 2.03,
    "ml.g5.8xlarge": 3.06,
    "ml.g5.12xlarge": 7.09,
    "ml.g5.16xlarge": 5.12,
    "ml.g5.24xlarge": 10.18,
    "ml.g5.48xlarge": 20.36,
    "ml.m5.xlarge": 0.23,
    "ml.c5.xlarge": 0.204,
    "ml.t3.medium": 0.05,
}

# Instance families by the On-Demand vCPU quota they count against (the letters before the
# generation digit: g4dn -> g, gr6 -> gr, im4gn -> im). The quota names list them: "Running
# On-Demand P instances", "G and VT instances", "Standard (A, C, D, H, I, M, R, T, Z) instances".
# DL, HPC, Inf, Trn, F, X, High Memory (u-) and Mac families have quotas of their own, and count
# against none of these three even where their first letter matches.
QUOTA_FAMILIES = {
    "P": frozenset({"p"}),
    "G": frozenset({"g", "gr", "vt"}),
    "standard": frozenset({"a", "c", "d", "h", "i", "im", "is", "m", "r", "t", "z"}),
}
_FAMILY = re.compile(r"^[a-z]+")


def vcpu_quota(instance_type: str) -> tuple[str, str] | None:
    """(quota code, quota name) of the On-Demand vCPU quota `instance_type` counts against, or
    None for a family with a quota of its own."""
    family = _FAMILY.match(instance_type)
    for key, families in QUOTA_FAMILIES.items():
        if family and family.group() in families:
            return VCPU_QUOTAS[key]
    return None


EFA_INSTANCE_TYPES = tuple(name for name, info in INSTANCE_TYPES.items() if info.efa)

# Families whose network cards beyond card 0 get EFA-only interfaces (InterfaceType efa-only: the EFA
# device without an ENA device, so no IP address): AWS's "EFA configuration for a P5 and P5e
# instances" (the EC2 User Guide's "Maximize network bandwidth" page) uses EFA with ENA on card 0 and
# EFA-only on the other 31. Elsewhere every card carries EFA with ENA (docs/infra.md says why).
EFA_ONLY_FAMILIES = frozenset({"p5", "p5e"})


def efa_only_beyond_card0(instance_type: str) -> bool:
    """Whether ``instance_type``'s cards other than card 0 carry EFA-only interfaces."""
    return instance_type.split(".", 1)[0] in EFA_ONLY_FAMILIES


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
    # current driver branch dropped V100 (P3, P3dn). P6-B200 needs a driver of the 570 branch or newer.
    AmiFamily(
        description="Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu)",
        ssm_parameter=re.compile(r"^/aws/service/deeplearning/ami/x86_64/"
                                 r"base-oss-nvidia-driver-gpu-ubuntu-(22|24)\.04/"),
        gpu_families=("g4dn", "g5", "g6", "gr6", "g6e", "p4d", "p4de", "p5", "p5e", "p5en",
                      "p6-b200")),
)


def ami_family(ssm_parameter: str) -> AmiFamily | None:
    return next((f for f in AMI_FAMILIES if f.ssm_parameter.match(ssm_parameter)), None)
