"""The body of a cluster training job: what runs inside its Slurm allocation, once per attempt.

``launch.cluster.jobs submit`` queues it with ``sbatch --requeue``; Slurm starts it on the first node
of the allocation after the job prolog has checked every node. Each attempt:

1. copies the dataset to every node's local NVMe when the run reads it there (one ``srun`` task per
   node; a node whose copy is complete skips it);
2. starts the ranks with ``mpirun`` inside the allocation (Open MPI starts its daemons with srun);
3. watches the run's heartbeat (``<logdir>/heartbeat.json``, written by rank 0): a run whose step has
   not advanced for ``--stall-minutes`` is stopped (a hang in a collective, a dead NFS mount);
4. ends the attempt: done when training succeeded; failed for good when training rejected its
   configuration (restarting would not help) or after ``--max-attempts``; otherwise requeued with
   ``scontrol requeue``, so the next attempt resumes from the latest checkpoint in the same log
   directory, on the same number of nodes (the job asks for a fixed count).

A node that fails (its slurmd stops answering, its health check fails) ends the attempt too: Slurm
kills and requeues the job itself. Slurm counts attempts in ``SLURM_RESTART_COUNT``.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from launch.cluster.launch_command import format_command, mpirun_in_allocation, train_command
from launch.cluster.stage import DataPlan, stage_argv

CONFIG_ERROR_STATUS = 2      # training.train's exit status for bad configuration or data
STALLED_STATUS = 3           # this attempt was stopped by the step watchdog
HEARTBEAT_FILE = "heartbeat.json"
WATCH_POLL_S = 10


def attempt_number() -> int:
    return int(os.environ.get("SLURM_RESTART_COUNT", "0")) + 1


def heartbeat_step(logdir: str) -> int | None:
    import json
    try:
        return int(json.loads(Path(logdir, HEARTBEAT_FILE).read_text())["step"])
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return None


class StepWatchdog:
    """Stops ``proc`` when the heartbeat's step has not advanced for ``stall_s`` seconds.

    The clock starts when the attempt starts (a run's first step includes building the graph and
    loading data, so ``stall_s`` must allow for that) and restarts at every new step."""

    def __init__(self, proc: subprocess.Popen, logdir: str, *, stall_s: float, poll_s: float = WATCH_POLL_S,
                 clock=time.monotonic):
        self.proc, self.logdir, self.stall_s, self.poll_s, self.clock = proc, logdir, stall_s, poll_s, clock
        self.stalled_at: int | None = None
        self.fired = False
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def start(self) -> StepWatchdog:
        self._thread.start()
        return self

    def _watch(self) -> None:
        step, since = heartbeat_step(self.logdir), self.clock()
        while self.proc.poll() is None:
            time.sleep(self.poll_s)
            now_step = heartbeat_step(self.logdir)
            if now_step != step:
                step, since = now_step, self.clock()
            elif self.clock() - since > self.stall_s:
                self.fired, self.stalled_at = True, step
                print(f"watchdog: no training step for {self.stall_s / 60:.0f} min (last step "
                      f"{step if step is not None else 'none yet'}): stopping this attempt", flush=True)
                _stop(self.proc)
                return


def _stop(proc: subprocess.Popen, grace_s: float = 100) -> None:
    """SIGTERM the ranks (training checkpoints at the next step if it can), SIGKILL after ``grace_s``."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def requeue() -> None:
    """Puts this job back in the queue: Slurm ends this attempt and starts the next when the nodes are free."""
    job = os.environ["SLURM_JOB_ID"]
    subprocess.run(["scontrol", "requeue", job], check=True)
    time.sleep(600)       # Slurm terminates this script; the sleep only keeps it from exiting first


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--logdir", required=True)
    p.add_argument("--data-dir", required=True, help="where training reads the dataset (on every node)")
    p.add_argument("--stage-from", help="copy the dataset from here to --data-dir on every node first")
    p.add_argument("--ranks-per-node", type=int, default=1)
    p.add_argument("--efa", action="store_true")
    p.add_argument("--instance-type", default="")
    p.add_argument("--max-attempts", type=int, default=4)
    p.add_argument("--stall-minutes", type=float, default=30.0)
    p.add_argument("overrides", nargs="*")
    a = p.parse_args(argv)
    nodes = int(os.environ.get("SLURM_JOB_NUM_NODES", "1"))
    attempt = attempt_number()
    print(f"attempt {attempt} of job {os.environ.get('SLURM_JOB_ID', '?')} on {nodes} node(s) "
          f"({os.environ.get('SLURM_JOB_NODELIST', '?')}), {nodes * a.ranks_per_node} rank(s)", flush=True)
    if a.stage_from:
        plan = DataPlan(train_dir=a.data_dir, stage_from=a.stage_from)
        print(f"copying {a.stage_from} to {a.data_dir} on every node (skipped where complete)", flush=True)
        rc = subprocess.call(["srun", "--ntasks-per-node=1", "--kill-on-bad-exit=1", *stage_argv(plan)])
        if rc != 0:
            print(f"copying the dataset to local NVMe failed (exit {rc}); see the lines above", flush=True)
            return _fail_or_requeue(rc, attempt, a.max_attempts)
    cmd = mpirun_in_allocation(ranks=nodes * a.ranks_per_node, efa=a.efa,
                               instance_types=[a.instance_type] if a.instance_type else [],
                               train=train_command(logdir=a.logdir, data_dir=a.data_dir, overrides=a.overrides))
    print(format_command(cmd), flush=True)
    Path(a.logdir).mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(cmd, start_new_session=True)
    forward = lambda signum, _frame: _stop(proc)          # noqa: E731  scancel / requeue: stop the ranks
    signal.signal(signal.SIGTERM, forward)
    watchdog = StepWatchdog(proc, a.logdir, stall_s=a.stall_minutes * 60).start()
    rc = proc.wait()
    if watchdog.fired:
        rc = STALLED_STATUS
    if rc == 0:
        print(f"training finished; logs and checkpoints in {a.logdir}", flush=True)
        return 0
    if rc == CONFIG_ERROR_STATUS:
        print(f"training rejected its configuration or data (exit {rc}, see the error above); fix it and "
              f"submit again: restarting would not help", flush=True)
        return rc
    return _fail_or_requeue(rc, attempt, a.max_attempts)


def _fail_or_requeue(rc: int, attempt: int, max_attempts: int) -> int:
    if attempt >= max_attempts:
        print(f"attempt {attempt} failed (exit {rc}); that was the last of {max_attempts} attempts: "
              f"submit again with --resume to continue from the latest checkpoint", flush=True)
        return rc
    print(f"attempt {attempt} failed (exit {rc}); requeued: the next attempt resumes from the latest "
          f"checkpoint once the job's nodes are healthy", flush=True)
    requeue()
    return rc


if __name__ == "__main__":
    sys.exit(main())
