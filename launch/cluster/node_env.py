"""The node contract's file on every cluster node: /etc/maskrcnn/cluster.env, KEY=VALUE lines the
boot script (infra/userdata/cluster_node.sh) writes from the stack's values and the instance's own
(its address, id, type and GPU count). The container mounts /etc/maskrcnn, so every command on a
node reads the cluster from here."""
from __future__ import annotations

from infra.node_contract import CLUSTER_ENV
from launch.aws import LaunchError

__all__ = ["CLUSTER_ENV", "read_cluster_env"]


def read_cluster_env(path: str = CLUSTER_ENV) -> dict[str, str]:
    """KEY=VALUE lines written by the nodes' user data."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        raise LaunchError(f"{path} not found: run this on a cluster node, inside the maskrcnn container "
                          f"(maskrcnn job does), or pass --cluster-env") from None
    env = {}
    for line in lines:
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            env[key.strip()] = value.strip().strip('"')
    return env
