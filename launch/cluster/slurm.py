"""Slurm on the EC2 cluster: the configuration every node shares and the daemons each node runs.

Slurm runs inside each node's training container (docs/launch.md, "Jobs on Slurm", says why):
munged on every node, slurmctld on the master, slurmd on every node (the master too: it runs rank 0).
The master writes slurm.conf, with the cluster's own settings from custom.conf on EFS merged in; the
other nodes fetch it from slurmctld (configless mode), so one file is the whole configuration.

Node names are fixed: ``master`` and ``worker-1`` .. ``worker-N`` (N: the worker group's size),
declared ``State=CLOUD``. A node that boots claims a free name (an atomic mkdir on EFS; a name whose
instance has left its auto-scaling group is free again) and registers under it; slurmctld takes the
node's address from that registration (``cloud_reg_addrs``). So a replacement instance at a new
address takes over the name of the node it replaces, and the node list never changes: Slurm before
23.11 adds or removes nodes only by restarting every daemon.

``python -m launch.cluster.slurm node`` is the container's ``cluster-node`` command: it starts the
daemons in the foreground and exits when any of them exits (Docker then restarts the container).
A worker also exits when the master it registered with has been replaced (the controller file on
EFS names another address): its slurmd would go on sending to the old address, so the restarted
container registers with the new slurmctld, which found the queue on EFS.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from infra.node_contract import MUNGE_KEY   # written by the boot script from Secrets Manager
from launch.aws import LaunchError
from launch.cluster.node_env import CLUSTER_ENV, read_cluster_env

PARTITION = "train"
MASTER_NODE = "master"
WORKER_PREFIX = "worker-"
SLURM_ETC = Path("/etc/slurm")
MUNGE_SOCKET = "/run/munge/munge.socket.2"  # the default socket the Slurm daemons and commands use
SLURMCTLD_PORT = 6817
# A node's health checks (launch/cluster/node_health.py), run by slurmd every HealthCheckInterval
# and before every job (Prolog). Slurm runs a program path without arguments and with a bare
# environment, so each node writes these two wrappers at start with its own Python and code path.
PROGRAM_DIR = Path("/run/maskrcnn")
HEALTH_CHECK_PROGRAM = PROGRAM_DIR / "node-check"
PROLOG_PROGRAM = PROGRAM_DIR / "job-prolog"
# A node whose slurmd has not answered for this long is DOWN and its jobs are requeued: a node that
# vanished without a TCP reset is noticed within a minute.
SLURMD_TIMEOUT_S = 60
# Between SIGTERM and SIGKILL when a job is stopped or requeued: training saves a checkpoint at the
# next step on SIGTERM (SageMaker allows the same 120 s).
KILL_WAIT_S = 110
# How long the nodes of a new cluster wait for the master to publish its address.
CONTROLLER_WAIT_S = 1800


@dataclass(frozen=True)
class Layout:
    """Where a cluster keeps its Slurm state: on EFS, so a replaced master finds the queue again."""
    efs: str
    stack: str

    @property
    def root(self) -> Path:
        return Path(self.efs, ".maskrcnn", self.stack, "slurm")

    @property
    def state(self) -> Path:
        return self.root / "state"

    @property
    def names(self) -> Path:
        return self.root / "nodes"

    @property
    def controller(self) -> Path:
        """``<hostname> <address>`` of the master's slurmctld."""
        return self.root / "controller"

    @property
    def conf_copy(self) -> Path:
        """The master's slurm.conf, for Slurm commands on a node whose slurmd has not fetched it yet."""
        return self.root / "slurm.conf"

    @property
    def logs(self) -> Path:
        return self.root / "log"

    @property
    def custom_conf(self) -> Path:
        """The cluster's own Slurm settings, if the team writes any: merged into slurm.conf by the master
        when its Slurm starts (:func:`merge_custom`)."""
        return self.root / "custom.conf"

    @property
    def job_log(self) -> Path:
        """Slurm's job-completion log (jobcomp/filetxt): one line per finished job."""
        return self.root / "jobs.log"


def layout(env: dict[str, str]) -> Layout:
    return Layout(efs=env.get("EFS_MOUNT", "/efs"), stack=env.get("STACK_NAME", "maskrcnn"))


def node_names(worker_count: int) -> list[str]:
    return [MASTER_NODE] + [f"{WORKER_PREFIX}{i}" for i in range(1, worker_count + 1)]


def slurm_version() -> tuple[int, int]:
    out = subprocess.run(["slurmctld", "-V"], capture_output=True, text=True).stdout
    match = re.search(r"(\d+)\.(\d+)", out)
    if not match:
        raise LaunchError(f"cannot read Slurm's version from `slurmctld -V` ({out.strip()!r}): "
                          "is Slurm installed in the image?")
    return int(match.group(1)), int(match.group(2))


def slurm_conf(*, cluster: str, controller_host: str, controller_address: str, worker_count: int,
               cpus: int, state_dir: Path, job_log: Path, log_dir: Path,
               health_checks: bool = True) -> str:
    """slurm.conf for a master and ``worker_count`` workers of ``cpus`` CPUs each."""
    lines = [
        f"ClusterName={re.sub(r'[^a-z0-9]', '', cluster.lower())[:40] or 'maskrcnn'}",
        f"SlurmctldHost={controller_host}({controller_address})",
        f"SlurmctldPort={SLURMCTLD_PORT}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        # configless: nodes fetch this file from slurmctld; cloud_reg_addrs: a node's address is
        # the one it registers from (a replacement instance takes over a name at a new address).
        "SlurmctldParameters=enable_configless,cloud_reg_addrs",
        "SlurmUser=root",
        f"StateSaveLocation={state_dir}",
        "SlurmdSpoolDir=/run/slurmd",
        "SlurmctldPidFile=/run/slurmctld.pid",
        "SlurmdPidFile=/run/slurmd.pid",
        # On EFS, so a node's log outlives it (%n: the Slurm node name).
        f"SlurmctldLogFile={log_dir}/slurmctld.log",
        f"SlurmdLogFile={log_dir}/slurmd-%n.log",
        # Inside a container: processes tracked by their parent, no cgroup-based confinement (the
        # container is the node's only tenant).
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "MpiDefault=none",
        # Whole nodes per job: one training run owns its nodes' GPUs.
        "SelectType=select/linear",
        "SchedulerType=sched/backfill",
        "JobCompType=jobcomp/filetxt",
        f"JobCompLoc={job_log}",
        # A job whose node fails is requeued (sbatch --requeue) and starts again, from its
        # checkpoint, once enough nodes are up; a node that registers again is usable at once.
        "JobRequeue=1",
        "ReturnToService=2",
        f"SlurmdTimeout={SLURMD_TIMEOUT_S}",
        f"KillWait={KILL_WAIT_S}",
        "KillOnBadExit=1",
        "MessageTimeout=30",
        # A CLOUD node that has not registered is "powered down"; there is nothing to power up
        # (the auto-scaling groups launch the instances), so power saving never suspends a node.
        "SuspendTime=INFINITE",
    ]
    if health_checks:
        # ANY: drained nodes are checked too, so a node that failed while its job ran is replaced
        # at the first run after the job has left it (node_health replaces only drained, idle nodes).
        lines += [f"HealthCheckProgram={HEALTH_CHECK_PROGRAM}", "HealthCheckInterval=300",
                  "HealthCheckNodeState=ANY,CYCLE", f"Prolog={PROLOG_PROGRAM}",
                  "PrologFlags=Alloc", "PrologEpilogTimeout=300",
                  # A job requeued after a failed prolog (a node failed its checks) runs again on
                  # healthy nodes instead of waiting, held, for an administrator.
                  "SchedulerParameters=nohold_on_prolog_fail"]
    names = node_names(worker_count)
    lines += [f"NodeName={MASTER_NODE} CPUs={cpus} State=CLOUD Weight=1"]
    if worker_count:
        lines += [f"NodeName={WORKER_PREFIX}[1-{worker_count}] CPUs={cpus} State=CLOUD Weight=2"]
    lines += [f"PartitionName={PARTITION} Nodes={','.join(names)} Default=YES MaxTime=INFINITE "
              f"State=UP OverSubscribe=EXCLUSIVE"]
    return "\n".join(lines) + "\n"


# Keys the cluster's own code depends on, which custom.conf may not change.
OWNED_KEYS = {
    **dict.fromkeys(("ClusterName", "SlurmctldHost", "SlurmctldPort", "AuthType", "CredType", "SlurmUser",
                     "StateSaveLocation", "SlurmdSpoolDir", "SlurmctldPidFile", "SlurmdPidFile"),
                    "the nodes find and trust the controller, and keep its state on EFS, with these"),
    **dict.fromkeys(("NodeName", "NodeSet", "PartitionName"),
                    "the node names are fixed: a replacement instance takes over the name of the one it replaces"),
    **dict.fromkeys(("JobCompType", "JobCompLoc"), "`maskrcnn job list/status` read the job-completion log"),
    **dict.fromkeys(("JobRequeue", "KillWait"),
                    "a failed attempt is requeued and resumes, and a job's --stop-grace is bounded by KillWait"),
    **dict.fromkeys(("HealthCheckProgram", "Prolog"),
                    "the node health checks run as these (--no-health-checks on the node leaves them out)"),
}
# Comma-separated options: custom.conf's are added to the cluster's (an option of the same name replaces
# the cluster's), so that setting one, e.g. SchedulerParameters=bf_interval=10, keeps the ones the cluster needs.
OPTION_KEYS = ("SlurmctldParameters", "SchedulerParameters", "PrologFlags")
_SETTING = re.compile(r"([A-Za-z][A-Za-z0-9]*)=(\S+)")


def merge_custom(conf: str, custom: str, *, source: str) -> str:
    """``conf`` (slurm.conf) with the settings in ``custom`` (slurm.conf syntax, one ``Key=Value`` a line,
    ``#`` comments): a key ``conf`` sets takes the custom value in its place (Slurm itself would take
    the last of two, but logs an error for each), a new key is appended. Raises LaunchError naming
    the line of ``source`` that is not ``Key=Value`` or sets a key the cluster owns (:data:`OWNED_KEYS`)."""
    owned = {k.lower(): (k, why) for k, why in OWNED_KEYS.items()}
    option_keys = {k.lower() for k in OPTION_KEYS}
    lines = conf.splitlines()
    # NodeName and PartitionName lines are never looked up: those keys are owned.
    index = {line.split("=", 1)[0].lower(): i for i, line in enumerate(lines)}
    for number, raw in enumerate(custom.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = _SETTING.fullmatch(line)
        if not match:
            raise LaunchError(f"{source} line {number}: {raw.strip()!r} is not one Key=Value setting (no spaces); "
                              "see `man slurm.conf`")
        key, value = match.groups()
        if key.lower() in owned:
            name, why = owned[key.lower()]
            raise LaunchError(f"{source} line {number}: {name} is set by the cluster and may not be changed "
                              f"({why}); remove the line")
        at = index.get(key.lower())
        if at is None:
            index[key.lower()] = len(lines)
            lines.append(f"{key}={value}")
            continue
        our_key, ours = lines[at].split("=", 1)
        if key.lower() in option_keys:
            options = {o.split("=", 1)[0].lower(): o for o in ours.split(",")}
            options.update({o.split("=", 1)[0].lower(): o for o in value.split(",")})
            value = ",".join(options.values())
        lines[at] = f"{our_key}={value}"
    return "\n".join(lines) + "\n"


def master_conf(env: dict[str, str], *, address: str, health_checks: bool = True, custom: bool = True) -> str:
    """The slurm.conf the master writes, from cluster.env and (``custom``) the cluster's custom.conf on
    EFS, if any. Raises LaunchError for a custom.conf :func:`merge_custom` refuses."""
    lay = layout(env)
    conf = slurm_conf(cluster=env.get("STACK_NAME", "maskrcnn"), controller_host=socket.gethostname(),
                      controller_address=address, worker_count=int(env.get("WORKER_COUNT", "0")),
                      cpus=int(env.get("NODE_CPUS") or os.cpu_count() or 1), state_dir=lay.state,
                      job_log=lay.job_log, log_dir=lay.logs, health_checks=health_checks)
    if custom and lay.custom_conf.is_file():
        conf = merge_custom(conf, lay.custom_conf.read_text(), source=str(lay.custom_conf))
    return conf


def cgroup_conf(version: tuple[int, int]) -> str | None:
    """cgroup.conf for slurmd inside a container, or None where Slurm reads none (before 22.05,
    whose plugins above need no cgroups; a file with the newer keys would be refused there)."""
    if version < (22, 5):
        return None
    if Path("/sys/fs/cgroup/cgroup.controllers").exists():
        # cgroup v2 (the Deep Learning AMIs): no systemd inside the container to delegate a scope.
        return "CgroupPlugin=cgroup/v2\nIgnoreSystemd=yes\nCgroupAutomount=no\n"
    return "CgroupPlugin=cgroup/v1\nCgroupAutomount=no\n"


# --- node names ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Claim:
    name: str
    replaces: str | None = None     # the instance that held the name before, gone from its group


def claim_name(names_dir: Path, *, role: str, instance_id: str, worker_count: int,
               alive) -> Claim:
    """The Slurm node name this instance registers under: ``master`` for the master, else the first
    worker name no live instance holds. ``alive(instance_id) -> bool`` says whether a holder is
    still in its group. A claim is a directory (mkdir is atomic on NFS) holding the instance id."""
    names_dir.mkdir(parents=True, exist_ok=True)
    candidates = [MASTER_NODE] if role == "master" else node_names(worker_count)[1:]
    for name in candidates:
        claim = names_dir / name
        replaces = None
        for _ in range(2):
            try:
                claim.mkdir()
            except FileExistsError:
                holder = _holder(claim)
                if holder == instance_id:
                    return Claim(name)   # this instance's own claim, e.g. after a container restart
                if holder is not None and alive(holder) and role != "master":
                    break                # held by a live node: try the next name
                # The holder is gone (or this is the master's one name): free the claim, retry once.
                replaces = holder
                stale = claim.with_name(f".{name}.{instance_id}.stale")
                try:
                    claim.rename(stale)
                    shutil.rmtree(stale, ignore_errors=True)
                except FileNotFoundError:
                    pass                 # another node freed it first
                continue
            (claim / "instance").write_text(instance_id + "\n")
            return Claim(name, replaces)
    raise LaunchError(f"no free Slurm node name among {candidates} in {names_dir}: every name is held "
                      f"by a running instance (is the worker group larger than the stack's worker_count?)")


def _holder(claim: Path) -> str | None:
    for _ in range(20):          # the claimer writes the file right after its mkdir
        try:
            return (claim / "instance").read_text().strip() or None
        except FileNotFoundError:
            time.sleep(0.1)
    return None


def in_service(env: dict[str, str]):
    """``alive(instance_id)``: whether the instance is in one of the cluster's groups and not leaving."""
    import boto3

    client = boto3.session.Session(region_name=env.get("AWS_REGION")).client("autoscaling")

    def alive(instance_id: str) -> bool:
        found = client.describe_auto_scaling_instances(InstanceIds=[instance_id])["AutoScalingInstances"]
        return any(i["LifecycleState"].startswith(("InService", "Pending")) for i in found)
    return alive


# --- the daemons ---------------------------------------------------------------------------------

def _wait_for_controller(lay: Layout, timeout: float, poll: float = 5.0) -> tuple[str, str]:
    deadline = time.monotonic() + timeout
    while True:
        try:
            host, address = lay.controller.read_text().split()
            with socket.create_connection((address, SLURMCTLD_PORT), timeout=3):
                return host, address
        except (FileNotFoundError, ValueError, OSError):
            if time.monotonic() > deadline:
                raise LaunchError(f"no slurmctld answered at the address in {lay.controller} after "
                                  f"{timeout:.0f} s: is the master node up?") from None
            time.sleep(poll)


def controller_moved(lay: Layout, address: str) -> Callable[[], str | None]:
    """A check for a worker: the new slurmctld address once the controller file names another one
    than ``address`` (the one its slurmd was started with); None while it does not."""
    def moved() -> str | None:
        try:
            _, now = lay.controller.read_text().split()
        except (OSError, ValueError):
            return None   # being replaced (os.replace is atomic, but EFS may not answer for a moment)
        return now if now != address else None
    return moved


def _start(argv: list[str]) -> subprocess.Popen:
    print("starting: " + " ".join(argv), flush=True)
    return subprocess.Popen(argv)


def write_config(env: dict[str, str], *, address: str, health_checks: bool) -> Path:
    """slurm.conf (and cgroup.conf) in /etc/slurm, from cluster.env and custom.conf. A custom.conf
    that :func:`merge_custom` refuses is left out, not fatal: the cluster keeps working without it."""
    SLURM_ETC.mkdir(parents=True, exist_ok=True)
    try:
        conf = master_conf(env, address=address, health_checks=health_checks)
    except LaunchError as err:
        print(f"custom Slurm settings left out: {err}. Fix the file, check it with `sudo docker exec maskrcnn "
              f"python -m launch.cluster.slurm conf`, then restart this container (sudo docker restart maskrcnn)",
              flush=True)
        conf = master_conf(env, address=address, health_checks=health_checks, custom=False)
    (SLURM_ETC / "slurm.conf").write_text(conf)
    cgroup = cgroup_conf(slurm_version())
    if cgroup:
        (SLURM_ETC / "cgroup.conf").write_text(cgroup)
    return SLURM_ETC / "slurm.conf"


def write_programs(cluster_env: str, node_name: str) -> None:
    """The HealthCheckProgram and Prolog wrappers: this node's Python, code and environment."""
    PROGRAM_DIR.mkdir(parents=True, exist_ok=True)
    code = Path(__file__).resolve().parents[2]
    keep = {k: v for k, v in os.environ.items()
            if k in ("PATH", "LD_LIBRARY_PATH", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL",
                     "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "TF_USE_LEGACY_KERAS")}
    exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in sorted(keep.items()))
    for path, mode in ((HEALTH_CHECK_PROGRAM, "--health-check"), (PROLOG_PROGRAM, "--prolog")):
        path.write_text(f"#!/bin/bash\n{exports}export PYTHONPATH={shlex.quote(str(code))}\n"
                        f"exec {shlex.quote(sys.executable)} -m launch.cluster.node_health {mode} "
                        f"--cluster-env {shlex.quote(cluster_env)} --node-name {shlex.quote(node_name)}\n")
        path.chmod(0o755)


def start_node(env: dict[str, str], *, alive, health_checks: bool = True, controller_wait: float = CONTROLLER_WAIT_S,
               ) -> tuple[list[subprocess.Popen], Callable[[], str | None] | None]:
    """Starts munged, slurmctld (master) and slurmd under this node's claimed name. Returns the
    daemons, and on a worker the check of whether the master has moved (:func:`controller_moved`)."""
    lay = layout(env)
    moved = None
    role, address = env.get("ROLE", "worker"), env.get("PRIVATE_IP")
    instance_id = env.get("INSTANCE_ID")
    if not address or not instance_id:
        raise LaunchError(f"{CLUSTER_ENV} lacks PRIVATE_IP or INSTANCE_ID: this is not a node set up by "
                          "the cluster's boot script")
    if not Path(MUNGE_KEY).is_file():
        raise LaunchError(f"{MUNGE_KEY} is missing: the boot script writes it from Secrets Manager; start "
                          "the container with -v /etc/maskrcnn:/etc/maskrcnn:ro")
    for d in ("/run/munge", "/run/slurmd", lay.logs):
        Path(d).mkdir(parents=True, exist_ok=True)
    procs = [_start(["munged", "--foreground", "--force", f"--key-file={MUNGE_KEY}",
                     f"--socket={MUNGE_SOCKET}", "--pid-file=/run/munge/munged.pid",
                     "--seed-file=/run/munge/seed", "--log-file=/run/munge/munged.log"])]
    deadline = time.monotonic() + 30
    while not Path(MUNGE_SOCKET).exists():
        if procs[0].poll() is not None or time.monotonic() > deadline:
            raise LaunchError("munged did not start (see /run/munge/munged.log)")
        time.sleep(0.1)
    claim = claim_name(lay.names, role=role, instance_id=instance_id,
                       worker_count=int(env.get("WORKER_COUNT", "0")), alive=alive)
    name = claim.name
    print(f"this node is Slurm node {name}", flush=True)
    if health_checks:
        # Slurm names the node to a Prolog (SLURMD_NODENAME) but not to a HealthCheckProgram.
        write_programs(env.get("_CLUSTER_ENV_PATH", CLUSTER_ENV), name)
    if role == "master":
        lay.state.mkdir(parents=True, exist_ok=True)
        conf = write_config(env, address=address, health_checks=health_checks)
        shutil.copyfile(conf, lay.conf_copy)
        procs.append(_start(["slurmctld", "-D", "-f", str(conf)]))
        tmp = lay.controller.with_suffix(".tmp")
        tmp.write_text(f"{socket.gethostname()} {address}\n")
        os.replace(tmp, lay.controller)
        procs.append(_start(["slurmd", "-D", "-f", str(conf), "-N", name]))
    else:
        _, controller = _wait_for_controller(lay, controller_wait)
        if claim.replaces and claim.replaces != instance_id:
            node_replaced(lay, name, old=claim.replaces, new=instance_id)
        procs.append(_start(["slurmd", "-D", "--conf-server", f"{controller}:{SLURMCTLD_PORT}", "-N", name]))
        moved = controller_moved(lay, controller)
    # Spot interruption notices and a Capacity Block's end: drain this node and requeue its job
    # in time for a checkpoint (launch/cluster/interruption.py). Not supervised: the node keeps
    # working without it.
    _start([sys.executable, "-m", "launch.cluster.interruption", "--node", name,
            "--cluster-env", env.get("_CLUSTER_ENV_PATH", CLUSTER_ENV)])
    return procs, moved


def node_replaced(lay: Layout, name: str, *, old: str, new: str) -> None:
    """Tells slurmctld that the instance behind ``name`` is gone before this one registers under it:
    the node goes DOWN, which ends whatever Slurm still counted on it (a job being completed there
    waits for the dead slurmd otherwise) and requeues its jobs. A drain the old instance left (it
    failed a health check) is lifted: it was about that instance, and this one's own checks run
    before it registers. The registration then makes the node usable again (ReturnToService=2).
    slurmd is not running yet, so the commands read the master's copy of slurm.conf on EFS."""
    env = {**os.environ, "SLURM_CONF": str(lay.conf_copy)}
    down = subprocess.run(["scontrol", "update", f"NodeName={name}", "State=DOWN",
                           f"Reason=instance {old} left its group; replaced by {new}"],
                          capture_output=True, text=True, timeout=60, env=env)
    # UNDRAIN clears the drain flag and keeps the base state (DOWN); on a node without one it
    # fails harmlessly.
    subprocess.run(["scontrol", "update", f"NodeName={name}", "State=UNDRAIN"],
                   capture_output=True, text=True, timeout=60, env=env)
    print(f"{name} was instance {old}: " + ("marked DOWN until this node registers" if down.returncode == 0
          else f"could not mark it DOWN ({down.stderr.strip()}); Slurm notices within {SLURMD_TIMEOUT_S} s"),
          flush=True)


def supervise(procs: list[subprocess.Popen], moved: Callable[[], str | None] | None = None, *,
              poll_s: float = 1.0, moved_every: int = 10) -> int:
    """Waits until any daemon exits, stops the others and returns its status; or, with ``moved``,
    until the master has moved (checked every ``moved_every`` polls), then stops them all and returns 1."""
    def stop(*_):
        for p in procs:
            if p.poll() is None:
                p.terminate()
    signal.signal(signal.SIGTERM, stop)
    try:
        polls = 0
        while True:
            for p in procs:
                if p.poll() is not None:
                    print(f"{p.args[0]} exited ({p.returncode}): stopping the node's daemons", flush=True)
                    stop()
                    return p.returncode or 1
            polls += 1
            if moved is not None and polls % moved_every == 0 and (address := moved()):
                print(f"the master's slurmctld is now at {address} (a replaced master): stopping this node's "
                      f"daemons so that they start again and register there", flush=True)
                stop()
                return 1
            time.sleep(poll_s)
    finally:
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    node = sub.add_parser("node", help="start this node's Slurm daemons and wait (the container's cluster-node)")
    node.add_argument("--cluster-env", default=CLUSTER_ENV)
    node.add_argument("--no-health-checks", dest="health_checks", action="store_false",
                      help="leave HealthCheckProgram and Prolog out of slurm.conf (debugging)")
    conf = sub.add_parser("conf", help="print the slurm.conf this cluster's master writes, custom.conf merged "
                                       "(exit 2 naming the line if custom.conf is refused)")
    conf.add_argument("--cluster-env", default=CLUSTER_ENV)
    conf.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    try:
        env = {**read_cluster_env(a.cluster_env), "_CLUSTER_ENV_PATH": a.cluster_env}
        if a.command == "conf":
            text = master_conf(env, address=env.get("PRIVATE_IP", "127.0.0.1"))
            print(json.dumps({"slurm.conf": text}) if a.json else text, end="" if not a.json else "\n")
            return 0
        procs, moved = start_node(env, alive=in_service(env), health_checks=a.health_checks)
        return supervise(procs, moved)
    except LaunchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
