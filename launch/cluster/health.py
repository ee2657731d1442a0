"""Per-node health of the cluster: reachable, GPUs visible, the master's EFS visible, same training code.

"EFS visible" means the node sees a file the master has just written into its EFS mount: a node
whose mount failed (an empty local /efs), or that mounted another file system, does not, whatever
its mount table says.

Checks run as commands on each node through a :class:`CommandRunner`: :class:`SshRunner` on the
cluster (the cluster key, port 2222, as mpirun uses them), :class:`LocalRunner` to check this machine
(and to test the checks themselves without a cluster).

``python -m launch.cluster.health`` prints the table for every InService node and exits non-zero
when any node is unhealthy.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import socket
import subprocess
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from dataclasses import dataclass, field
from typing import Protocol

from launch.cluster.launch_command import DEFAULT_SSH_KEY, DEFAULT_SSH_PORT, ssh_args

MARKER_DIR = ".maskrcnn/health"  # under the EFS mount: where the master leaves the file nodes must see


class CommandRunner(Protocol):
    def run(self, host: str, argv: list[str], timeout: float) -> subprocess.CompletedProcess: ...


class LocalRunner:
    """Runs the check commands on this machine, whatever the host name."""

    def run(self, host: str, argv: list[str], timeout: float) -> subprocess.CompletedProcess:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


class SshRunner:
    """Runs the check commands on ``host`` over SSH with the cluster key."""

    def __init__(self, port: int = DEFAULT_SSH_PORT, key: str | os.PathLike = DEFAULT_SSH_KEY, user: str = "root"):
        self.options = ssh_args(port=port, key=str(key)).split() + ["-o", "ConnectTimeout=10"]
        self.user = user

    def run(self, host: str, argv: list[str], timeout: float) -> subprocess.CompletedProcess:
        import shlex
        remote = " ".join(shlex.quote(a) for a in argv)
        return subprocess.run(["ssh", *self.options, f"{self.user}@{host}", remote],
                              capture_output=True, text=True, timeout=timeout)


@dataclass
class NodeHealth:
    host: str
    role: str
    expected_gpus: int
    reachable: bool = False
    gpus_visible: int | None = None
    efs_mounted: bool | None = None
    code_version: str | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def healthy(self) -> bool:
        return not self.problems


def _run(runner: CommandRunner, host: str, argv: list[str], timeout: float):
    try:
        return runner.run(host, argv, timeout)
    except (subprocess.TimeoutExpired, OSError) as err:
        return subprocess.CompletedProcess(argv, 255, "", str(err))


@contextlib.contextmanager
def efs_marker(efs_mount: str):
    """A file in the master's EFS mount for the nodes to find, removed afterwards."""
    directory = Path(efs_mount, MARKER_DIR)
    directory.mkdir(parents=True, exist_ok=True)
    marker = directory / f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    marker.write_text("written by the master's health check\n")
    try:
        yield marker
    finally:
        marker.unlink(missing_ok=True)


def check_node(runner: CommandRunner, host: str, *, role: str = "worker", expected_gpus: int = 0,
               efs_mount: str = "/efs", efs_marker: str | os.PathLike | None = None,
               expected_code_version: str | None = None, python: str = "python",
               timeout: float = 30.0) -> NodeHealth:
    """All checks on one node; a node that is not reachable gets no further checks.

    ``efs_marker``: a file the master wrote into ``efs_mount`` (see :func:`efs_marker`).
    """
    h = NodeHealth(host, role, expected_gpus)
    probe = _run(runner, host, ["true"], timeout)
    h.reachable = probe.returncode == 0
    if not h.reachable:
        h.problems.append(f"unreachable: {(probe.stderr or '').strip()[:120] or 'exit %d' % probe.returncode}")
        return h

    gpus = _run(runner, host, ["nvidia-smi", "-L"], timeout)
    h.gpus_visible = sum(1 for line in gpus.stdout.splitlines() if line.startswith("GPU ")) \
        if gpus.returncode == 0 else 0
    if h.gpus_visible < expected_gpus:
        h.problems.append(f"{h.gpus_visible} of {expected_gpus} GPUs visible")

    if efs_marker is not None:
        seen = _run(runner, host, ["test", "-f", str(efs_marker)], timeout)
        h.efs_mounted = seen.returncode == 0
        if not h.efs_mounted:
            h.problems.append(f"{efs_mount} does not show the master's EFS (not mounted, or another file system)")

    version = _run(runner, host, [python, "-m", "launch.code_version"], timeout * 2)
    h.code_version = version.stdout.strip() if version.returncode == 0 else None
    if h.code_version is None:
        err = (version.stderr or "").strip().splitlines()
        h.problems.append("code version unknown" + (f": {err[-1][:100]}" if err else ""))
    elif expected_code_version and h.code_version != expected_code_version:
        h.problems.append(f"code {h.code_version} differs from master's {expected_code_version}")
    return h


def check_cluster(runner: CommandRunner, nodes: list[tuple[str, str, int]], *, expected_code_version: str | None,
                  efs_mount: str = "/efs", python: str = "python", parallel: int = 16) -> list[NodeHealth]:
    """``nodes`` as (host, role, expected GPUs); checked in parallel, results in the same order.
    Run on the master: it writes the EFS marker every node must see."""
    with efs_marker(efs_mount) as marker, \
            ThreadPoolExecutor(max_workers=max(1, min(parallel, len(nodes)))) as pool:
        futures = [pool.submit(check_node, runner, host, role=role, expected_gpus=gpus, efs_mount=efs_mount,
                               efs_marker=marker, expected_code_version=expected_code_version, python=python)
                   for host, role, gpus in nodes]
        return [f.result() for f in futures]


def _mark(value: bool | None) -> str:
    return "-" if value is None else ("yes" if value else "NO")


def format_table(results: list[NodeHealth]) -> str:
    header = ("NODE", "ROLE", "REACHABLE", "GPUS", "EFS", "CODE", "STATUS")
    rows = [header]
    for h in results:
        gpus = "-" if h.gpus_visible is None else f"{h.gpus_visible}/{h.expected_gpus}"
        rows.append((h.host, h.role, _mark(h.reachable), gpus, _mark(h.efs_mounted), h.code_version or "-",
                     "ok" if h.healthy else "; ".join(h.problems)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header) - 1)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r[:-1], widths)) + "  " + r[-1] for r in rows]
    healthy = sum(h.healthy for h in results)
    lines.append(f"{healthy} of {len(results)} nodes healthy")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import boto3

    from launch.aws import LaunchError
    from launch.cluster.hostfile import CLUSTER_ENV, cluster_key, discover_nodes, read_cluster_env
    from launch.code_version import code_version

    p = argparse.ArgumentParser(description="Check every cluster node: reachable, GPUs, EFS, code version.")
    p.add_argument("--cluster-env", default=CLUSTER_ENV)
    a = p.parse_args(argv)
    try:
        env = read_cluster_env(a.cluster_env)
        session = boto3.session.Session(region_name=env.get("AWS_REGION"))
        nodes = discover_nodes(session, master_asg=env["MASTER_ASG_NAME"], worker_asg=env.get("WORKER_ASG_NAME"))
    except LaunchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    runner = SshRunner(port=int(env.get("SSH_PORT", DEFAULT_SSH_PORT)), key=cluster_key(a.cluster_env))
    results = check_cluster(runner, [(n.private_ip, n.role, n.gpus) for n in nodes],
                            expected_code_version=code_version(), efs_mount=env.get("EFS_MOUNT", "/efs"))
    print(format_table(results))
    return 0 if results and all(h.healthy for h in results) else 1


if __name__ == "__main__":
    sys.exit(main())
