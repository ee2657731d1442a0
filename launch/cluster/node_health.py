"""Deep health checks of this cluster node, run by Slurm before every training attempt, and what
happens to a node that fails them.

    python -m launch.cluster.node_health [--prolog | --health-check] [--json] [--no-replace]
                                         [--node-name NAME] [--cluster-env PATH]
    python -m launch.cluster.node_health all-reduce --output FILE [--instance-type T]
                                         [--min-busbw GB/s] [--health-check] [--no-replace] [--json]

Checks on this node (launch/cluster/node_checks.py): the GPU count against the instance type
(infra/instance_types.py), GPU memory health (uncorrectable ECC errors, page retirement or row
remapping pending or failed), fatal Xid errors in the kernel log since boot, DCGM's quick
diagnostics where DCGM is installed, one EFA device per EFA interface, the aws-ofi-nccl plugin loading
on EFA nodes, the shared file systems answering within a time limit, free space on the local disks.
``all-reduce`` judges a saved nccl-tests output against the instance type's bus-bandwidth floor
(launch/cluster/all_reduce.py).

What happens when a check fails depends on the mode:

- ``--health-check`` (Slurm's HealthCheckProgram): the node is drained in Slurm
  (``scontrol update NodeName=<node> State=DRAIN Reason="<check>: <detail>"``); the check comes
  first in the reason because ``sinfo -R`` shows only its first 20 characters. Then its state
  (``scontrol show node -o``) decides: a node that holds a job (ALLOCATED, MIXED, COMPLETING) has
  its running jobs requeued (``scontrol requeue``: SIGTERM to the job, which saves a checkpoint)
  and stays; a node that is drained and idle (IDLE+DRAIN or DOWN+DRAIN) is replaced; an unreadable
  state leaves the node where it is. Slurm runs the program on drained nodes too, so the run after
  the job has left replaces the node.
- ``--prolog`` (Slurm's Prolog): the program exits non-zero; Slurm then drains the node and requeues
  the job by itself (held, unless slurm.conf has ``SchedulerParameters=nohold_on_prolog_fail``).
  The job has not started training, and the node is replaced.
  Slurm sets SLURMD_NODENAME for a Prolog, not for a HealthCheckProgram: there ``--node-name``
  names the node.
- Replacing means marking the instance Unhealthy in its auto-scaling group, which terminates and
  replaces it (off with ``--no-replace`` or ``NODE_HEALTH_REPLACE=false`` in cluster.env). The
  master is never replaced while slurmctld runs on it (ROLE=master in cluster.env): that would take
  the controller, the queue and rank 0 with it.
- The alerts topic is told which check failed on which node, with the tail of the check's output
  and what was done; the alert goes last so that it says so.
- Without a mode the checks only report: nothing is drained, replaced or alerted.

Every command a check runs has a time limit, and all checks of a run share a budget: Slurm kills a
HealthCheckProgram after 60 s, so in ``--health-check`` mode a hung ``nvidia-smi`` or mount leaves
time for the actions. Each check gets its share of what is left, so one hung command cannot starve
the checks after it, and a check that failed only by timing out runs once more before the node is
judged.

Exit status: 0 healthy, 1 unhealthy, 2 bad input (cluster.env, instance type, arguments, an
``all-reduce`` output of a single rank).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import socket
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from infra.instance_types import INSTANCE_TYPES
from infra.node_contract import EFS_MOUNT
from launch.aws import LaunchError
from launch.cluster import node_checks as nc
from launch.cluster.all_reduce import (  # noqa: F401  (the job script's entry points, re-exported)
    BUSBW_FLOORS, all_reduce_argv, floor_for, judge_all_reduce, parse_all_reduce_perf)
from launch.cluster.interruption import parse_job_ids, requeue_argv, running_jobs_argv
from launch.cluster.node_env import CLUSTER_ENV, read_cluster_env

ALL_REDUCE_CHECK = "all-reduce"

# cluster.env keys this program reads besides the stack's own (INSTANCE_TYPE, INSTANCE_ID, EFS_MOUNT,
# FSX_MOUNT, LOCAL_NVME, ALERTS_TOPIC_ARN, AWS_REGION, STACK_NAME, PRIVATE_IP).
REPLACE_KEY = "NODE_HEALTH_REPLACE"                # false: never mark the instance Unhealthy
MIN_FREE_KEY = "NODE_HEALTH_MIN_FREE_GIB"          # free space floor of / and LOCAL_NVME
FS_TIMEOUT_KEY = "NODE_HEALTH_FS_TIMEOUT_SECONDS"  # how long a shared mount may take to answer
EFA_INTERFACES_KEY = "EFA_INTERFACES"              # EFA interfaces the node was launched with

DEFAULT_MIN_FREE_GIB = 10.0
DEFAULT_FS_TIMEOUT_S = 30.0
DEFAULT_EFS_MOUNT = EFS_MOUNT
COMMAND_TIMEOUT_S = 60.0   # nvidia-smi, dmesg, fi_info, loading the NCCL plugin
DCGM_TIMEOUT_S = 300.0     # dcgmi diag -r 1 takes seconds; its setup can take longer on a loaded node
SCONTROL_TIMEOUT_S = 10.0  # scontrol retries an unreachable controller; the check must not wait on it
IMDS_TIMEOUT_S = 2.0
# Time all checks of one run share. Slurm kills a HealthCheckProgram that runs for more than 60 s
# (slurm.conf), so there the checks get 35 s and the drain, requeue or replacement and alert the rest; a Prolog
# or a run by hand may wait longer for a slow dcgmi or a slow mount.
CHECK_BUDGET_S = {"health-check": 35.0, "prolog": 240.0, None: 240.0}


class ConfigError(ValueError):
    """cluster.env or the arguments do not describe a node this program can check."""


@dataclass(frozen=True)
class NodeConfig:
    node_name: str
    instance_id: str | None
    instance_type: str
    expected_gpus: int
    expected_efa: int
    efs_mount: str
    fsx_mount: str | None = None
    local_nvme: str | None = None
    alerts_topic_arn: str | None = None
    region: str | None = None
    stack_name: str | None = None
    private_ip: str | None = None
    replace: bool = True
    min_free_gib: float = DEFAULT_MIN_FREE_GIB
    fs_timeout: float = DEFAULT_FS_TIMEOUT_S
    role: str = "worker"  # ROLE in cluster.env: the master runs slurmctld


def slurm_node_name(given: str | None = None) -> str:
    """The node's name in Slurm: ``given`` (--node-name), else SLURMD_NODENAME where slurmd sets it
    (a job's Prolog), else the short host name."""
    return given or os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def imds_get(path: str, *, timeout: float = IMDS_TIMEOUT_S) -> str | None:
    """One instance-metadata value over IMDSv2 (the launch template requires tokens); None when the
    service does not answer. AWS_EC2_METADATA_SERVICE_ENDPOINT and AWS_EC2_METADATA_DISABLED are
    the AWS SDKs' standard variables."""
    if os.environ.get("AWS_EC2_METADATA_DISABLED", "").lower() == "true":
        return None
    base = os.environ.get("AWS_EC2_METADATA_SERVICE_ENDPOINT", "http://169.254.169.254").rstrip("/")
    try:
        token_request = urllib.request.Request(
            f"{base}/latest/api/token", method="PUT",
            headers={"X-aws-ec2-metadata-token-ttl-seconds": "300"})
        with urllib.request.urlopen(token_request, timeout=timeout) as response:
            token = response.read().decode()
        request = urllib.request.Request(f"{base}/latest/meta-data/{path}",
                                         headers={"X-aws-ec2-metadata-token": token})
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.read().decode().strip() or None
    except (OSError, urllib.error.URLError):
        return None


def _bool(env: dict[str, str], key: str, default: bool) -> bool:
    value = env.get(key, "").strip().lower()
    if not value:
        return default
    if value in ("true", "yes", "1"):
        return True
    if value in ("false", "no", "0"):
        return False
    raise ConfigError(f"{key}={env[key]} in cluster.env: use true or false")


def _number(env: dict[str, str], key: str, default: float) -> float:
    value = env.get(key, "").strip()
    if not value:
        return default
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if number < 0:
        raise ConfigError(f"{key}={value} in cluster.env: give a number of at least 0")
    return number


def load_config(env: dict[str, str], *, replace: bool | None = None,
                instance_type: str | None = None, node_name: str | None = None) -> NodeConfig:
    """This node's settings from cluster.env, with the instance type from instance metadata where
    cluster.env lacks it. ``replace``: the command line's choice, over cluster.env's."""
    itype = instance_type or env.get("INSTANCE_TYPE") or imds_get("instance-type")
    if not itype:
        raise ConfigError("instance type unknown: cluster.env has no INSTANCE_TYPE and instance "
                          "metadata did not answer; add INSTANCE_TYPE=<type> to cluster.env")
    if itype not in INSTANCE_TYPES:
        raise ConfigError(f"instance type {itype} is not in infra/instance_types.py: add it there "
                          f"(GPUs, EFA cards) or correct INSTANCE_TYPE in cluster.env")
    info = INSTANCE_TYPES[itype]
    efa = env.get(EFA_INTERFACES_KEY, "").strip()
    if efa and not efa.isdigit():
        raise ConfigError(f"{EFA_INTERFACES_KEY}={efa} in cluster.env: give the number of EFA interfaces")
    return NodeConfig(
        node_name=slurm_node_name(node_name),
        instance_id=env.get("INSTANCE_ID") or None,  # from instance metadata when needed: with_identity
        instance_type=itype,
        expected_gpus=info.gpus,
        # A stack deployed with efa=false launches EFA-capable types without EFA interfaces.
        expected_efa=int(efa) if efa else info.efa_cards,
        efs_mount=env.get("EFS_MOUNT") or DEFAULT_EFS_MOUNT,
        fsx_mount=env.get("FSX_MOUNT") or None,
        local_nvme=env.get("LOCAL_NVME") or None,
        alerts_topic_arn=env.get("ALERTS_TOPIC_ARN") or None,
        region=env.get("AWS_REGION") or None,
        stack_name=env.get("STACK_NAME") or None,
        private_ip=env.get("PRIVATE_IP") or None,
        replace=_bool(env, REPLACE_KEY, True) if replace is None else replace,
        min_free_gib=_number(env, MIN_FREE_KEY, DEFAULT_MIN_FREE_GIB),
        fs_timeout=_number(env, FS_TIMEOUT_KEY, DEFAULT_FS_TIMEOUT_S) or DEFAULT_FS_TIMEOUT_S,
        role=env.get("ROLE") or "worker",
    )


# --- the checks -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class CheckResult:
    name: str
    status: str  # ok, fail or skip
    detail: str
    raw: str = ""
    timed_out: bool = False  # failed only because a command did not answer in time

    @property
    def failed(self) -> bool:
        return self.status == "fail"


def result_of(name: str, outcome: nc.Outcome) -> CheckResult:
    status = "skip" if outcome.skipped else ("ok" if outcome.ok else "fail")
    return CheckResult(name, status, outcome.detail, outcome.raw, outcome.timed_out and not outcome.ok)


# Each check with its arguments from the node's settings; ``limit(seconds)`` caps a command's time
# limit at the check's share of the run's budget.
Limit = Callable[[float], float]
CHECK_PLAN: dict[str, Callable[[NodeConfig, Limit], nc.Outcome]] = {
    "gpu-count": lambda cfg, limit: nc.check_gpu_count(expected=cfg.expected_gpus,
                                                       timeout=limit(COMMAND_TIMEOUT_S)),
    "gpu-health": lambda cfg, limit: nc.check_gpu_health(expected=cfg.expected_gpus,
                                                         timeout=limit(COMMAND_TIMEOUT_S)),
    "xid": lambda cfg, limit: nc.check_xid(expected_gpus=cfg.expected_gpus, timeout=limit(COMMAND_TIMEOUT_S)),
    "dcgm": lambda cfg, limit: nc.check_dcgm(expected_gpus=cfg.expected_gpus, timeout=limit(DCGM_TIMEOUT_S)),
    "efa": lambda cfg, limit: nc.check_efa(expected=cfg.expected_efa, timeout=limit(COMMAND_TIMEOUT_S)),
    "nccl-plugin": lambda cfg, limit: nc.check_nccl_plugin(expected_efa=cfg.expected_efa,
                                                           timeout=limit(COMMAND_TIMEOUT_S)),
    "shared-fs": lambda cfg, limit: nc.check_shared_fs(
        paths=[cfg.efs_mount] + ([cfg.fsx_mount] if cfg.fsx_mount else []), timeout=limit(cfg.fs_timeout)),
    "disk": lambda cfg, limit: nc.check_disk(paths=["/"] + ([cfg.local_nvme] if cfg.local_nvme else []),
                                             min_free_gib=cfg.min_free_gib),
}
CHECKS = tuple(CHECK_PLAN)
# The checks that run commands and so share the budget's time (disk reads a statfs, no command).
TIMED_CHECKS = tuple(name for name in CHECKS if name != "disk")


def _run_one(name: str, cfg: NodeConfig, limit: Limit) -> CheckResult:
    try:
        return result_of(name, CHECK_PLAN[name](cfg, limit))
    except Exception as err:  # noqa: BLE001  (reported as this check's failure, not a crash of all)
        return CheckResult(name, "fail", f"the check itself failed: {err!r}")


def run_checks(cfg: NodeConfig, *, budget_s: float = CHECK_BUDGET_S[None]) -> list[CheckResult]:
    """Every check of :data:`CHECKS`, in that order, within about ``budget_s`` seconds in all. A
    crash counts as a failure: the node could not be shown healthy.

    The budget is shared out as the checks go: each gets what is left divided by the checks still to
    run (at least one second), so a command that hangs takes its own share and no more, and the
    time a quick check leaves goes to the ones after it. A check that failed only because a command
    did not answer in time runs once more after all the others, with a share of what is left then:
    a stall that has passed by then does not make the node unhealthy; one that persists does."""
    deadline = time.monotonic() + budget_s

    def share(checks_left: int) -> Limit:
        return lambda seconds: max(1.0, min(seconds, (deadline - time.monotonic()) / max(1, checks_left)))

    results: dict[str, CheckResult] = {}
    timed_left = len(TIMED_CHECKS)
    for name in CHECKS:
        results[name] = _run_one(name, cfg, share(timed_left))
        timed_left -= name in TIMED_CHECKS
    retries = [name for name, r in results.items() if r.failed and r.timed_out]
    for i, name in enumerate(retries):
        first, again = results[name], _run_one(name, cfg, share(len(retries) - i))
        if again.failed:
            results[name] = dataclasses.replace(again, detail=f"{first.detail}; again on a retry: {again.detail}",
                                                raw=first.raw + again.raw)
        else:
            results[name] = dataclasses.replace(again, detail=f"{again.detail} (on a retry: the first try "
                                                              f"timed out, {first.detail})")
    return list(results.values())


def reason(failed: list[CheckResult]) -> str:
    """One line naming each failed check first, then its detail."""
    return "; ".join(f"{r.name}: {r.detail}" for r in failed).replace("\n", " ")


# --- what happens on failure ----------------------------------------------------------------------

DRAIN_REASON_CHARS = 200  # the reason is for people reading sinfo -R or scontrol show node
MODE_LABELS = {"health-check": "Slurm's HealthCheckProgram", "prolog": "Slurm's Prolog before a job"}
# The failed checks of the last alert. Under /run, where the Slurm wrappers live; removed when the
# node is healthy again, so that the next failure is alerted.
DEFAULT_STATE_FILE = "/run/maskrcnn/node-health-alerted"


@dataclass(frozen=True)
class ActionResult:
    action: str
    ok: bool
    message: str


def drain_argv(node: str, why: str) -> list[str]:
    if len(why) > DRAIN_REASON_CHARS:
        why = why[:DRAIN_REASON_CHARS - 3] + "..."
    return [nc.find_program("scontrol"), "update", f"NodeName={node}", "State=DRAIN", f"Reason={why}"]


def drain(node: str, why: str, *, timeout: float = SCONTROL_TIMEOUT_S) -> ActionResult:
    """Takes the node out of Slurm's scheduling; jobs running on it go on until they end."""
    result = nc.run_bounded(drain_argv(node, why), timeout=timeout)
    if result.ok:
        return ActionResult("drain", True, f"drained {node} in Slurm")
    return ActionResult("drain", False, f"could not drain {node} in Slurm: {result.problem}")


def _client(cfg: NodeConfig, service: str):
    """A client that gives up within seconds: the actions share the health check's last 25 s."""
    import boto3
    from botocore.config import Config
    config = Config(connect_timeout=3, read_timeout=5, retries={"max_attempts": 2, "mode": "standard"})
    return boto3.session.Session(region_name=cfg.region).client(service, config=config)


def mark_unhealthy(cfg: NodeConfig) -> ActionResult:
    """Tells the instance's auto-scaling group that it is unhealthy: the group terminates it and
    launches a replacement."""
    if not cfg.replace:
        return ActionResult("keep", True, f"not replaced: replacement is off ({REPLACE_KEY}=false "
                                             f"or --no-replace); the instance stays for debugging")
    if not cfg.instance_id:
        return ActionResult("replace", False, "could not mark the instance unhealthy: instance id "
                                              "unknown (no INSTANCE_ID in cluster.env, no instance metadata)")
    from botocore.exceptions import BotoCoreError, ClientError
    try:
        _client(cfg, "autoscaling").set_instance_health(
            InstanceId=cfg.instance_id, HealthStatus="Unhealthy", ShouldRespectGracePeriod=False)
    except (BotoCoreError, ClientError) as err:
        return ActionResult("replace", False, f"could not mark {cfg.instance_id} unhealthy: {err}")
    return ActionResult("replace", True, f"marked {cfg.instance_id} Unhealthy in its auto-scaling "
                                         f"group, which terminates and replaces it")


def alert_text(cfg: NodeConfig, failed: list[CheckResult], actions: list[ActionResult],
               mode: str) -> tuple[str, str]:
    """(subject, message) for the alerts topic."""
    names = ", ".join(r.name for r in failed)
    subject = f"{cfg.stack_name or 'cluster'}: node {cfg.node_name} unhealthy ({names})"
    where = ", ".join(x for x in (cfg.instance_type, cfg.private_ip) if x)
    lines = [f"The node health check, run as {MODE_LABELS[mode]}, failed on node {cfg.node_name}, "
             f"instance {cfg.instance_id or 'unknown'} ({where}).", "", "Failed checks:"]
    lines += [f"  {r.name}: {r.detail}" for r in failed]
    lines += ["", "What was done:"]
    if mode == "prolog":
        lines.append("  the Slurm prolog failed: Slurm drains the node and requeues the job")
    lines += [f"  {a.message}" for a in actions]
    for r in failed:
        if r.raw.strip():
            lines += ["", f"Output of {r.name} (last {nc.TAIL_LINES} lines):", nc.tail(r.raw)]
    return subject[:100], "\n".join(lines)  # SNS takes subjects of up to 100 characters


def alert(cfg: NodeConfig, subject: str, message: str) -> ActionResult:
    if not cfg.alerts_topic_arn:
        return ActionResult("alert", False, "no alert sent: cluster.env has no ALERTS_TOPIC_ARN")
    from botocore.exceptions import BotoCoreError, ClientError
    try:
        _client(cfg, "sns").publish(TopicArn=cfg.alerts_topic_arn, Subject=subject, Message=message)
    except (BotoCoreError, ClientError) as err:
        return ActionResult("alert", False, f"could not publish to {cfg.alerts_topic_arn}: {err}")
    return ActionResult("alert", True, f"alert sent to {cfg.alerts_topic_arn}")


def with_identity(cfg: NodeConfig) -> NodeConfig:
    """``cfg`` with the instance id from instance metadata when cluster.env has none."""
    return cfg if cfg.instance_id else dataclasses.replace(cfg, instance_id=imds_get("instance-id"))


# Slurm's node states (scontrol show node: a base state, then flags joined by "+", as in
# State=MIXED+DRAIN). A node in one of these holds a job; one that is drained (DRAIN flag) and
# IDLE or DOWN holds none: sinfo calls it "drained", and only then is it replaced.
BUSY_STATES = frozenset({"ALLOCATED", "MIXED", "COMPLETING"})
IDLE_STATES = frozenset({"IDLE", "DOWN"})
_STATE = re.compile(r"(?:^|\s)State=(\S+)")


def node_state_argv(node: str) -> list[str]:
    return [nc.find_program("scontrol"), "show", "node", "-o", node]


def parse_node_state(text: str) -> frozenset[str] | None:
    """The state words of ``scontrol show node -o`` output (``State=IDLE+DRAIN`` gives IDLE and
    DRAIN), or None when it names no state."""
    found = _STATE.search(text)
    return frozenset(found[1].split("+")) if found else None


def holds_job(states: frozenset[str]) -> bool:
    return bool(states & BUSY_STATES)


def is_drained(states: frozenset[str]) -> bool:
    """Drained and idle (IDLE+DRAIN or DOWN+DRAIN): no job runs on the node and none will start."""
    return "DRAIN" in states and bool(states & IDLE_STATES) and not holds_job(states)


def read_node_state(node: str) -> tuple[frozenset[str] | None, str]:
    """This node's Slurm state, and how it reads (for the report), or None and why not."""
    result = nc.run_bounded(node_state_argv(node), timeout=SCONTROL_TIMEOUT_S)
    states = parse_node_state(result.stdout) if result.ok else None
    if states is None:
        why = result.problem if not result.ok else "no State= in scontrol's answer"
        return None, f"could not read {node}'s state in Slurm: {why}"
    return states, _STATE.search(result.stdout)[1]


def requeue_jobs(node: str) -> list[ActionResult]:
    """Requeues the jobs running on ``node``: Slurm sends every process of each job SIGTERM (the
    ranks save a checkpoint and write stopped.json) and SIGKILL after KillWait, then queues the job
    again; the drained node takes no part in its next attempt."""
    listing = nc.run_bounded(running_jobs_argv(node), timeout=SCONTROL_TIMEOUT_S)
    if not listing.ok:
        return [ActionResult("requeue", False, f"could not list the jobs on {node}: {listing.problem}")]
    actions = []
    for job in parse_job_ids(listing.stdout):
        done = nc.run_bounded(requeue_argv(job), timeout=SCONTROL_TIMEOUT_S)
        actions.append(ActionResult("requeue", True, f"requeued job {job}: it saves a checkpoint on SIGTERM "
                                                     f"and resumes on other nodes") if done.ok else
                       ActionResult("requeue", False, f"could not requeue job {job}: {done.problem}"))
    return actions


def controller_here(cfg: NodeConfig) -> bool:
    """Whether this node is the master with slurmctld running: replacing it would take the queue,
    the controller and rank 0 with it."""
    if cfg.role != "master":
        return False
    for comm in Path("/proc").glob("[0-9]*/comm"):
        try:
            if comm.read_text().strip() == "slurmctld":
                return True
        except OSError:  # the process ended while we looked
            continue
    return False


def act_on_failure(cfg: NodeConfig, failed: list[CheckResult], *, mode: str,
                   state_file: Path | None = None) -> list[ActionResult]:
    """``mode``: health-check (drain here) or prolog (Slurm drains after the non-zero exit).
    ``cfg`` as :func:`with_identity` completes it. ``state_file``: where the failed checks of the
    last alert are kept, so that a failure that persists is alerted once, not at every run (Slurm
    runs the health check on drained nodes too, every HealthCheckInterval).

    No node is taken from a running job: in health-check mode a node that holds a job is drained and
    its jobs requeued (they stop gracefully), and it is marked Unhealthy only once it is drained and
    idle, by a later run. A failed Prolog holds only the job about to start, which Slurm requeues.
    The master is never marked Unhealthy while slurmctld runs on it."""
    actions = []
    states = None
    if mode == "health-check":
        actions.append(drain(cfg.node_name, reason(failed)))
        states, read = read_node_state(cfg.node_name)
        if states is None:
            actions.append(ActionResult("state", False, read))
        elif holds_job(states):
            actions += requeue_jobs(cfg.node_name)
    if controller_here(cfg):
        actions.append(ActionResult("keep", True, f"not replaced: slurmctld runs on this node ({cfg.node_name}); "
                                                  f"it stays drained as a compute node and keeps the queue. "
                                                  f"Replace the master by hand when no job needs it"))
    elif mode == "prolog":
        actions.append(mark_unhealthy(cfg))
    elif states is None:
        actions.append(ActionResult("keep", True, "not replaced while it may hold a job: the next health "
                                                  "check decides"))
    elif not is_drained(states):
        actions.append(ActionResult("keep", True, f"not replaced yet: {cfg.node_name} is {read} in Slurm; "
                                                  f"a later health check replaces it once it is drained and "
                                                  f"idle (IDLE+DRAIN or DOWN+DRAIN)"))
    else:
        actions.append(ActionResult("state", True, f"{cfg.node_name} is {read} in Slurm: drained and idle, "
                                                   f"no job runs on it"))
        actions.append(mark_unhealthy(cfg))
    # A replacement is news even when the failure was alerted before, while its job stopped.
    key = ",".join(r.name for r in failed) + (":replaced" if actions[-1].action == "replace" else "")
    if state_file is not None and _read(state_file) == key:
        actions.append(ActionResult("alert", True, f"no new alert: one was sent for {key} already"))
        return actions
    subject, message = alert_text(cfg, failed, actions, mode)
    actions.append(alert(cfg, subject, message))
    if actions[-1].ok and state_file is not None:
        try:
            state_file.parent.mkdir(parents=True, exist_ok=True)
            state_file.write_text(key + "\n")
        except OSError as err:
            actions.append(ActionResult("alert", False, f"cannot record the alert in {state_file}: {err}"))
    return actions


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


# --- command line ---------------------------------------------------------------------------------

def _report(cfg: NodeConfig, results: list[CheckResult], actions: list[ActionResult], *, as_json: bool) -> None:
    failed = [r for r in results if r.failed]
    if as_json:
        print(json.dumps({
            "node": cfg.node_name, "instance_id": cfg.instance_id, "instance_type": cfg.instance_type,
            "healthy": not failed,
            "checks": [{k: v for k, v in asdict(r).items() if k != "raw"} for r in results],
            "actions": [asdict(a) for a in actions],
        }, indent=2))
    else:
        for r in results:
            print(f"{r.status.upper() if r.failed else r.status:4}  {r.name:11}  {r.detail}")
        for a in actions:
            print(f"{'done' if a.ok else 'FAILED':6}  {a.message}")
    if failed:
        print(f"unhealthy: {reason(failed)}", file=sys.stderr)
    else:
        passed = sum(r.status == "ok" for r in results)
        skips = len(results) - passed
        print(f"healthy: node {cfg.node_name} ({cfg.instance_type}) passed {passed} check(s)"
              + (f", {skips} skipped" if skips else ""), file=sys.stderr)


def _mode(args: argparse.Namespace) -> str | None:
    return "prolog" if args.prolog else ("health-check" if args.health_check else None)


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cluster-env", default=CLUSTER_ENV, help=f"default {CLUSTER_ENV}")
    p.add_argument("--no-replace", dest="replace", action="store_const", const=False, default=None,
                   help=f"never mark the instance Unhealthy (as {REPLACE_KEY}=false in cluster.env)")
    p.add_argument("--node-name", help="this node's name in Slurm (default: SLURMD_NODENAME, else the "
                                       "short host name)")
    p.add_argument("--state-file", default=DEFAULT_STATE_FILE,
                   help=f"where the last alert's failed checks are kept (default {DEFAULT_STATE_FILE})")
    p.add_argument("--json", action="store_true", help="print the results as JSON")


def check_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m launch.cluster.node_health",
                                description="Deep health checks of this cluster node, for Slurm.",
                                epilog=f"Judging a saved all_reduce_perf output: python -m "
                                       f"launch.cluster.node_health {ALL_REDUCE_CHECK} --help")
    modes = p.add_mutually_exclusive_group()
    modes.add_argument("--prolog", action="store_true",
                       help="Slurm Prolog: exit non-zero when unhealthy (Slurm drains and requeues)")
    modes.add_argument("--health-check", action="store_true",
                       help="Slurm HealthCheckProgram: drain this node when unhealthy")
    _add_common(p)
    args = p.parse_args(argv)
    try:
        cfg = load_config(read_cluster_env(args.cluster_env), replace=args.replace,
                          node_name=args.node_name)
    except (ConfigError, LaunchError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    mode = _mode(args)
    results = run_checks(cfg, budget_s=CHECK_BUDGET_S[mode])
    failed = [r for r in results if r.failed]
    actions = []
    if failed and mode:
        cfg = with_identity(cfg)
        actions = act_on_failure(cfg, failed, mode=mode, state_file=Path(args.state_file))
    elif not failed:
        Path(args.state_file).unlink(missing_ok=True)
    _report(cfg, results, actions, as_json=args.json)
    return 1 if failed else 0


def all_reduce_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m launch.cluster.node_health all-reduce",
                                description="Judge a saved all_reduce_perf output (nccl-tests) against "
                                            "the instance type's bus-bandwidth floor.")
    p.add_argument("--output", required=True, help="the saved output of all_reduce_perf")
    p.add_argument("--instance-type", help="the nodes' type (default: INSTANCE_TYPE in cluster.env)")
    p.add_argument("--min-busbw", type=float, help="floor in GB/s instead of the instance type's")
    p.add_argument("--health-check", action="store_true",
                   help="when the check fails, drain, replace and alert as the node health check does, "
                        "for the node this runs on")
    _add_common(p)
    args = p.parse_args(argv)
    try:
        text = Path(args.output).read_text(errors="replace")
    except OSError as err:
        print(f"error: cannot read --output {args.output}: {err.strerror}", file=sys.stderr)
        return 2
    try:
        env = read_cluster_env(args.cluster_env) if (args.health_check or not args.instance_type) else {}
        cfg = load_config(env, replace=args.replace, instance_type=args.instance_type,
                          node_name=args.node_name)
        floor = floor_for(cfg.instance_type, efa=cfg.expected_efa > 0, override_gbps=args.min_busbw)
    except (ConfigError, LaunchError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    verdict = judge_all_reduce(text, floor_gbps=floor, efa=cfg.expected_efa > 0)
    if not verdict.fabric_judged:
        # Nothing about the node or the fabric is known from it: refused as input, nothing is done.
        print(f"error: --output {args.output}: {'; '.join(verdict.problems)}", file=sys.stderr)
        return 2
    result = CheckResult(ALL_REDUCE_CHECK, "ok" if verdict.ok else "fail", verdict.detail, text)
    actions = []
    if result.failed and args.health_check:
        cfg = with_identity(cfg)
        actions = act_on_failure(cfg, [result], mode="health-check", state_file=Path(args.state_file))
    _report(cfg, [result], actions, as_json=args.json)
    return 0 if verdict.ok else 1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == [ALL_REDUCE_CHECK]:
        return all_reduce_main(argv[1:])
    return check_main(argv)


if __name__ == "__main__":
    sys.exit(main())
