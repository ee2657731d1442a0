"""Parameter-server cluster layouts and TF_CONFIG, for local processes and for SageMaker hosts.

TensorFlow 2's ParameterServerStrategy has three task types: one ``chief`` (the coordinator: it
builds the model, schedules steps and evaluates; it computes no gradients itself), ``worker``
tasks (compute gradients and push updates, asynchronously) and ``ps`` tasks (hold the variables).
Every process reads its own TF_CONFIG: the same cluster, a different ``task``.

SageMaker's TensorFlow containers name the coordinator ``master`` (the TF1 name); TF2 needs
``chief``, so ``normalize`` renames it. The SageMaker layout follows AWS's SageMaker lab
"Distributed training with SageMaker's script mode using Parameter Server and Horovod": with N
instances, one parameter server on every instance, the coordinator on the first, workers on the
other N-1.
"""
from __future__ import annotations

import json
import socket
from dataclasses import dataclass

CHIEF, WORKER, PS = "chief", "worker", "ps"
# The ports SageMaker's TensorFlow toolkit uses for its parameter-server mode.
SAGEMAKER_TASK_PORT = 2222
SAGEMAKER_PS_PORT = 2223


@dataclass(frozen=True)
class Task:
    type: str
    index: int


def tf_config(cluster: dict[str, list[str]], task: Task) -> str:
    """The TF_CONFIG value for one process of ``cluster``."""
    if task.type not in cluster or not 0 <= task.index < len(cluster[task.type]):
        raise ValueError(f"task {task} is not in the cluster {cluster}")
    return json.dumps({"cluster": cluster, "task": {"type": task.type, "index": task.index}})


def normalize(config: dict) -> dict:
    """Rename the TF1 ``master`` job to TF2's ``chief`` (SageMaker's containers still say master)."""
    config = json.loads(json.dumps(config))
    cluster = config.get("cluster", {})
    if "master" in cluster:
        cluster[CHIEF] = cluster.pop("master")
    if config.get("task", {}).get("type") == "master":
        config["task"]["type"] = CHIEF
    config.pop("environment", None)
    return config


def validate_counts(workers: int, ps: int) -> None:
    """ParameterServerStrategy needs at least one worker to compute and one ps to hold variables."""
    if ps < 1:
        raise ValueError(f"the ps strategy needs at least 1 parameter server, got --ps {ps}")
    if workers < 1:
        raise ValueError(f"the ps strategy needs at least 1 worker, got --workers {workers}")


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct ports free right now (held open together so none repeats)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def local_cluster(workers: int, ps: int, host: str = "127.0.0.1") -> dict[str, list[str]]:
    """One chief, ``workers`` workers and ``ps`` parameter servers as processes on this machine."""
    validate_counts(workers, ps)
    ports = iter(free_ports(1 + workers + ps, host))
    return {
        CHIEF: [f"{host}:{next(ports)}"],
        WORKER: [f"{host}:{next(ports)}" for _ in range(workers)],
        PS: [f"{host}:{next(ports)}" for _ in range(ps)],
    }


def sagemaker_cluster(hosts: list[str], current_host: str) -> tuple[dict[str, list[str]], list[Task]]:
    """The script-mode lab's layout over SageMaker's hosts, and the tasks that ``current_host`` runs.

    Hosts are sorted as SageMaker's SM_HOSTS lists them; the first coordinates.
    """
    if len(hosts) < 2:
        raise ValueError(
            f"the ps strategy on SageMaker needs at least 2 instances (the first coordinates, the "
            f"others compute), got {len(hosts)}: raise instance_count or use the horovod strategy")
    if current_host not in hosts:
        raise ValueError(f"current host {current_host!r} is not in the host list {hosts}")
    cluster = {
        CHIEF: [f"{hosts[0]}:{SAGEMAKER_TASK_PORT}"],
        WORKER: [f"{h}:{SAGEMAKER_TASK_PORT}" for h in hosts[1:]],
        PS: [f"{h}:{SAGEMAKER_PS_PORT}" for h in hosts],
    }
    i = hosts.index(current_host)
    tasks = [Task(PS, i), Task(CHIEF, 0) if i == 0 else Task(WORKER, i - 1)]
    return cluster, tasks
