"""The multi-node all-reduce check: run nccl-tests' ``all_reduce_perf`` across the job's nodes,
then judge its output against a bus-bandwidth floor for the instance type.

What is judged, from the text ``all_reduce_perf`` prints at its end (nccl-tests ``common.cu``):

- ``# Avg bus bandwidth    : <GB/s>``: the mean bus bandwidth over every message size of the
  sweep, out-of-place and in-place. It depends on the sweep, so the floors below are for the sweep
  :data:`SWEEP` (8 B to 1 GiB, doubling, one GPU per rank) and nothing else.
- ``# Out of bounds values : <n> OK|FAILED``: wrong results on any rank fail the check whatever
  the bandwidth.
- With ``NCCL_DEBUG=INFO`` (set by :func:`all_reduce_argv`), NCCL names the transport it chose
  (``NCCL INFO Using network AWS Libfabric`` or ``... Using network Socket``): on an EFA instance
  type, TCP sockets mean the EFA path is broken even before the numbers say so.
- The ranks under ``# Using devices`` (``#  Rank  0 Group  0 Pid ...``): nccl-tests defines the bus
  bandwidth as algbw x 2(n-1)/n for n ranks, 0 for a single rank, which also sends nothing over
  NVLink or a network (NCCL still names a transport). A single rank's output says nothing about
  the fabric and is not judged as one.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from launch.cluster.launch_command import mpirun_in_allocation, nccl_env

# nccl-tests arguments of the sweep the floors are for: -b min bytes, -e max bytes, -f step factor,
# -g GPUs per rank (one rank per GPU).
SWEEP = ("-b", "8", "-e", "1G", "-f", "2", "-g", "1")

_AVG_BUSBW = re.compile(r"#\s*Avg bus bandwidth\s*:\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)")
_OUT_OF_BOUNDS = re.compile(r"#\s*Out of bounds values\s*:\s*(\d+)\s*(OK|FAILED)?")
_NETWORK = re.compile(r"NCCL INFO Using network (.+?)\s*$", re.MULTILINE)
_RANK = re.compile(r"#\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\b")


@dataclass(frozen=True)
class BusBwFloor:
    """The lowest ``# Avg bus bandwidth`` (GB/s) of a healthy run of :data:`SWEEP` across two or
    more nodes of one instance type, and where the number comes from."""
    gbps: float
    source: str


# Published p4d.24xlarge run: aws-samples/aws-efa-eks README, 2 nodes x 8 A100 over EFA with GPUDirect
# RDMA, all_reduce_perf -b 8 -e 1G -f 2 -g 1 (NCCL 2.8.3, aws-ofi-nccl): "# Avg bus bandwidth :
# 7.80081", 32.7 GB/s bus bandwidth at 1 GiB. Newer NCCL and plugin releases reach more (NVIDIA/nccl's
# GitHub issue 527: 57 GB/s at 1 GiB on 2 nodes), so 75% of the older run is a floor a healthy node clears
# with room to spare, and a fall-back to TCP sockets (about 1-2 GB/s averaged over this sweep) does not.
_P4D = BusBwFloor(5.8, "75% of 7.80 GB/s, the published 2-node p4d.24xlarge run of this sweep "
                       "(aws-samples/aws-efa-eks)")
# No published run of this sweep was found for the H100/H200/B200 types. Their EFA bandwidth is 8x
# p4d's (3200 against 400 Gbps) and their NVLink faster, so the p4d floor is a lower bound for them:
# it catches a fall-back to sockets, not a partly degraded fabric (the per-node EFA device count
# catches a missing device).
_P4D_AS_LOWER_BOUND = BusBwFloor(_P4D.gbps, "the p4d.24xlarge floor, as a lower bound: no published "
                                            "run of this sweep for this type")
BUSBW_FLOORS: dict[str, BusBwFloor] = {
    "p4d.24xlarge": _P4D,
    "p5.48xlarge": _P4D_AS_LOWER_BOUND,
    "p5e.48xlarge": _P4D_AS_LOWER_BOUND,
    "p5en.48xlarge": _P4D_AS_LOWER_BOUND,
    "p6-b200.48xlarge": _P4D_AS_LOWER_BOUND,
}


# With EFA off (efa=false) NCCL runs over TCP sockets on one ENA interface. The only figures for
# this sweep over sockets are this project's reconstruction (tests/recorded_machines/p4d-low-busbw,
# about 1.5 GB/s, not a measurement) and the H200 recording, a single rank whose bus bandwidth is 0
# by definition: no healthy multi-node run over sockets is on record, so there is no floor to judge
# it by. A sockets run is still run and judged on finishing with correct values, which catches a
# node that cannot reach the others, a hung transport and wrong results.
SOCKETS_NO_FLOOR = ("no bus-bandwidth floor over TCP sockets (EFA is off): no healthy multi-node "
                    "run of this sweep over sockets is recorded to set one by; judged on finishing "
                    "with correct values only")


SINGLE_RANK = ("1 rank: its bus bandwidth is 0 by definition (nccl-tests: busbw = algbw x 2(n-1)/n) and "
               "it sends nothing over NVLink or the network, so this run says nothing about the fabric: "
               "run all_reduce_perf across two or more nodes, one rank per GPU")


class AllReduceOutputError(ValueError):
    """The output has no result to judge (the run failed or was cut short)."""


def parse_all_reduce_perf(text: str) -> float:
    """The ``# Avg bus bandwidth`` of an ``all_reduce_perf`` run, in GB/s. Lines may carry
    mpirun's ``--tag-output`` prefix (``[1,0]<stdout>:``). The last such line counts."""
    found = _AVG_BUSBW.findall(text)
    if not found:
        raise AllReduceOutputError(
            "no '# Avg bus bandwidth' line: all_reduce_perf did not finish (read the end of its "
            "output for the NCCL or MPI error)")
    return float(found[-1])


def parse_out_of_bounds(text: str) -> int | None:
    """Number of wrong values all_reduce_perf found (``# Out of bounds values``), None if absent."""
    found = _OUT_OF_BOUNDS.findall(text)
    return int(found[-1][0]) if found else None


def parse_networks(text: str) -> set[str]:
    """The NCCL network transports named in the output (``Using network ...``; needs NCCL_DEBUG=INFO)."""
    return {name.strip() for name in _NETWORK.findall(text)}


def parse_ranks(text: str) -> int | None:
    """How many ranks the run had (the ``# Using devices`` list), None where the list is missing."""
    ranks = set(_RANK.findall(text))
    return len(ranks) or None


@dataclass(frozen=True)
class AllReduceVerdict:
    ok: bool
    busbw_gbps: float | None
    floor_gbps: float | None     # None: no bandwidth floor (TCP sockets, SOCKETS_NO_FLOOR)
    problems: tuple[str, ...]
    ranks: int | None = None     # None: the output lists no ranks

    @property
    def fabric_judged(self) -> bool:
        """False for a single rank's output, which cannot show a fabric's health."""
        return self.ranks != 1

    @property
    def floor_text(self) -> str:
        return "no floor over TCP sockets" if self.floor_gbps is None else f"floor {self.floor_gbps:g} GB/s"

    @property
    def detail(self) -> str:
        measured = "no result" if self.busbw_gbps is None else f"{self.busbw_gbps:g} GB/s"
        if self.ok:
            return f"avg bus bandwidth {measured} ({self.floor_text})"
        return "; ".join(self.problems)


def floor_for(instance_type: str, *, efa: bool, override_gbps: float | None = None) -> float | None:
    """The floor to judge ``instance_type`` by: ``override_gbps`` when given; else, over EFA, the
    table's; over TCP sockets (``efa`` false) none (:data:`SOCKETS_NO_FLOOR`)."""
    if override_gbps is not None:
        if override_gbps <= 0:
            raise ValueError(f"--min-busbw {override_gbps:g}: give a bus bandwidth in GB/s above 0")
        return override_gbps
    if not efa:
        return None
    if instance_type not in BUSBW_FLOORS:
        known = ", ".join(BUSBW_FLOORS)
        raise ValueError(f"no bus-bandwidth floor is recorded for {instance_type} (known: {known}): "
                         f"pass --min-busbw GB/s, e.g. 75% of a healthy run of this sweep on it")
    return BUSBW_FLOORS[instance_type].gbps


def judge_all_reduce(text: str, *, floor_gbps: float | None, efa: bool) -> AllReduceVerdict:
    """Whether one ``all_reduce_perf`` output shows a healthy fabric. ``efa``: the nodes have EFA,
    so NCCL must not have fallen back to TCP sockets. ``floor_gbps`` None: no bandwidth floor."""
    problems: list[str] = []
    ranks = parse_ranks(text)
    try:
        busbw: float | None = parse_all_reduce_perf(text)
    except AllReduceOutputError as err:
        busbw = None
        problems.append(str(err))
    if ranks == 1:
        problems.append(SINGLE_RANK)
    elif busbw is not None and floor_gbps is not None and busbw < floor_gbps:
        problems.append(f"avg bus bandwidth {busbw:g} GB/s is below the floor of {floor_gbps:g} GB/s")
    wrong = parse_out_of_bounds(text)
    if wrong:
        problems.append(f"{wrong} wrong values (# Out of bounds values)")
    networks = parse_networks(text)
    if efa and "Socket" in networks and ranks != 1:
        problems.append("NCCL used TCP sockets, not EFA (Using network Socket): the EFA path "
                        "(libfabric, aws-ofi-nccl, FI_PROVIDER) is broken on at least one node")
    return AllReduceVerdict(not problems, busbw, floor_gbps, tuple(problems), ranks)


def all_reduce_argv(binary: str, *, nodes: int, gpus_per_node: int, instance_type: str, efa: bool,
                    launcher: str = "mpirun") -> list[str]:
    """The command that runs :data:`SWEEP` over ``nodes`` x ``gpus_per_node`` ranks inside a Slurm
    allocation (the job script's), one rank per GPU.

    ``launcher``: ``mpirun`` (Open MPI reads the allocation and starts its daemons with srun; the
    flags the training job uses, from launch_command) or ``srun`` (Slurm starts the ranks itself
    through PMIx). Either way NCCL gets the training job's network settings, plus NCCL_DEBUG=INFO
    so that the output names the transport NCCL chose.
    """
    if nodes < 1 or gpus_per_node < 1:
        raise ValueError(f"{nodes} node(s) x {gpus_per_node} GPU(s): both must be at least 1")
    ranks = nodes * gpus_per_node
    test = [binary, *SWEEP]
    if launcher == "mpirun":
        argv = mpirun_in_allocation(ranks=ranks, train=test, efa=efa, instance_types=[instance_type])
        return ["NCCL_DEBUG=INFO" if arg.startswith("NCCL_DEBUG=") else arg for arg in argv]
    if launcher == "srun":
        env = {**nccl_env(efa=efa, instance_types=[instance_type]), "NCCL_DEBUG": "INFO"}
        # Through env(1) on each node rather than srun --export, which splits its list at commas
        # (NCCL_SOCKET_IFNAME's value has one).
        return ["srun", f"--nodes={nodes}", f"--ntasks={ranks}", f"--ntasks-per-node={gpus_per_node}",
                "--mpi=pmix", "env", *(f"{key}={value}" for key, value in env.items()), *test]
    raise ValueError(f"launcher {launcher!r}: use 'mpirun' or 'srun'")
