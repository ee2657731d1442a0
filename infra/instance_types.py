"""EC2 instance types the cluster accepts, with the facts the stacks and docs need about each.

One table, so validation (infra/config.py), the launch template (EFA) and the docs agree. GPU counts
are informational: the nodes count their GPUs with `nvidia-smi -L` at boot.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class InstanceTypeInfo:
    gpus: int
    efa: bool          # supports an Elastic Fabric Adapter interface
    note: str = ""


INSTANCE_TYPES: dict[str, InstanceTypeInfo] = {
    # The original cluster's types (8 x V100).
    "p3.16xlarge": InstanceTypeInfo(gpus=8, efa=False),
    "p3dn.24xlarge": InstanceTypeInfo(gpus=8, efa=True),
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
