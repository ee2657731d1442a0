"""Cluster nodes from the master and worker auto-scaling groups: InService, Healthy instances, their
private IPs, and GPUs per node from EC2's instance-type data (``nvidia-smi -L`` on each node is
checked against it by launch/cluster/health.py).

``python -m launch.cluster.hostfile [--out FILE]`` prints or writes the hostfile, reading the ASG
names from /etc/maskrcnn/cluster.env.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import boto3

from launch.aws import LaunchError
from launch.cluster.launch_command import DEFAULT_SSH_KEY, Node, hostfile_text

CLUSTER_ENV = "/etc/maskrcnn/cluster.env"


def cluster_key(cluster_env: str = CLUSTER_ENV) -> Path:
    """The cluster's SSH key: the boot script installs it next to cluster.env (``ssh/id_ed25519``)."""
    return Path(cluster_env).parent / Path(DEFAULT_SSH_KEY).parent.name / Path(DEFAULT_SSH_KEY).name


@dataclass(frozen=True)
class ClusterNode:
    instance_id: str
    private_ip: str
    instance_type: str
    role: str          # "master" or "worker"
    gpus: int          # from the instance type; 0 on CPU instances
    efa: bool = False  # an EFA network interface is attached

    def as_node(self) -> Node:
        return Node(self.private_ip, max(self.gpus, 1))


def read_cluster_env(path: str = CLUSTER_ENV) -> dict[str, str]:
    """KEY=VALUE lines written by the nodes' user data."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        raise LaunchError(f"{path} not found: run this on a cluster node (inside the maskrcnn "
                          f"container), or pass --master-asg/--worker-asg and --region") from None
    env = {}
    for line in lines:
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            env[key.strip()] = value.strip().strip('"')
    return env


def _gpu_counts(ec2, instance_types: set[str]) -> dict[str, int]:
    counts = {}
    if not instance_types:
        return counts
    for page in ec2.get_paginator("describe_instance_types").paginate(InstanceTypes=sorted(instance_types)):
        for it in page["InstanceTypes"]:
            gpus = it.get("GpuInfo", {}).get("Gpus", [])
            counts[it["InstanceType"]] = sum(g.get("Count", 0) for g in gpus)
    return counts


def discover_nodes(session: boto3.session.Session, *, master_asg: str,
                   worker_asg: str | None) -> list[ClusterNode]:
    """Nodes of both groups, master first then workers by IP (rank 0 lands on the master)."""
    autoscaling = session.client("autoscaling")
    ec2 = session.client("ec2")
    names = [n for n in (master_asg, worker_asg) if n]
    groups = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=names)["AutoScalingGroups"]
    found = {g["AutoScalingGroupName"]: g for g in groups}
    missing = [n for n in names if n not in found]
    if missing:
        raise LaunchError(f"auto-scaling group(s) {', '.join(missing)} not found in {session.region_name}: "
                          f"check MASTER_ASG_NAME/WORKER_ASG_NAME in {CLUSTER_ENV} or the stack outputs")
    role_of = {}
    for name, role in ((master_asg, "master"), (worker_asg, "worker")):
        if not name:
            continue
        for inst in found[name].get("Instances", []):
            if inst["LifecycleState"] == "InService" and inst.get("HealthStatus", "Healthy") == "Healthy":
                role_of[inst["InstanceId"]] = role
    if not role_of:
        return []
    instances = []
    for page in ec2.get_paginator("describe_instances").paginate(InstanceIds=sorted(role_of)):
        for reservation in page["Reservations"]:
            instances += [i for i in reservation["Instances"] if i["State"]["Name"] == "running"]
    gpus = _gpu_counts(ec2, {i["InstanceType"] for i in instances})
    nodes = [ClusterNode(i["InstanceId"], i["PrivateIpAddress"], i["InstanceType"], role_of[i["InstanceId"]],
                         gpus.get(i["InstanceType"], 0),
                         any(ni.get("InterfaceType") == "efa" for ni in i.get("NetworkInterfaces", [])))
             for i in instances]
    return sorted(nodes, key=lambda n: (n.role != "master", tuple(int(x) for x in n.private_ip.split("."))))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Write the MPI hostfile of the cluster's InService nodes.")
    p.add_argument("--cluster-env", default=CLUSTER_ENV)
    p.add_argument("--master-asg")
    p.add_argument("--worker-asg")
    p.add_argument("--region")
    p.add_argument("--out", help="file to write (default: print)")
    a = p.parse_args(argv)
    try:
        env = {} if a.master_asg else read_cluster_env(a.cluster_env)
        session = boto3.session.Session(region_name=a.region or env.get("AWS_REGION"))
        nodes = discover_nodes(session, master_asg=a.master_asg or env["MASTER_ASG_NAME"],
                               worker_asg=a.worker_asg or env.get("WORKER_ASG_NAME"))
    except LaunchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    text = hostfile_text([n.as_node() for n in nodes])
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0 if nodes else 1


if __name__ == "__main__":
    sys.exit(main())
