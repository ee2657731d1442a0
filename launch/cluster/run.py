"""One command on the master node starts distributed training over every healthy node:

    docker exec -it maskrcnn maskrcnn-entrypoint cluster-train [KEY=VALUE ...]
    (inside the container: python -m launch.cluster.run [KEY=VALUE ...])

Each attempt rediscovers the InService nodes of both auto-scaling groups, health-checks them, writes
the hostfile of the healthy ones into the log directory on EFS and starts mpirun (flags from
launch_command). When training fails (a node died, a rank stalled), the run waits until the cluster
again has as many healthy ranks as the run was started with (the auto-scaling group replaces a
terminated node; a restarted container comes back), then starts again and training.train resumes
from the latest checkpoint in the same log directory on EFS, with the same global batch and
learning-rate schedule. Continuing on fewer ranks changes the global batch (training.train then
continues the schedule by images seen, at the LR of the smaller batch), so it needs
--allow-fewer-ranks.

Where training reads COCO (``choose_data``): ``--data-dir`` when given; else the FSx for Lustre
file system at /fsx when the stack has one and the dataset is there (the DLAMI cluster example's order: Lustre
read about 4x faster than EFS); else the EFS copy, which on instance types with local NVMe
(cluster.env's LOCAL_NVME) is first copied to that disk on every node, once (a node whose copy is
complete and matches EFS's listing skips it), so that training reads local disk instead of EFS.

Capacity: a run holds the run lock (launch/cluster/idle.py) from start to end, so the master's idle
check never scales the workers down under it. When the worker group was scaled to zero while idle,
the run sets it back to its MaxSize (the configured size) first. A new run waits (up to
--node-wait) for every node the groups want while nodes are still starting: after that scale-up,
while a group has fewer InService instances than it wants, or while an unhealthy node launched less
than BOOTING_S ago may still be booting. At the end it prints the run's estimated cost: its nodes x
its wall time x the instance type's price (launch/cost.py).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

import boto3

from launch import cost
from launch.aws import LaunchError
from launch.cluster import capacity, health, idle
from launch.cluster.hostfile import CLUSTER_ENV, ClusterNode, cluster_key, discover_nodes, read_cluster_env
from launch.cluster.launch_command import format_command, hostfile_text, mpirun_command, train_command
from launch.code_version import code_version
from launch.cluster.stage import STAGE_JOBS, STAGE_TIMEOUT_S, DataPlan, choose_data, stage_argv

def stage_data(nodes: list[ClusterNode], runner: health.CommandRunner, plan: DataPlan, *,
               jobs: int = STAGE_JOBS, timeout: float = STAGE_TIMEOUT_S) -> None:
    """Copies ``plan.stage_from`` to ``plan.train_dir`` on every node at once; raises LaunchError
    naming the nodes that failed."""
    argv = stage_argv(plan, jobs=jobs)
    print(f"copying {plan.stage_from} to {plan.train_dir} on {len(nodes)} node(s) "
          f"(skipped where complete)", flush=True)
    with ThreadPoolExecutor(max_workers=len(nodes)) as pool:
        results = list(pool.map(lambda n: health._run(runner, n.private_ip, argv, timeout), nodes))
    failed = [f"{n.private_ip}: {(r.stderr or r.stdout).strip()[-500:]}"
              for n, r in zip(nodes, results) if r.returncode != 0]
    if failed:
        raise LaunchError("copying the dataset to local NVMe failed on " + "; ".join(failed)
                          + " (free space on the NVMe? rerun to resume the copy, or pass "
                          "--no-stage-to-nvme to read from EFS)")
    for n, r in zip(nodes, results):
        print(f"  {n.private_ip}: {r.stdout.strip().splitlines()[-1] if r.stdout.strip() else 'done'}",
              flush=True)

CONFIG_ERROR_STATUS = 2  # training.train's exit status for bad configuration or data


def healthy_nodes(nodes: list[ClusterNode], runner: health.CommandRunner, *, efs_mount: str,
                  min_nodes: int) -> tuple[list[ClusterNode], str]:
    """The nodes that pass every health check, and the table to show; errors when the master fails
    or fewer than ``min_nodes`` are healthy."""
    if not nodes:
        raise LaunchError("no InService nodes in the cluster's auto-scaling groups yet: wait for the stack's "
                          "instances to start (see the EC2 console or `aws autoscaling describe-auto-scaling-groups`)")
    results = health.check_cluster(runner, [(n.private_ip, n.role, n.gpus) for n in nodes],
                                   expected_code_version=code_version(), efs_mount=efs_mount)
    table = health.format_table(results)
    ok = [n for n, h in zip(nodes, results) if h.healthy]
    if not any(n.role == "master" for n in ok):
        raise LaunchError("the master node failed its health check (see the table above); fix it first")
    if len(ok) < min_nodes:
        raise LaunchError(f"only {len(ok)} healthy node(s), --min-nodes is {min_nodes}")
    return ok, table


def recorded_ranks(logdir: str) -> int | None:
    """The rank count the run in ``logdir`` trained with (its config.json), or None for a new run.

    Its global batch, steps per epoch and LR schedule in steps all follow from that count."""
    from training.callbacks import CONFIG_FILE  # training.train's rank 0 writes it at every start
    try:
        with open(Path(logdir, CONFIG_FILE)) as f:
            return int(json.load(f)["TRAIN"]["NUM_GPUS"])
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as err:
        raise LaunchError(f"{Path(logdir, CONFIG_FILE)} is unreadable ({err}): move it away to resume "
                          f"without the rank check, or use a new --run-name") from None


def ranks(nodes: list[ClusterNode]) -> int:
    return sum(n.as_node().slots for n in nodes)


def nodes_for_ranks(nodes: list[ClusterNode], wanted: int) -> list[ClusterNode] | None:
    """The first nodes (master first) giving exactly ``wanted`` ranks, or None when they cannot."""
    chosen = []
    for n in nodes:
        if ranks(chosen) == wanted:
            break
        chosen.append(n)
    return chosen if ranks(chosen) == wanted else None


def build_command(nodes: list[ClusterNode], *, logdir: str, data_dir: str, overrides: list[str],
                  ssh_port: int, ssh_key: str | None = None) -> tuple[str, list[str]]:
    """(hostfile text, mpirun argv) for ``nodes``; EFA flags when every node has an EFA interface."""
    hostfile = str(Path(logdir) / "hostfile")
    key = {"ssh_key": str(ssh_key)} if ssh_key else {}
    cmd = mpirun_command([n.as_node() for n in nodes], hostfile=hostfile, ssh_port=ssh_port, **key,
                         efa=all(n.efa for n in nodes), instance_types=[n.instance_type for n in nodes],
                         train=train_command(logdir=logdir, data_dir=data_dir, overrides=overrides))
    return hostfile_text([n.as_node() for n in nodes]), cmd


# A node launched less than this long ago may still be booting: the stack's creation policy allows
# a node's boot 45 minutes (infra/constructs/cluster.py BOOT_TIMEOUT).
BOOTING_S = 45 * 60


def scale_up_workers(session: boto3.session.Session, groups: list[capacity.GroupState], *,
                     dry_run: bool) -> bool:
    """Sets the worker group back to its MaxSize (the configured size) when it is below it (scaled
    down while idle); True when it did."""
    worker = next((g for g in groups if g.role == "worker"), None)
    if worker is None or worker.desired >= worker.max_size:
        return False
    if dry_run:
        print(f"the worker group {worker.name} is at {worker.desired} of its {worker.max_size} "
              f"node(s) (scaled down while idle): a run scales it up first and waits for the nodes")
        return False
    capacity.set_desired(session, worker, worker.max_size)
    print(f"scaling the worker group {worker.name} from {worker.desired} to {worker.max_size} "
          f"node(s) (it was scaled down while idle); the run waits for the nodes to boot and pass "
          f"their health checks (a GPU node takes ~10-15 min)", flush=True)
    return True


def nodes_starting(groups: list[capacity.GroupState], healthy: set[str],
                   launch_times: dict[str, datetime], *, scaled: bool, now: datetime) -> int | None:
    """The number of healthy nodes a new run waits for while nodes are still starting: every node
    the groups want (their desired capacity) when this run scaled the workers up, a group has fewer
    InService instances than it wants, or an unhealthy InService instance launched less than
    BOOTING_S ago. None: nothing is starting; the run starts on the ``healthy`` instances."""
    wanted = sum(g.desired for g in groups)
    if len(healthy) >= wanted:
        return None
    if scaled or any(len(g.in_service) < g.desired for g in groups):
        return wanted
    booting = [i for g in groups for i in g.in_service
               if i not in healthy and i in launch_times
               and (now - launch_times[i]).total_seconds() < BOOTING_S]
    return wanted if booting else None


def launch_times(session: boto3.session.Session,
                 groups: list[capacity.GroupState]) -> dict[str, datetime]:
    ids = sorted({i for g in groups for i in g.in_service})
    if not ids:
        return {}
    pages = session.client("ec2").get_paginator("describe_instances").paginate(InstanceIds=ids)
    return {i["InstanceId"]: i["LaunchTime"] for page in pages
            for reservation in page["Reservations"] for i in reservation["Instances"]}


def cost_lines(nodes: list[ClusterNode], seconds: float) -> list[str]:
    """The run's estimated cost: its nodes for its wall time, one line per instance type."""
    return [cost.estimate(instance_type, count, seconds).line()
            for instance_type, count in sorted(Counter(n.instance_type for n in nodes).items())]


def wait_for_ranks(discover, check, *, wanted: int | None, allow_fewer: bool, wait_s: float,
                   poll_s: float, clock=time.monotonic, sleep=time.sleep,
                   starting=None) -> list[ClusterNode]:
    """The healthy nodes to start on: all of them for a new run (``wanted`` None), else nodes giving
    exactly ``wanted`` ranks, waiting up to ``wait_s`` for the cluster to have them again. With
    ``allow_fewer`` a shortfall is announced and accepted instead. For a new run, ``starting(ok)``
    (when given) is the node count to wait for while nodes are still starting, or None."""
    deadline = None  # counted from the first check that finds too few ranks
    while True:
        ok, table = check(discover())
        print(table, flush=True)
        if wanted is None:
            expect = starting(ok) if starting is not None else None
            if expect is None or len(ok) >= expect:
                return ok
            give_up = (f"{len(ok)} of the cluster's {expect} nodes are healthy after waiting "
                       f"{wait_s:.0f} s for the nodes that are starting: see the failing checks "
                       f"above (a node's boot log is /var/log/maskrcnn-boot.log on it); rerun "
                       f"the same command to wait again, or raise --node-wait")
            waiting = (f"{len(ok)} of the cluster's {expect} nodes are healthy: waiting for the nodes that are "
                       f"starting (next check in {poll_s:.0f} s, giving up after {wait_s:.0f} s)")
        else:
            chosen = nodes_for_ranks(ok, wanted)
            if chosen is not None:
                return chosen
            have = ranks(ok)
            if allow_fewer and have < wanted:
                print(f"continuing on {have} of the run's {wanted} ranks (--allow-fewer-ranks): a smaller global "
                      f"batch and LR; training continues the schedule at the step of the images already seen",
                      file=sys.stderr, flush=True)
                return ok
            give_up = (f"the run trained on {wanted} ranks and the cluster has {have} healthy rank(s) after "
                       f"waiting {wait_s:.0f} s: resuming on another count would change the global batch and "
                       f"the LR (the schedule continues by images seen). Fix or replace the nodes and rerun "
                       f"the same command, pass --allow-fewer-ranks to continue anyway, or use a new --run-name")
            waiting = (f"the run trained on {wanted} ranks, {have} are healthy now: waiting for the cluster to be "
                       f"whole (next check in {poll_s:.0f} s, giving up after {wait_s:.0f} s; --allow-fewer-ranks "
                       f"continues without them)")
        deadline = deadline if deadline is not None else clock() + wait_s
        if clock() + poll_s > deadline:
            raise LaunchError(give_up)
        print(waiting, file=sys.stderr, flush=True)
        sleep(poll_s)


def main(argv: list[str] | None = None, runner: health.CommandRunner | None = None, *,
         clock=time.monotonic) -> int:
    """``runner`` runs the health checks (default: SSH with the cluster key); ``clock`` times the
    run for its cost estimate."""
    started = clock()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("overrides", nargs="*", help="training config overrides, KEY=VALUE (training/config.py)")
    p.add_argument("--run-name", default="maskrcnn",
                   help="log directory name under <EFS>/logs; reuse a name to resume that run")
    p.add_argument("--data-dir", help="COCO directory (default: /fsx/coco when the cluster has FSx for Lustre "
                                      "and the dataset is there, else <EFS>/data/coco)")
    p.add_argument("--no-stage-to-nvme", dest="stage_to_nvme", action="store_false",
                   help="read the dataset from EFS even on nodes with local NVMe (by default it is copied there "
                        "once per node and read locally)")
    p.add_argument("--max-restarts", type=int, default=3,
                   help="restarts after a failure, each resuming from the checkpoint")
    p.add_argument("--restart-wait", type=float, default=120.0,
                   help="seconds before a restart, and between checks while waiting for nodes")
    p.add_argument("--node-wait", type=float, default=3600.0,
                   help="seconds to wait for nodes before giving up: for the run's rank count again, or for "
                        "nodes that are starting (after the idle workers are scaled back up)")
    p.add_argument("--allow-fewer-ranks", action="store_true",
                   help="resume on fewer ranks than the run trained with (a smaller global batch and LR; the "
                        "schedule continues by images seen)")
    p.add_argument("--min-nodes", type=int, default=1)
    p.add_argument("--cluster-env", default=CLUSTER_ENV)
    p.add_argument("--dry-run", action="store_true", help="check nodes and print the command; start nothing")
    a = p.parse_args(argv)
    bad = [o for o in a.overrides if "=" not in o]
    if bad:
        p.error(f"overrides must be KEY=VALUE, got {bad}")

    try:
        env = read_cluster_env(a.cluster_env)
        efs = env.get("EFS_MOUNT", "/efs")
        logdir = f"{efs}/logs/{a.run_name}"
        plan = choose_data(env, data_dir=a.data_dir, stage_to_nvme=a.stage_to_nvme)
        data_dir = plan.stage_from or plan.train_dir   # what must hold the dataset now
        session = boto3.session.Session(region_name=env.get("AWS_REGION"))
        ssh_port = int(env.get("SSH_PORT", 2222))
        ssh_key = cluster_key(a.cluster_env)
        runner = runner or health.SshRunner(port=ssh_port, key=ssh_key)
        user_basedir = any(o.startswith("DATA.BASEDIR=") for o in a.overrides)
        if user_basedir:
            plan = DataPlan(train_dir=plan.train_dir)   # the user's DATA.BASEDIR wins: nothing to copy
        if not user_basedir and not Path(data_dir, "annotations").is_dir():
            raise LaunchError(f"no COCO dataset at {data_dir} (no annotations/ folder): stage it first "
                              f"(python -m launch.staging to-efs --efs-dir {data_dir}), or pass --data-dir")

        def discover():
            return discover_nodes(session, master_asg=env["MASTER_ASG_NAME"], worker_asg=env.get("WORKER_ASG_NAME"))

        def check(nodes):
            return healthy_nodes(nodes, runner, efs_mount=efs, min_nodes=a.min_nodes)

        names = {"master": env["MASTER_ASG_NAME"], "worker": env.get("WORKER_ASG_NAME")}
        with idle.training_lock():
            scaled = scale_up_workers(session, capacity.describe_groups(session, names),
                                      dry_run=a.dry_run)

            def starting(ok):
                groups = capacity.describe_groups(session, names)
                return nodes_starting(groups, {n.instance_id for n in ok}, launch_times(session, groups),
                                      scaled=scaled, now=datetime.now(timezone.utc))

            trained_on: list[ClusterNode] = []   # the nodes of the latest attempt that started
            try:
                return _attempts(a, plan=plan, logdir=logdir, runner=runner, ssh_port=ssh_port,
                                 ssh_key=ssh_key, discover=discover, check=check,
                                 starting=None if a.dry_run else starting, trained_on=trained_on)
            finally:
                if trained_on:
                    for line in cost_lines(trained_on, clock() - started):
                        print(line, flush=True)
    except LaunchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


def _attempts(a: argparse.Namespace, *, plan: DataPlan, logdir: str, runner: health.CommandRunner,
              ssh_port: int, ssh_key, discover, check, starting, trained_on: list[ClusterNode]) -> int:
    """Starts training, and again after a failure, up to --max-restarts times; ``trained_on``
    ends up holding the nodes of the latest attempt that started."""
    started_with = None
    for attempt in range(a.max_restarts + 1):
        wanted = recorded_ranks(logdir) or started_with
        ok = wait_for_ranks(discover, check, wanted=wanted, allow_fewer=a.allow_fewer_ranks,
                            wait_s=a.node_wait, poll_s=a.restart_wait, starting=starting)
        hosts, cmd = build_command(ok, logdir=logdir, data_dir=plan.train_dir, overrides=a.overrides,
                                   ssh_port=ssh_port, ssh_key=ssh_key)
        started_with = ranks(ok)
        print(f"attempt {attempt + 1}: {len(ok)} node(s), {started_with} rank(s)\n"
              f"{format_command(cmd)}", flush=True)
        if a.dry_run:
            if plan.stage_from:
                print(f"would copy {plan.stage_from} to {plan.train_dir} on each node first")
            return 0
        if plan.stage_from:
            stage_data(ok, runner, plan)   # also on nodes that replaced failed ones
        Path(logdir).mkdir(parents=True, exist_ok=True)
        Path(logdir, "hostfile").write_text(hosts)
        trained_on[:] = ok
        rc = subprocess.call(cmd)
        if rc == 0:
            print(f"training finished; logs and checkpoints in {logdir}")
            return 0
        if rc == CONFIG_ERROR_STATUS:
            print(f"training rejected its configuration or data (exit {rc}, see the error above); "
                  f"fix it and rerun: restarting would not help", file=sys.stderr)
            return rc
        if attempt == a.max_restarts:
            print(f"training failed (exit {rc}) after {attempt + 1} attempt(s); "
                  f"rerun the same command to resume from {logdir}", file=sys.stderr)
            return rc
        print(f"training failed (exit {rc}); re-checking nodes and resuming from the latest checkpoint "
              f"in {logdir} in {a.restart_wait:.0f} s", file=sys.stderr, flush=True)
        time.sleep(a.restart_wait)
    return 1


if __name__ == "__main__":
    sys.exit(main())
