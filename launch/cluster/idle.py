"""Pause the cluster (workers, then the master) after IDLE_SCALEDOWN_MINUTES without a training job.

On the master, the systemd timer maskrcnn-idle.timer (infra/userdata/cluster_node.sh) runs this
every minute in the training container:

    docker exec maskrcnn python -m launch.cluster.idle

The cluster is busy when either
  - Slurm has a job in its queue (``squeue``: pending, running or requeued; a job waiting for the
    workers to come back counts too), or Slurm cannot be asked (slurmctld down: nothing is scaled
    down on a guess), or
  - a training process runs in the master's container (mpirun, horovodrun or `python -m
    training.train` started by hand, outside Slurm).
`maskrcnn job submit` holds the run lock (:func:`training_lock`) shared while it queues a job and
scales the workers up; the check holds it exclusively while it decides and scales, so a job queued
in that moment is either seen by the check or scales the workers back up after it.

The idle time is kept in <EFS>/.maskrcnn/<stack>/idle.json, so a restarted container or a replaced
master continues the count. It counts only over consecutive checks that saw the workers up and no
job: after more than MAX_GAP_S without a check (the master was paused, replaced or rebooted), or once
the workers are up again after being at 0, it starts from zero, so a resumed cluster is not paused
at once. At the limit both groups go to 0 nodes, as `maskrcnn cluster pause` sets them: an idle
master is a full GPU node too, and nothing would watch it. `maskrcnn cluster resume --wait` starts
the cluster again. 0 minutes turns the check off.
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import boto3

from launch.aws import LaunchError
from launch.cluster import capacity
from launch.cluster.node_env import CLUSTER_ENV, read_cluster_env

# In the master's container, where both `maskrcnn job submit` and this check run (docker exec).
RUN_LOCK = "/tmp/maskrcnn-training.lock"
STATE_NAME = "idle.json"
# The timer fires every minute; a longer silence means no check ran (the master was off).
MAX_GAP_S = 5 * 60
TRAINING_PROGRAMS = frozenset({"mpirun", "mpiexec", "orterun", "prterun", "orted", "prted",
                               "horovodrun"})
TRAINING_MODULES = frozenset({"training.train"})


def _open_lock(path: str) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT, 0o666)


@contextlib.contextmanager
def training_lock(path: str | None = None) -> Iterator[None]:
    """Held while a job is queued and the workers scaled up: the idle check does not decide in
    between. Shared, so that two submits do not wait for each other; it waits only while an idle
    check holds it (seconds)."""
    fd = _open_lock(path or RUN_LOCK)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def _check_lock(path: str) -> Iterator[bool]:
    """True when no run holds the run lock; held exclusively until the block ends."""
    fd = _open_lock(path)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
        else:
            yield True
    finally:
        os.close(fd)


def is_training(argv: list[str]) -> bool:
    if not argv:
        return False
    if os.path.basename(argv[0]) in TRAINING_PROGRAMS:
        return True
    return any(flag == "-m" and module in TRAINING_MODULES for flag, module in zip(argv, argv[1:]))


def training_processes(proc_root: str = "/proc") -> list[str]:
    """Command lines of the training processes running here (this container's processes)."""
    found = []
    for entry in Path(proc_root).iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            raw = (entry / "cmdline").read_bytes()
        except OSError:   # ended meanwhile
            continue
        argv = [arg for arg in raw.decode(errors="replace").split("\0") if arg]
        if is_training(argv):
            found.append(" ".join(argv)[:200])
    return found


def slurm_jobs() -> list[str]:
    """The jobs in Slurm's queue, as "NAME (STATE)"; one entry saying so when Slurm does not answer."""
    from launch.cluster.jobs import queue   # jobs imports this module for the lock
    try:
        return [f"Slurm job {j['job_id']} {j['name']} ({j['state']})" for j in queue()]
    except LaunchError as err:
        return [f"Slurm did not answer ({err})"]


def idle_minutes(env: dict[str, str]) -> int:
    raw = env.get("IDLE_SCALEDOWN_MINUTES", "0").strip() or "0"
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise LaunchError(f"IDLE_SCALEDOWN_MINUTES in {CLUSTER_ENV} is {raw!r}, not a whole number "
                          f"of minutes: set idle_scaledown_minutes in the settings and redeploy")
    return value


def state_file(env: dict[str, str]) -> Path:
    return Path(env.get("EFS_MOUNT", "/efs"), ".maskrcnn", env["STACK_NAME"], STATE_NAME)


def read_state(path: Path) -> dict:
    try:
        state = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as err:
        print(f"{path} is unreadable ({err}): counting the idle time from now", file=sys.stderr)
        return {}
    return state if isinstance(state, dict) else {}


def write_state(path: Path, state: dict) -> None:
    """Replaces ``path`` atomically: a check killed midway leaves the previous state."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(state, handle)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def check(session: boto3.session.Session, env: dict[str, str], *, now: float,
          lock_path: str | None = None, proc_root: str = "/proc", jobs=slurm_jobs) -> str:
    """One idle check at time ``now`` (seconds since the epoch); pauses the cluster (both groups to
    0) when it has been idle long enough. ``jobs()`` lists what keeps the cluster busy (Slurm's queue).
    Returns what it found, for the log."""
    minutes = idle_minutes(env)
    if minutes == 0:
        return "idle scale-down is off (IDLE_SCALEDOWN_MINUTES=0)"
    worker = env.get("WORKER_ASG_NAME")
    if not worker:
        return "the cluster has no worker group"
    path = state_file(env)
    with _check_lock(lock_path or RUN_LOCK) as no_run:
        state = read_state(path)
        busy = (jobs() + training_processes(proc_root)) if no_run else ["a job is being submitted"]
        if busy:
            write_state(path, {**state, "last_check": now, "idle_since": None,
                               "workers_desired": None})
            return f"busy ({busy[0]}): not idle"
        names = {"worker": worker, "master": env.get("MASTER_ASG_NAME", "")}
        groups = capacity.describe_groups(session, names)
        group = next(g for g in groups if g.role == "worker")
        last_check, idle_since = state.get("last_check"), state.get("idle_since")
        if (idle_since is None or last_check is None or now - last_check > MAX_GAP_S
                or (state.get("workers_desired") == 0 and group.desired > 0)):
            idle_since = now   # the count starts again (see the module's docstring)
        idle_s = now - idle_since
        if idle_s < minutes * 60:
            write_state(path, {**state, "last_check": now, "idle_since": idle_since,
                               "workers_desired": group.desired})
            return (f"no training job for {idle_s / 60:.0f} min: the cluster pauses after {minutes}")
        # Workers first, then the master, which runs this check: its group terminates it.
        changed = capacity.pause(session, groups)
        write_state(path, {**state, "last_check": now, "idle_since": None, "workers_desired": 0,
                           "paused_at": now})
        sizes = ", ".join(f"{g.role} group {g.name} from {g.desired} to {new}" for g, new in changed)
        return (f"paused the cluster after {idle_s / 60:.0f} min without a training job: "
                f"{sizes or 'every group was at 0 already'}; `maskrcnn cluster resume --wait` "
                f"starts it again")


def mark_left(env: dict[str, str]) -> None:
    """Every minute, the runs whose job left the queue without its script saying so are marked
    ended (:func:`launch.cluster.jobs.mark_left_jobs`), so a SageMaker job may continue them."""
    from launch.cluster.jobs import mark_left_jobs   # jobs imports this module for the lock
    try:
        marked = mark_left_jobs(env)
    except (LaunchError, OSError) as err:
        print(f"could not check which runs' jobs have left the queue: {err}", file=sys.stderr)
        return
    for run in marked:
        print(f"run {run}: its job left Slurm's queue without ending an attempt; marked ended", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m launch.cluster.idle",
                                description=__doc__.splitlines()[0])
    p.add_argument("--cluster-env", default=CLUSTER_ENV)
    a = p.parse_args(argv)
    try:
        env = read_cluster_env(a.cluster_env)
        session = boto3.session.Session(region_name=env.get("AWS_REGION"))
        print(check(session, env, now=time.time()), flush=True)
        mark_left(env)
    except LaunchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
