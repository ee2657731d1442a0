"""One command on the master node starts distributed training over every healthy node:

    docker exec -it maskrcnn maskrcnn-entrypoint cluster-train [KEY=VALUE ...]
    (inside the container: python -m launch.cluster.run [KEY=VALUE ...])

Each attempt rediscovers the InService nodes of both auto-scaling groups, health-checks them, writes
the hostfile of the healthy ones into the log directory on EFS and starts mpirun (flags from
launch_command). When training fails (a node died, a rank stalled), the next attempt runs on the
nodes healthy by then (the auto-scaling group replaces a terminated node) and training.train
resumes from the latest checkpoint in the same log directory on EFS.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import boto3

from launch.aws import LaunchError
from launch.cluster import health
from launch.cluster.hostfile import CLUSTER_ENV, ClusterNode, discover_nodes, read_cluster_env
from launch.cluster.launch_command import format_command, hostfile_text, mpirun_command, train_command
from launch.code_version import code_version

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


def build_command(nodes: list[ClusterNode], *, logdir: str, data_dir: str, overrides: list[str],
                  ssh_port: int) -> tuple[str, list[str]]:
    """(hostfile text, mpirun argv) for ``nodes``; EFA flags when every node has an EFA interface."""
    hostfile = str(Path(logdir) / "hostfile")
    cmd = mpirun_command([n.as_node() for n in nodes], hostfile=hostfile, ssh_port=ssh_port,
                         efa=all(n.efa for n in nodes),
                         train=train_command(logdir=logdir, data_dir=data_dir, overrides=overrides))
    return hostfile_text([n.as_node() for n in nodes]), cmd


def main(argv: list[str] | None = None, runner: health.CommandRunner | None = None) -> int:
    """``runner`` runs the health checks (default: SSH with the cluster key)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("overrides", nargs="*", help="training config overrides, KEY=VALUE (training/config.py)")
    p.add_argument("--run-name", default="maskrcnn",
                   help="log directory name under <EFS>/logs; reuse a name to resume that run")
    p.add_argument("--data-dir", help="COCO directory (default <EFS>/data/coco)")
    p.add_argument("--max-restarts", type=int, default=3,
                   help="restarts after a failure, each on the nodes healthy by then, resuming from the checkpoint")
    p.add_argument("--restart-wait", type=float, default=120.0, help="seconds before a restart")
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
        data_dir = a.data_dir or f"{efs}/data/coco"
        session = boto3.session.Session(region_name=env.get("AWS_REGION"))
        ssh_port = int(env.get("SSH_PORT", 2222))
        runner = runner or health.SshRunner(port=ssh_port)
        if not any(o.startswith("DATA.BASEDIR=") for o in a.overrides) and not Path(data_dir, "annotations").is_dir():
            raise LaunchError(f"no COCO dataset at {data_dir} (no annotations/ folder): stage it first "
                              f"(python -m launch.staging to-efs --efs-dir {data_dir}), or pass --data-dir")
        for attempt in range(a.max_restarts + 1):
            nodes = discover_nodes(session, master_asg=env["MASTER_ASG_NAME"], worker_asg=env.get("WORKER_ASG_NAME"))
            ok, table = healthy_nodes(nodes, runner, efs_mount=efs, min_nodes=a.min_nodes)
            print(table, flush=True)
            hosts, cmd = build_command(ok, logdir=logdir, data_dir=data_dir, overrides=a.overrides,
                                       ssh_port=ssh_port)
            print(f"attempt {attempt + 1}: {len(ok)} node(s), {sum(n.as_node().slots for n in ok)} rank(s)\n"
                  f"{format_command(cmd)}", flush=True)
            if a.dry_run:
                return 0
            Path(logdir).mkdir(parents=True, exist_ok=True)
            Path(logdir, "hostfile").write_text(hosts)
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
    except LaunchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 1


if __name__ == "__main__":
    sys.exit(main())
