"""Pause the EC2 cluster between runs and resume it, from your own machine:

    maskrcnn cluster status [--json]
    maskrcnn cluster pause
    maskrcnn cluster resume [--wait]
    (each takes --region R, and --name-prefix P or --stack NAME to name the deployment)

``pause`` sets the desired capacity of the master and the worker group to 0: every node
terminates, and nothing else changes (EFS with the datasets, checkpoints and logs, the bucket, the
training image, the munge key and the deployment's settings all stay). It refuses while a run trains
(its ranks would get seconds, not a checkpoint) and names the run and its graceful stop; ``--force``
pauses anyway. ``resume`` sets each group to its MaxSize, which the stack's template sets to the
configured size (1 master, ``worker_count`` workers): the sizes come from the deployment, not from
this command. The stack creates both groups at 0 nodes and a redeploy never changes a group's
running size (infra/constructs/cluster.py), so ``resume`` also starts a new deployment's nodes.

The group names are read from the cluster stack's outputs. The stack is ``<name_prefix>-
EfsClusterStack`` when the deployment has a name prefix: ``--name-prefix``, else this node's or this
checkout's settings file's (launch/deployment.py); ``--stack`` names the stack directly.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

import boto3
import botocore.exceptions
from botocore.config import Config

from infra import outputs
from launch import deployment
from launch.aws import LaunchError, make_session, require_output, stack_outputs
from training import metrics as m   # names only: no TensorFlow

ROLES = ("master", "worker")
# A run counts as training when its latest run_active record (rank 0 writes one about every minute
# while steps advance, and 0 in its last) within this window is 1: an evaluation writes nothing
# for a while, so the window is longer than one.
RUN_ACTIVE_WINDOW_S = 30 * 60
# How long `resume --wait` waits by default: a cold boot, an image pull of several GB and the
# master waiting for its workers fit in it; being InService takes a few of those minutes.
WAIT_TIMEOUT_S = 45 * 60
POLL_S = 15.0
# Bounded calls: the master's idle check holds the run lock while it makes them, and a run
# starting then waits for it.
CLIENT_CONFIG = Config(connect_timeout=10, read_timeout=30,
                       retries={"max_attempts": 4, "mode": "standard"})


@dataclass(frozen=True)
class GroupState:
    role: str                      # "master" or "worker"
    name: str
    desired: int
    min_size: int
    max_size: int
    in_service: tuple[str, ...]    # instance ids
    instances: tuple[str, ...]     # every instance the group has, in any lifecycle state
    suspended: tuple[str, ...] = field(default=())   # suspended scaling processes


def describe_groups(session: boto3.session.Session, names: dict[str, str]) -> list[GroupState]:
    """The state of each group in ``names`` ({role: group name}), in ROLES order."""
    wanted = {role: name for role, name in names.items() if name}
    response = session.client("autoscaling", config=CLIENT_CONFIG).describe_auto_scaling_groups(
        AutoScalingGroupNames=list(wanted.values()))
    found = {g["AutoScalingGroupName"]: g for g in response["AutoScalingGroups"]}
    missing = [name for name in wanted.values() if name not in found]
    if missing:
        raise LaunchError(f"auto-scaling group(s) {', '.join(missing)} not found in "
                          f"{session.region_name}: is the cluster stack deployed in this region?")
    states = []
    for role in ROLES:
        if role not in wanted:
            continue
        g = found[wanted[role]]
        instances = g.get("Instances", [])
        states.append(GroupState(
            role=role, name=g["AutoScalingGroupName"], desired=g["DesiredCapacity"],
            min_size=g["MinSize"], max_size=g["MaxSize"],
            in_service=tuple(i["InstanceId"] for i in instances
                             if i["LifecycleState"] == "InService"),
            instances=tuple(i["InstanceId"] for i in instances),
            suspended=tuple(p["ProcessName"] for p in g.get("SuspendedProcesses", []))))
    return states


def cluster_state(groups: list[GroupState]) -> str:
    """paused / pausing / running / starting / workers-scaled-down / partial."""
    if all(g.desired == 0 for g in groups):
        return "pausing" if any(g.instances for g in groups) else "paused"
    workers = [g for g in groups if g.role == "worker" and g.max_size > 0]
    if all(g.desired == g.max_size for g in groups):
        return "running" if all(len(g.in_service) >= g.desired for g in groups) else "starting"
    if workers and all(g.desired == 0 for g in workers) and all(
            g.desired == g.max_size for g in groups if g.role == "master"):
        return "workers-scaled-down"
    return "partial"


STATE_TEXT = {
    "paused": "paused: no node runs; `resume` starts them",
    "pausing": "pausing: the nodes are terminating",
    "running": "running: every node is InService",
    "starting": "starting: nodes are launching (a GPU node boots and pulls the image in ~10-15 min)",
    "workers-scaled-down": "workers scaled down (idle): the master runs; the next `maskrcnn job "
                           "submit`, or `resume`, starts the workers",
    "partial": "partly scaled: the groups are between pause and resume",
}


def set_desired(session: boto3.session.Session, group: GroupState, desired: int) -> None:
    """Sets ``group``'s desired capacity, or says why the group cannot take it."""
    if not group.min_size <= desired <= group.max_size:
        raise LaunchError(
            f"group {group.name} allows {group.min_size} to {group.max_size} instances, not "
            f"{desired}: it was deployed before pause and resume existed (its MinSize is not 0); "
            f"redeploy the cluster stack (cdk deploy) to update the groups")
    session.client("autoscaling", config=CLIENT_CONFIG).set_desired_capacity(
        AutoScalingGroupName=group.name, DesiredCapacity=desired, HonorCooldown=False)


def pause(session: boto3.session.Session, groups: list[GroupState]) -> list[tuple[GroupState, int]]:
    """Sets every group to 0 (workers first, so nothing waits for a master that is going);
    returns (group, new desired) for each one changed."""
    changed = []
    for group in sorted(groups, key=lambda g: g.role != "worker"):
        if group.desired != 0:
            set_desired(session, group, 0)
            changed.append((group, 0))
    return changed


def active_runs(session: boto3.session.Session, stack_name: str, *,
                now: datetime | None = None) -> list[str]:
    """The runs of this deployment that are training: those whose latest run_active record in
    the last RUN_ACTIVE_WINDOW_S is 1 (CloudWatch, namespace training.metrics.NAMESPACE)."""
    now = now or datetime.now(timezone.utc)
    cloudwatch = session.client("cloudwatch", config=CLIENT_CONFIG)
    runs = []
    try:
        for page in cloudwatch.get_paginator("list_metrics").paginate(
                Namespace=m.NAMESPACE, MetricName=m.RUN_ACTIVE,
                Dimensions=[{"Name": m.DEPLOYMENT_DIMENSION, "Value": stack_name}]):
            for metric in page["Metrics"]:
                dims = {d["Name"]: d["Value"] for d in metric["Dimensions"]}
                if m.RUN_DIMENSION not in dims or dims.get(m.DEPLOYMENT_DIMENSION) != stack_name:
                    continue
                points = cloudwatch.get_metric_statistics(
                    Namespace=m.NAMESPACE, MetricName=m.RUN_ACTIVE, Dimensions=metric["Dimensions"],
                    StartTime=now - timedelta(seconds=RUN_ACTIVE_WINDOW_S),
                    EndTime=now + timedelta(seconds=60),   # the current minute included
                    Period=60, Statistics=["Minimum"])["Datapoints"]
                if points and max(points, key=lambda p: p["Timestamp"])["Minimum"] >= 1:
                    runs.append(dims[m.RUN_DIMENSION])
    except botocore.exceptions.ClientError as err:
        raise LaunchError(f"could not read the runs' records from CloudWatch ({err}): a running job "
                          f"would lose its steps since its last checkpoint; pass --force to pause anyway")
    return sorted(set(runs))


def refuse_pausing_runs(runs: list[str]) -> None:
    if runs:
        named = ", ".join(runs)
        raise LaunchError(
            f"run {named} is training: pausing now terminates its ranks within seconds, and it would "
            f"resume from its last periodic checkpoint. Stop it gracefully first, on the master "
            f"(the ConnectCommand output): `sudo maskrcnn job stop {runs[0]}` saves a checkpoint "
            f"and ends the job; then pause. `pause --force` pauses anyway")


def resume(session: boto3.session.Session, groups: list[GroupState]) -> list[tuple[GroupState, int]]:
    """Sets every group to its MaxSize (the configured size); returns the groups changed."""
    changed = []
    for group in groups:
        if group.desired != group.max_size:
            set_desired(session, group, group.max_size)
            changed.append((group, group.max_size))
    return changed


def scale_up_workers(session: boto3.session.Session, groups: list[GroupState]) -> GroupState | None:
    """Sets the worker group back to its MaxSize (the configured size) when it is below it (scaled
    down while idle); the group when it did."""
    worker = next((g for g in groups if g.role == "worker"), None)
    if worker is None or worker.desired >= worker.max_size:
        return None
    set_desired(session, worker, worker.max_size)
    return worker


def launch_suspended(groups: list[GroupState]) -> list[GroupState]:
    return [g for g in groups if "Launch" in g.suspended and g.max_size > 0]


def wait_in_service(session: boto3.session.Session, names: dict[str, str], *, timeout_s: float,
                    poll_s: float = POLL_S, clock=time.monotonic, sleep=time.sleep) -> list[GroupState]:
    """Waits until every group has as many InService instances as it desires."""
    deadline = clock() + timeout_s
    while True:
        groups = describe_groups(session, names)
        short = [g for g in groups if len(g.in_service) < g.desired]
        if not short:
            return groups
        if clock() + poll_s > deadline:
            raise LaunchError(
                f"not InService after waiting {timeout_s:.0f} s: " + ", ".join(
                    f"{g.name} has {len(g.in_service)} of {g.desired}" for g in short)
                + " (see the group's activity history in the EC2 console; an instance type "
                "without capacity in the zone, or a vCPU quota, keeps instances from launching)")
        print("waiting for InService instances: " + ", ".join(
            f"{g.role} {len(g.in_service)}/{g.desired}" for g in groups), flush=True)
        sleep(poll_s)


def group_names(session: boto3.session.Session, stack_name: str) -> dict[str, str]:
    out = stack_outputs(session, stack_name)
    return {"master": require_output(out, outputs.MASTER_ASG_NAME, stack_name),
            "worker": require_output(out, outputs.WORKER_ASG_NAME, stack_name)}


def status_json(stack_name: str, groups: list[GroupState]) -> dict:
    state = cluster_state(groups)
    return {"stack": stack_name, "state": state, "paused": state == "paused",
            "groups": [{"role": g.role, "name": g.name, "desired": g.desired,
                        "in_service": len(g.in_service), "instances": len(g.instances),
                        "min": g.min_size, "max": g.max_size,
                        "suspended_processes": list(g.suspended)} for g in groups]}


def status_text(stack_name: str, groups: list[GroupState]) -> str:
    lines = [f"cluster {stack_name}: {STATE_TEXT[cluster_state(groups)]}"]
    width = max(len(g.name) for g in groups)
    for g in groups:
        line = (f"  {g.role:<6}  {g.name:<{width}}  desired {g.desired} of {g.max_size}, "
                f"{len(g.in_service)} InService")
        if g.suspended:
            line += f"; suspended: {', '.join(g.suspended)}"
        lines.append(line)
    return "\n".join(lines)


def _warn_launch_suspended(groups: list[GroupState]) -> None:
    for g in launch_suspended(groups):
        print(f"warning: {g.name} has its Launch process suspended (after repeated failed boots: "
              f"see the alerts topic and docs/infra.md), so it launches nothing; fix the cause, then "
              f"`aws autoscaling resume-processes --auto-scaling-group-name {g.name} "
              f"--scaling-processes Launch`", file=sys.stderr)


def main(argv: list[str] | None = None, *, clock=time.monotonic, sleep=time.sleep) -> int:
    def deployment_options(parser: argparse.ArgumentParser, default) -> None:
        parser.add_argument("--region", default=default)
        parser.add_argument("--name-prefix", "--stack-prefix", dest="name_prefix", default=default,
                            help="the deployment's name_prefix (default: this node's, or the settings file's)")
        parser.add_argument("--stack", default=default,
                            help=f"the cluster stack's name (default {outputs.EFS_CLUSTER_STACK}, "
                                 "with the name prefix in front)")

    p = argparse.ArgumentParser(prog="maskrcnn cluster",
                                description=__doc__.splitlines()[0])
    deployment_options(p, None)
    # The same options after the command too (`pause --region R`); given there, they win.
    common = argparse.ArgumentParser(add_help=False)
    deployment_options(common, argparse.SUPPRESS)
    sub = p.add_subparsers(dest="command", required=True)
    status = sub.add_parser("status", parents=[common], help="each group's desired and InService counts")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    pause_cmd = sub.add_parser("pause", parents=[common],
                               help="every node terminates; data and settings stay (refused while a run trains)")
    pause_cmd.add_argument("--force", action="store_true",
                           help="pause even while a run trains: it resumes from its last periodic checkpoint")
    resume_cmd = sub.add_parser("resume", parents=[common], help="each group back to its configured size")
    resume_cmd.add_argument("--wait", action="store_true",
                            help="wait until every instance is InService (its boot and image pull "
                                 "take ~10-15 min more; a queued job starts once they pass their health checks)")
    resume_cmd.add_argument("--timeout", type=float, default=WAIT_TIMEOUT_S,
                            help="seconds --wait waits at most")
    a = p.parse_args(argv)
    try:
        session = make_session(a.region)
        stack_name = deployment.stack_name(outputs.EFS_CLUSTER_STACK, stack=a.stack, prefix=a.name_prefix)
        names = group_names(session, stack_name)
        groups = describe_groups(session, names)
        if a.command == "status":
            print(json.dumps(status_json(stack_name, groups), indent=2) if a.json
                  else status_text(stack_name, groups))
            return 0
        if a.command == "pause":
            if any(g.instances for g in groups):
                runs = [] if a.force else active_runs(session, stack_name)
                refuse_pausing_runs(runs)
            changed = pause(session, groups)
            for g, new in changed:
                print(f"{g.role} group {g.name}: desired {g.desired} -> {new}")
            print(f"{stack_name} paused: {'its nodes terminate now' if changed else 'it was already'}; "
                  f"EFS, the bucket, the image and the settings are kept. "
                  f"`maskrcnn cluster resume` starts the nodes again.")
            return 0
        _warn_launch_suspended(groups)
        changed = resume(session, groups)
        for g, new in changed:
            print(f"{g.role} group {g.name}: desired {g.desired} -> {new}")
        if not changed:
            print(f"{stack_name}: every group is already at its configured size")
        if a.wait:
            groups = wait_in_service(session, names, timeout_s=a.timeout, clock=clock, sleep=sleep)
            print(status_text(stack_name, groups))
        print("the nodes boot and pull the training image (~10-15 min for a GPU node); "
              "a queued job starts once they have joined Slurm and passed their health checks")
        return 0
    except LaunchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
