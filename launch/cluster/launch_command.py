"""The one place that states how a multi-node Horovod job is started: mpirun flags, the NCCL/EFA and
Horovod environment, and the training command. The EC2 cluster's Slurm job (launch/cluster/job.py)
uses :func:`mpirun_in_allocation`; the SageMaker entry passes :func:`horovod_env` on to its MPI runner.

Why these flags:
- ``-bind-to none -map-by slot``: one rank per GPU slot, no CPU pinning (the data loader's threads
  need all cores of a node).
- ``-mca pml ob1 -mca btl ^openib`` and excluding ``lo``/``docker0`` for both MPI's TCP transport
  and NCCL's socket interface: with ``--network host`` the container sees docker0, and MPI or NCCL
  picking it (or lo) is the classic cause of a job that hangs at the first allreduce.
- ``orte_abort_on_non_zero_status``: one failed rank ends the whole job (so the run can resume)
  instead of leaving the others blocked in a collective.
- ``mpi_yield_when_idle``: a rank waiting in MPI (Horovod's background thread negotiates through MPI
  collectives every cycle) yields its core instead of busy-polling it. Busy ranks take a core each
  from the input workers and from ranks still building their first step; measured on 3 CPU ranks
  sharing 2 cores, the first two steps took 17 s with polling and 7 s with yielding (docs/launch.md).
- Horovod's stall shutdown: a rank stalled for this long aborts the job rather than hanging it.
- ``-x FI_PROVIDER=efa`` on EFA instances routes NCCL through the EFA libfabric provider;
  ``FI_EFA_USE_DEVICE_RDMA=1`` only when every node's type has RDMA read (libfabric aborts on an
  EFA device without it, e.g. p3dn, g5); elsewhere libfabric decides from the device.
"""
from __future__ import annotations

import shlex
from collections.abc import Collection

EXCLUDED_INTERFACES = ("lo", "docker0")

# Horovod tensor fusion: the values AWS's DLAMI cluster example (awslabs/deeplearning-cfn) used for
# Mask R-CNN.
HOROVOD_ENV = {
    "HOROVOD_CYCLE_TIME": "0.5",
    "HOROVOD_FUSION_THRESHOLD": "67108864",
    # Warn after 60 s of a rank missing a collective, abort after 30 min (default: hang forever).
    "HOROVOD_STALL_CHECK_TIME_SECONDS": "60",
    "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "1800",
}

# Instance families whose EFA device supports RDMA read (one table for the cluster and the checks;
# SageMaker's MPI runner keeps its own, sagemaker_training.SM_EFA_RDMA_INSTANCES, which agrees).
# EFA without RDMA read: p3dn, g4dn, g5, g6, g6e, ... There, FI_EFA_USE_DEVICE_RDMA=1 makes libfabric abort.
EFA_RDMA_READ_FAMILIES = frozenset({"p4d", "p4de", "p5", "p5e", "p5en", "p6-b200", "p6-b300", "p6e-gb200"})

# Open MPI parameters for every MPI job (EC2 cluster and the script-mode job under the SDK's MPI driver:
# -mca flags; the SageMaker entry: OMPI_MCA_ variables). Open MPI yields on its own only when it knows
# a node is oversubscribed; a rank alone on its host (one per instance) polls at full speed otherwise.
MPI_MCA = {"mpi_yield_when_idle": "1"}

# Variables every rank needs from the launching shell.
PASSED_THROUGH = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "TF_USE_LEGACY_KERAS", "TF_CPP_MIN_LOG_LEVEL")


def efa_rdma_read(instance_type: str) -> bool:
    """Whether ``instance_type`` (EC2 ``p4d.24xlarge`` or SageMaker ``ml.p4d.24xlarge``) has EFA RDMA read."""
    name = instance_type.removeprefix("ml.")
    return name.split(".", 1)[0] in EFA_RDMA_READ_FAMILIES


def nccl_env(*, efa: bool, instance_types: Collection[str] = (),
             socket_interface: str | None = None) -> dict[str, str]:
    """``instance_types``: the job's node types; RDMA read is forced on only when all of them have it.
    ``socket_interface``: the interface the platform chose for the job (SageMaker's
    ``network_interface_name``): NCCL uses exactly that one; else any interface but lo and docker0.
    """
    env = {
        "NCCL_SOCKET_IFNAME": socket_interface or "^" + ",".join(reversed(EXCLUDED_INTERFACES)),  # ^docker0,lo
        "NCCL_DEBUG": "WARN",
    }
    if efa:
        env["FI_PROVIDER"] = "efa"
        if instance_types and all(efa_rdma_read(t) for t in instance_types):
            env["FI_EFA_USE_DEVICE_RDMA"] = "1"
    return env


def horovod_env(*, efa: bool, instance_types: Collection[str] = (),
                socket_interface: str | None = None) -> dict[str, str]:
    """Environment every rank gets: NCCL/EFA interface choice plus Horovod tuning."""
    return {**nccl_env(efa=efa, instance_types=instance_types, socket_interface=socket_interface),
            **HOROVOD_ENV}


def mca_flags() -> list[str]:
    """:data:`MPI_MCA` as mpirun's ``-mca KEY VALUE`` flags."""
    return [arg for key, value in MPI_MCA.items() for arg in ("-mca", key, value)]


def mca_env() -> dict[str, str]:
    """:data:`MPI_MCA` as environment variables: mpirun reads them and passes them on to every rank."""
    return {f"OMPI_MCA_{key}": value for key, value in MPI_MCA.items()}


def train_command(*, logdir: str, data_dir: str, overrides: list[str], python: str = "python") -> list[str]:
    """``python -m training.train`` with the data directory and the user's KEY=VALUE overrides.

    The user's overrides come last, so a DATA.BASEDIR given by the user wins over ``data_dir``.
    """
    return [python, "-m", "training.train", "--logdir", logdir,
            "--config", f"DATA.BASEDIR={data_dir}", *overrides]


# TCP keepalive on mpirun's connections to the other nodes' Open MPI daemons (10 s idle, then 3
# probes 5 s apart): a node that vanishes without a TCP reset (a dead instance, a network partition)
# ends the job in about 25 s instead of Open MPI's default 8 minutes (300 s + 9 x 20 s).
OOB_KEEPALIVE = {"oob_tcp_keepalive_time": "10", "oob_tcp_keepalive_intvl": "5", "oob_tcp_keepalive_probes": "3"}


def _mpirun(ranks: int, placement: list[str], train: list[str], *, efa: bool,
            instance_types: Collection[str]) -> list[str]:
    excluded = ",".join(EXCLUDED_INTERFACES)
    cmd = [
        "mpirun", "--allow-run-as-root",
        "-np", str(ranks),
        *placement,
        "-bind-to", "none", "-map-by", "slot",
        "-mca", "pml", "ob1",
        "-mca", "btl", "^openib",
        "-mca", "btl_tcp_if_exclude", excluded,
        "-mca", "oob_tcp_if_exclude", excluded,
        "-mca", "orte_abort_on_non_zero_status", "1",
        *[arg for key, value in OOB_KEEPALIVE.items() for arg in ("-mca", key, value)],
        *mca_flags(),
        "--tag-output",
    ]
    for key, value in horovod_env(efa=efa, instance_types=instance_types).items():
        cmd += ["-x", f"{key}={value}"]
    for key in PASSED_THROUGH:
        cmd += ["-x", key]
    return cmd + train


def mpirun_in_allocation(*, ranks: int, train: list[str], efa: bool = False,
                         instance_types: Collection[str] = ()) -> list[str]:
    """``mpirun`` inside a Slurm job: Open MPI reads the nodes and slots from the allocation and
    starts its daemons with srun, so no hostfile and no SSH."""
    if ranks < 1:
        raise ValueError("a job needs at least one rank")
    return _mpirun(ranks, [], train, efa=efa, instance_types=instance_types)


def format_command(argv: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)
