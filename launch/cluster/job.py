"""The body of a cluster training job: what runs inside its Slurm allocation, once per attempt.

``launch.cluster.jobs submit`` queues it with ``sbatch --requeue``; Slurm starts it on the first node
of the allocation after the job prolog has checked every node. Each attempt:

1. copies the dataset to every node's local NVMe when the run reads it there (one ``srun`` task per
   node; a node whose copy is complete skips it);
2. starts the ranks with ``mpirun`` inside the allocation (Open MPI starts its daemons with srun);
3. watches the run's heartbeat (``<logdir>/heartbeat.json``, written by rank 0): a run whose step has
   not advanced for ``--stall-minutes`` is stopped (a hang in a collective, a dead NFS mount);
4. ends the attempt: done when training succeeded; failed for good when training rejected its
   configuration (restarting would not help) or when this was the job's ``--max-attempts``-th
   failure; otherwise requeued with ``scontrol requeue``, so the next attempt resumes from the
   latest checkpoint in the same log directory, on the same number of nodes (the job asks for a
   fixed count).

The failure budget counts only the attempts this script judged failed (training's error exit, a
stall, a failed all-reduce check or dataset copy), recorded in ``<logdir>/attempts.json``. Slurm's
``SLURM_RESTART_COUNT`` counts every requeue, the ones the system caused too (sbatch(1): "If the job
has been restarted due to system failure or has been explicitly requeued, this will be sent to the
number of times the job has been restarted"): a spot reclaim, a node failure or a failed prolog,
a stop and requeue by Slurm. Those end an attempt without a failure being recorded (the script
is killed, never started, or sees Slurm's SIGTERM), so they never spend the budget.

Stopping keeps every step trained: the ranks themselves get SIGTERM, finish their step, agree on it,
and rank 0 saves its checkpoint and writes ``stopped.json`` (training/stopping.py). When Slurm ends
the attempt (``scancel``, ``maskrcnn job stop``, ``scontrol requeue``, a node's interruption) it sends
SIGTERM to every process of the job on every node, the ranks included, and SIGKILL ``KillWait``
seconds later. mpirun and Open MPI's daemons get that SIGTERM too and answer it by killing their
ranks: their kill delay, half of ``--stop-grace``, gives the ranks time to save first. This script
reports the stop (the step and the checkpoint, from ``stopped.json``) and ends mpirun once the
ranks are done. It also signals the ranks itself, on every node (an ``srun --overlap`` step running
``launch.rank_signals``), never through mpirun: that is what reaches them when the watchdog stops a
stalled run or a SIGTERM reached this script alone (Slurm refuses the step once it is ending the job).
Ranks still running after a grace period are killed.

A node that fails (its slurmd stops answering, its health check fails) ends the attempt too: Slurm
kills and requeues the job itself. Slurm counts attempts in ``SLURM_RESTART_COUNT``; this script
counts failures in ``attempts.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from launch.cluster.all_reduce import (BUSBW_FLOORS, SOCKETS_NO_FLOOR, all_reduce_argv, floor_for,
                                       judge_all_reduce)
from launch.cluster.launch_command import format_command, mpirun_in_allocation, train_command
from launch.cluster.slurm import KILL_WAIT_S
from launch.cluster.stage import DataPlan, stage_argv, staged_overrides
from training.run_status import read_heartbeat, read_stop_record, write_json_atomic
from training.stopping import STOPPED_EXIT_STATUS

CONFIG_ERROR_STATUS = 2      # training.train's exit status for bad configuration or data
STALLED_STATUS = 3           # this attempt was stopped by the step watchdog
FABRIC_STATUS = 4            # the all-reduce across the job's nodes failed or was too slow
ALL_REDUCE_PROGRAM = "all_reduce_perf"    # nccl-tests, built into the training image
ALL_REDUCE_TIMEOUT_S = 600
WATCH_POLL_S = 10
# After Slurm's SIGTERM: how long mpirun gets to end (the ranks save a checkpoint and exit) before
# it is killed (``--stop-grace``), at most leaving time to report before Slurm's own SIGKILL at KillWait.
STOP_GRACE_S = KILL_WAIT_S - 20
# A step and a checkpoint save must fit in this, however small the model.
MIN_STOP_GRACE_S = 10
# After the watchdog's stop request: a rank stuck in a collective never reaches the step at which
# the ranks agree to stop, so they are killed sooner.
STALL_GRACE_S = 60
# Open MPI's kill path (mpirun or orted signalled, or a rank exiting with a non-zero status): SIGCONT
# to the ranks, a delay, SIGTERM, the delay again, SIGKILL (Open MPI 4.1.4, measured; the default
# of 1 s kills a rank 2 s after Slurm's SIGTERM reached mpirun, long before it saved). The delay is
# half the stop grace, so both fit in it. The price: mpirun and its daemons wait out both delays
# whenever they take that path, even after their ranks have exited, so a stopped, requeued or
# failed attempt frees its nodes about the stop grace later: a run whose checkpoint saves in
# seconds can take a shorter ``--stop-grace``.
# The ranks exit within seconds of rank 0 writing stopped.json, but mpirun, having seen a rank exit
# with a non-zero status, first waits out its kill path: it is ended this long after the record.
AFTER_STOP_RECORD_S = 15
SIGNAL_STEP_TIMEOUT_S = 30
# {"job_id": str, "max_attempts": int, "attempt": int, "failures": [{"attempt", "exit", "time"}],
# "ended": bool}: the latest attempt of the run's latest job, the attempts of that job that failed,
# and whether the job has ended for good (else it is queued, running or requeued: it may write the
# run directory). A new job of the run (``submit --resume``) starts with an empty budget. The
# SageMaker launcher reads it to see whether a cluster job writes a run.
ATTEMPTS_FILE = "attempts.json"


def attempt_number() -> int:
    return int(os.environ.get("SLURM_RESTART_COUNT", "0")) + 1


def read_attempts(logdir: str) -> dict | None:
    """The run's ``attempts.json``, or None when no attempt has started (or it is unreadable)."""
    try:
        with open(os.path.join(logdir, ATTEMPTS_FILE)) as f:
            value = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(value, dict) or not isinstance(value.get("failures"), list):
        return None
    return value


def _job_attempts(logdir: str, job_id: str) -> dict:
    found = read_attempts(logdir)
    if found is None or found.get("job_id") != job_id:
        return {"job_id": job_id, "max_attempts": None, "attempt": 0, "failures": []}
    return found


def record_attempt(logdir: str, *, job_id: str, attempt: int, max_attempts: int) -> dict:
    """Notes the start of an attempt of job ``job_id``."""
    entry = {**_job_attempts(logdir, job_id), "attempt": attempt, "max_attempts": max_attempts, "ended": False}
    write_json_atomic(os.path.join(logdir, ATTEMPTS_FILE), entry)
    return entry


def mark_ended(logdir: str, job_id: str) -> None:
    """Notes that job ``job_id`` of the run has ended for good: nothing of it writes the run any more.
    A record of another job of the run (a later submit) is left as it is."""
    found = read_attempts(logdir)
    if found is not None and found.get("job_id") not in (None, job_id):
        return
    entry = _job_attempts(logdir, job_id)
    if os.path.isdir(logdir):
        write_json_atomic(os.path.join(logdir, ATTEMPTS_FILE), {**entry, "ended": True})


def cluster_job_writing(logdir: str) -> str | None:
    """The id of the cluster job that is queued, running or requeued for the run in ``logdir`` (None
    when none is, as far as its ``attempts.json`` says)."""
    entry = read_attempts(logdir)
    return None if entry is None or entry.get("ended") else str(entry.get("job_id") or "?")


def record_failure(logdir: str, *, job_id: str, attempt: int, status: int) -> int:
    """Counts a failed attempt against job ``job_id``'s budget; how many of its attempts have failed."""
    entry = _job_attempts(logdir, job_id)
    failures = [f for f in entry["failures"] if f.get("attempt") != attempt]
    failures.append({"attempt": attempt, "exit": status, "time": time.time()})
    entry = {**entry, "attempt": max(attempt, entry.get("attempt") or 0), "failures": failures}
    os.makedirs(logdir, exist_ok=True)
    write_json_atomic(os.path.join(logdir, ATTEMPTS_FILE), entry)
    return len(failures)


def describe_attempts(logdir: str, job_id: str) -> str | None:
    """``job status``'s line on the budget: the attempt Slurm is at, and the failures that count."""
    entry = read_attempts(logdir)
    if entry is None or entry.get("job_id") != job_id:
        return None
    attempt, failed = entry.get("attempt") or 0, len(entry["failures"])
    ended = attempt if any(f.get("attempt") == attempt for f in entry["failures"]) else attempt - 1
    budget = f" of --max-attempts {entry['max_attempts']}" if entry.get("max_attempts") else ""
    return (f"attempt {attempt}: {failed} failure(s){budget} counted; "
            f"{max(ended - failed, 0)} requeue(s) by the system (not counted)")


def heartbeat_step(logdir: str) -> int | None:
    """The step of the run's last heartbeat (``maskrcnn job list`` shows it), or None."""
    beat = read_heartbeat(logdir)
    return beat["step"] if beat else None


def mpi_kill_delay(stop_grace_s: int) -> int:
    """Open MPI's delay between the signals of its kill path for a job that gets ``stop_grace_s``."""
    return stop_grace_s // 2


def mpirun_env(environ: dict[str, str] | None = None, *, stop_grace_s: int = STOP_GRACE_S) -> dict[str, str]:
    """mpirun's environment: the job's, with Open MPI's kill delay (mpirun reads OMPI_MCA_ variables
    and srun passes them on to the daemons it starts on the other nodes)."""
    return {**(os.environ if environ is None else environ),
            "OMPI_MCA_odls_base_sigkill_timeout": str(mpi_kill_delay(stop_grace_s))}


def stop_grace_problem(seconds: int) -> str | None:
    """Why ``--stop-grace seconds`` cannot be used, or None."""
    if MIN_STOP_GRACE_S <= seconds <= STOP_GRACE_S:
        return None
    return (f"--stop-grace {seconds}: must be {MIN_STOP_GRACE_S} to {STOP_GRACE_S} seconds (Slurm's KillWait "
            f"{KILL_WAIT_S} s less {KILL_WAIT_S - STOP_GRACE_S} s to report the stop): long enough for a "
            f"training step and a checkpoint save")


def srun_per_node(nodes: int) -> list[str]:
    """``srun`` with one task on each of the job's ``nodes``. ``--ntasks`` too: inside a batch job,
    srun otherwise takes the job's task count (one per GPU) from SLURM_NTASKS and ignores
    ``--ntasks-per-node=1``."""
    return ["srun", f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1"]


def signal_ranks_argv(logdir: str, *, nodes: int, sig: str = "TERM") -> list[str]:
    """A step that sends ``sig`` to the run's ranks on every node (launch.rank_signals on each).
    ``--overlap``: it runs beside mpirun's step, which holds the nodes' CPUs."""
    return [*srun_per_node(nodes), "--overlap", sys.executable, "-m", "launch.rank_signals",
            "--logdir", logdir, "--signal", sig]


def signal_every_node(logdir: str, nodes: int, sig: str) -> bool:
    """Runs :func:`signal_ranks_argv`; whether every node's task succeeded."""
    try:
        rc = subprocess.call(signal_ranks_argv(logdir, nodes=nodes, sig=sig), timeout=SIGNAL_STEP_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as err:
        print(f"could not signal the ranks on every node with srun: {err}", flush=True)
        return False
    if rc != 0:
        print(f"signalling the ranks on every node with srun failed (exit {rc})", flush=True)
    return rc == 0


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL ``proc`` (started in a session of its own) and what it started on this node."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class AttemptStop:
    """Stops the attempt's training once (the first request wins): SIGTERM to the ranks on every
    node (``signal_ranks("TERM")``), then, if mpirun is still running ``grace_s`` later, SIGKILL to
    them and to mpirun. ``kind`` is the first request's: ``"slurm"`` or ``"stall"``."""

    def __init__(self, proc: subprocess.Popen, signal_ranks: Callable[[str], object], *, poll_s: float = 1.0):
        self.proc, self.signal_ranks, self.poll_s = proc, signal_ranks, poll_s
        self.kind: str | None = None
        self.killed = False
        self._lock = threading.Lock()

    def request(self, kind: str, reason: str, grace_s: float) -> None:
        # Called from a signal handler too: the waiting and printing happen in a thread.
        with self._lock:
            if self.kind is not None:
                return
            self.kind = kind
            threading.Thread(target=self._stop, args=(reason, grace_s), daemon=True, name="attempt-stop").start()

    def _stop(self, reason: str, grace_s: float) -> None:
        deadline = time.monotonic() + grace_s
        print(f"{reason}: asking the ranks on every node to save a checkpoint and stop (SIGTERM)", flush=True)
        if not self.signal_ranks("TERM") and self.kind == "slurm":
            print("(Slurm starts no new job step while it ends the job; its own SIGTERM reached every rank)",
                  flush=True)
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return
            time.sleep(self.poll_s)
        if self.proc.poll() is not None:
            return
        print(f"training still running {grace_s:.0f} s after the stop request: killing it", flush=True)
        self.killed = True
        self.signal_ranks("KILL")
        kill_group(self.proc)


class StepWatchdog:
    """Calls ``on_stall(step)`` once when the heartbeat's step has not advanced for ``stall_s`` seconds.

    The clock starts when the attempt starts (a run's first step includes building the graph and
    loading data, so ``stall_s`` must allow for that) and restarts at every new step."""

    def __init__(self, proc: subprocess.Popen, logdir: str, *, stall_s: float, on_stall: Callable[[int | None], None],
                 poll_s: float = WATCH_POLL_S, clock=time.monotonic):
        self.proc, self.logdir, self.stall_s, self.on_stall = proc, logdir, stall_s, on_stall
        self.poll_s, self.clock = poll_s, clock
        self.stalled_at: int | None = None
        self.fired = False
        self._thread = threading.Thread(target=self._watch, daemon=True, name="step-watchdog")

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
                print(f"watchdog: no training step for {self.stall_s / 60:g} min (last step "
                      f"{step if step is not None else 'none yet'}): stopping this attempt", flush=True)
                self.on_stall(step)
                return


def wait_for_training(proc: subprocess.Popen, logdir: str, *, since: float, poll_s: float = 2.0,
                      after_record_s: float = AFTER_STOP_RECORD_S) -> int:
    """mpirun's exit status, or its kill signal (negative) when it was ended ``after_record_s``
    after a stop record written at or after ``since`` (unix seconds)."""
    while True:
        try:
            return proc.wait(timeout=poll_s)
        except subprocess.TimeoutExpired:
            pass
        record = read_stop_record(logdir, since=since)
        if record is not None and time.time() - record["time"] > after_record_s:
            kill_group(proc)
            return proc.wait()


def describe_stop(record: dict, logdir: str) -> str:
    """One line for the job's log from ``stopped.json``."""
    if record.get("checkpoint"):
        return (f"training stopped at step {record['step']} with checkpoint {record['checkpoint']} "
                f"({os.path.join(logdir, record['checkpoint'])})")
    return (f"training stopped at step {record['step']} but could not save its checkpoint (see the ranks' "
            f"errors above): it resumes from the latest earlier checkpoint in {logdir}")


def check_fabric(*, nodes: int, gpus_per_node: int, instance_type: str, efa: bool,
                 program: str | None = None) -> bool:
    """nccl-tests' all-reduce across the job's nodes before training, judged against the instance
    type's bus-bandwidth floor over EFA, or, with ``efa`` off (TCP sockets), on finishing with correct
    values only (launch/cluster/all_reduce.py). True when it passed or does not apply (one node, no
    GPUs, no floor recorded for the type, no all_reduce_perf here: said so)."""
    program = program or shutil.which(ALL_REDUCE_PROGRAM)
    skip = None
    if nodes < 2:
        skip = "a single node"
    elif instance_type not in BUSBW_FLOORS:   # CPU types among them
        skip = f"no bus-bandwidth floor is recorded for {instance_type or 'this instance type'}"
    elif not program:
        skip = f"no {ALL_REDUCE_PROGRAM} on PATH"
    if skip:
        print(f"all-reduce check skipped: {skip}", flush=True)
        return True
    argv = all_reduce_argv(program, nodes=nodes, gpus_per_node=gpus_per_node, instance_type=instance_type, efa=efa)
    floor = floor_for(instance_type, efa=efa)
    print(f"all-reduce check across {nodes} nodes: {format_command(argv)}", flush=True)
    if floor is None:
        print(f"all-reduce check: {SOCKETS_NO_FLOOR}", flush=True)
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=ALL_REDUCE_TIMEOUT_S, env=mpirun_env())
        text, failed = out.stdout + out.stderr, out.returncode != 0
    except subprocess.TimeoutExpired as err:
        text, failed = str(err.stdout or ""), True
    verdict = judge_all_reduce(text, floor_gbps=floor, efa=efa)
    if failed or not verdict.ok:
        problems = list(verdict.problems) + ([f"{ALL_REDUCE_PROGRAM} failed or timed out"] if failed else [])
        if verdict.fabric_judged:
            why = ("A node's GPU interconnect or EFA path is degraded; `sinfo -R` and `python -m "
                   "launch.cluster.node_health` on each node narrow it down")
        else:
            # Every process printed a run of its own: they never formed one communicator (nccl-tests
            # built without MPI=1 under mpirun: NVIDIA/nccl-tests issue 27).
            why = (f"The {nodes * gpus_per_node} processes started did not join one run: an "
                   f"{ALL_REDUCE_PROGRAM} built without MPI support (nccl-tests' MPI=1) runs each as a "
                   f"rank of its own")
        print(f"all-reduce check failed: {'; '.join(problems)}. {why}. Its output:\n{text[-3000:]}", flush=True)
        return False
    print(f"all-reduce check passed: {verdict.busbw_gbps:g} GB/s average bus bandwidth ({verdict.floor_text})",
          flush=True)
    return True


def restarts(scontrol_show_job: str) -> int | None:
    """How often Slurm has requeued a job, from ``scontrol show job`` output (its Restarts field)."""
    found = re.search(r"\bRestarts=(\d+)", scontrol_show_job)
    return int(found.group(1)) if found else None


def requeued_during(attempt: int) -> bool | None:
    """Whether Slurm requeued this job during this attempt (rather than cancelling it); None when
    scontrol cannot tell."""
    try:
        out = subprocess.run(["scontrol", "show", "job", "-o", os.environ["SLURM_JOB_ID"]], capture_output=True,
                             text=True, timeout=30).stdout
    except (KeyError, OSError, subprocess.TimeoutExpired):
        return None
    count = restarts(out)
    return None if count is None else count >= attempt


def exit_status(rc: int) -> int:
    """A Popen return code as a shell reports it: 128 + N for a process killed by signal N."""
    return 128 - rc if rc < 0 else rc


def requeue() -> None:
    """Puts this job back in the queue: Slurm ends this attempt and starts the next when the nodes are free."""
    job = os.environ["SLURM_JOB_ID"]
    # Slurm ends the requeued attempt like a cancelled one: SIGTERM to the job's processes, SIGKILL
    # KillWait later to those it still tracks. Nothing is left to save or report, so that SIGTERM ends
    # this script: the attempt's stop handler would swallow it and the script would sleep on after the
    # requeue (its `sbatch --wrap` shell exits at the SIGTERM, and proctrack/linuxproc tracks processes
    # by their parents, so Slurm's SIGKILL is not sure to reach it).
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
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
    p.add_argument("--stop-grace", type=int, default=STOP_GRACE_S)
    p.add_argument("overrides", nargs="*")
    a = p.parse_args(argv)
    if problem := stop_grace_problem(a.stop_grace):
        p.error(problem)
    nodes = int(os.environ.get("SLURM_JOB_NUM_NODES", "1"))
    attempt = attempt_number()
    Path(a.logdir).mkdir(parents=True, exist_ok=True)
    record_attempt(a.logdir, job_id=os.environ.get("SLURM_JOB_ID", ""), attempt=attempt,
                   max_attempts=a.max_attempts)
    print(f"attempt {attempt} of job {os.environ.get('SLURM_JOB_ID', '?')} on {nodes} node(s) "
          f"({os.environ.get('SLURM_JOB_NODELIST', '?')}), {nodes * a.ranks_per_node} rank(s)", flush=True)
    overrides = a.overrides
    if a.stage_from:
        plan = DataPlan(train_dir=a.data_dir, stage_from=a.stage_from)
        print(f"copying {a.stage_from} to {a.data_dir} on every node (skipped where complete)", flush=True)
        rc = subprocess.call([*srun_per_node(nodes), "--kill-on-bad-exit=1", *stage_argv(plan)])
        if rc != 0:
            print(f"copying the dataset to local NVMe failed (exit {rc}); see the lines above", flush=True)
            return _fail_or_requeue(rc, attempt, a.max_attempts, a.logdir)
        # splits named by absolute paths inside the copied directory: read from the node's copy too
        overrides = staged_overrides(a.overrides, plan)
        for added in overrides[len(a.overrides):]:
            print(f"splits given by absolute paths in {a.stage_from} are read from the node's copy: {added}",
                  flush=True)
    if not check_fabric(nodes=nodes, gpus_per_node=a.ranks_per_node, instance_type=a.instance_type, efa=a.efa):
        return _fail_or_requeue(FABRIC_STATUS, attempt, a.max_attempts, a.logdir)
    cmd = mpirun_in_allocation(ranks=nodes * a.ranks_per_node, efa=a.efa,
                               instance_types=[a.instance_type] if a.instance_type else [],
                               train=train_command(logdir=a.logdir, data_dir=a.data_dir, overrides=overrides))
    print(format_command(cmd), flush=True)
    Path(a.logdir).mkdir(parents=True, exist_ok=True)
    started = time.time()
    proc = subprocess.Popen(cmd, start_new_session=True, env=mpirun_env(stop_grace_s=a.stop_grace))
    stop = AttemptStop(proc, lambda sig: signal_every_node(a.logdir, nodes, sig))
    signal.signal(signal.SIGTERM, lambda _signum, _frame: stop.request(
        "slurm", "Slurm is ending this attempt (SIGTERM: scancel, requeue or a node's interruption)", a.stop_grace))
    StepWatchdog(proc, a.logdir, stall_s=a.stall_minutes * 60,
                 on_stall=lambda _step: stop.request("stall", "watchdog", STALL_GRACE_S)).start()
    rc = exit_status(wait_for_training(proc, a.logdir, since=started))
    record = read_stop_record(a.logdir, since=started)
    return end_attempt(rc, logdir=a.logdir, record=record, stop=stop.kind, attempt=attempt,
                       max_attempts=a.max_attempts,
                       requeued=requeued_during(attempt) if stop.kind == "slurm" else None)


def end_attempt(rc: int, *, logdir: str, record: dict | None, stop: str | None, attempt: int,
                max_attempts: int, requeued: bool | None = None) -> int:
    """:func:`report_end`; when the job ends for good (not requeued by this script or by Slurm), it
    says so in ``attempts.json``."""
    status = report_end(rc, logdir=logdir, record=record, stop=stop, attempt=attempt, max_attempts=max_attempts,
                        requeued=requeued)
    if not (stop == "slurm" and requeued is not False):   # a requeue by this script never returns
        mark_ended(logdir, os.environ.get("SLURM_JOB_ID", ""))
    return status


def report_end(rc: int, *, logdir: str, record: dict | None, stop: str | None, attempt: int,
               max_attempts: int, requeued: bool | None = None) -> int:
    """Reports how training ended and what happens next; the job script's exit status.

    ``record``: this attempt's ``stopped.json``; ``stop``: who asked training to stop
    (:attr:`AttemptStop.kind`); ``requeued``: for a stop by Slurm, whether it requeued the job
    (False: cancelled; None: unknown)."""
    run = os.path.basename(os.path.normpath(logdir))
    if record is not None:
        print(describe_stop(record, logdir), flush=True)
    if stop == "stall":
        return _fail_or_requeue(STALLED_STATUS, attempt, max_attempts, logdir)
    if stop == "slurm":
        # Slurm requeues or cancels the job itself: this script only reports.
        saved = record is not None and record.get("checkpoint")
        start = f"from {record['checkpoint']}" if saved else f"from the latest checkpoint in {logdir}"
        if record is None:
            print(f"training ended (exit {rc}) without saving at the stop", flush=True)
        resume = f"`maskrcnn job submit --run-name {run} --resume` continues {start}"
        print({True: f"Slurm requeued this job: its next attempt resumes {start}",
               False: f"the job was cancelled: {resume}",
               None: f"Slurm ended this attempt: if it requeued the job, the next attempt resumes {start}; "
                     f"if it was cancelled, {resume}"}[requeued], flush=True)
        return STOPPED_EXIT_STATUS if record is not None else rc
    if record is not None or rc == STOPPED_EXIT_STATUS:
        # The ranks were signalled directly (launch.rank_signals by hand): a stop asked for, not a failure.
        if record is None:
            print("training was stopped before its first step: nothing to save", flush=True)
        print(f"the run stopped on request; `maskrcnn job submit --run-name {run} --resume` continues it", flush=True)
        return STOPPED_EXIT_STATUS
    if rc == 0:
        print(f"training finished; logs and checkpoints in {logdir}", flush=True)
        return 0
    if rc == CONFIG_ERROR_STATUS:
        print(f"training rejected its configuration or data (exit {rc}, see the error above); fix it and "
              f"submit again: restarting would not help", flush=True)
        return rc
    return _fail_or_requeue(rc, attempt, max_attempts, logdir)


def _fail_or_requeue(rc: int, attempt: int, max_attempts: int, logdir: str) -> int:
    failures = record_failure(logdir, job_id=os.environ.get("SLURM_JOB_ID", ""), attempt=attempt, status=rc)
    system = f"; {attempt - failures} requeue(s) by the system did not count" if attempt > failures else ""
    if failures >= max_attempts:
        print(f"attempt {attempt} failed (exit {rc}): failure {failures} of --max-attempts {max_attempts}{system}; "
              f"the job fails for good: submit again with --resume to continue from the latest checkpoint",
              flush=True)
        mark_ended(logdir, os.environ.get("SLURM_JOB_ID", ""))
        return rc
    print(f"attempt {attempt} failed (exit {rc}): failure {failures} of --max-attempts {max_attempts}{system}; "
          f"requeued: the next attempt resumes from the latest checkpoint once the job's nodes are healthy",
          flush=True)
    requeue()
    return rc


if __name__ == "__main__":
    sys.exit(main())
