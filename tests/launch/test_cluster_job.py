"""A cluster job's attempt (launch/cluster/job.py) without Slurm: the real mpirun command of the job
(Open MPI runs it on this machine when there is no allocation) starting stand-in ranks, the real
``launch.rank_signals`` that the job's srun step runs on every node, the step watchdog reading a
real heartbeat file, and the real input worker processes.

The stand-in rank is ``python -m training.train --logdir LOGDIR`` as the job starts it: it records
SIGTERM, "saves" for a few seconds (a step's end and a checkpoint), writes ``stopped.json`` through
training.run_status (rank 0) and exits with STOPPED_EXIT_STATUS; or, hung in a collective, never
acts on SIGTERM.
"""
import gc
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from event_order import out_of_order
from launch.cluster import job
from machine import child_pids, require
from launch.cluster.launch_command import mpirun_in_allocation
from launch.rank_signals import training_ranks
from training.run_status import read_stop_record, write_heartbeat
from training.stopping import STOPPED_EXIT_STATUS

REPO = Path(__file__).resolve().parents[2]
RANKS = 2

STAND_IN_RANK = """
    import os, signal, sys, time
    from training import run_status, stopping

    logdir = sys.argv[sys.argv.index("--logdir") + 1]
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    requests = []
    signal.signal(signal.SIGTERM, lambda *_: requests.append(time.time()))
    if rank == 0:
        run_status.write_heartbeat(logdir, step=1, epoch=1)
    open(os.path.join(logdir, f"up-{rank}"), "w").close()
    step = 1
    while not requests:
        time.sleep(0.05)
        step += os.environ["STAND_IN"] == "train"
    if os.environ["STAND_IN"] == "hang":        # stuck in a collective: the stop request is never acted on
        while True:
            time.sleep(1)
    time.sleep(float(os.environ["SAVE_S"]))     # the step's end and the checkpoint
    if rank == 0:
        open(os.path.join(logdir, f"model-{step}.index"), "w").close()
        run_status.write_stop_record(logdir, signal="SIGTERM", step=step, epoch=1, checkpoint=f"model-{step}")
    open(os.path.join(logdir, f"saved-{rank}"), "w").write(str(len(requests)))
    sys.exit(stopping.STOPPED_EXIT_STATUS)
"""


@pytest.fixture
def stand_in(tmp_path):
    """A ``training`` package whose ``train`` module is the stand-in rank; its other modules are the
    real ones (training.run_status, training.stopping). The ranks run under the job's mpirun."""
    require(None if shutil.which("mpirun") else
            "Open MPI's mpirun is not installed (Debian package openmpi-bin; scripts/install.sh installs it)")
    pkg = tmp_path / "stand_in" / "training"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(f"__path__.append({str(REPO / 'training')!r})\n")
    (pkg / "train.py").write_text(textwrap.dedent(STAND_IN_RANK))
    return pkg.parent


def _start_mpirun(stand_in: Path, logdir: Path, *, mode: str, save_s: float = 2.0, env=None) -> subprocess.Popen:
    """The job's mpirun command and environment (job.mpirun_env unless ``env``) for RANKS stand-in ranks."""
    logdir.mkdir(exist_ok=True)
    base = dict(os.environ, PYTHONPATH=f"{stand_in}{os.pathsep}{REPO}", STAND_IN=mode, SAVE_S=str(save_s),
                OMPI_MCA_rmaps_base_oversubscribe="1")      # more ranks than cores on a small machine
    cmd = mpirun_in_allocation(ranks=RANKS, train=[sys.executable, "-m", "training.train", "--logdir", str(logdir)])
    proc = subprocess.Popen(cmd, cwd=stand_in, env=job.mpirun_env(base) if env is None else {**base, **env},
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not all((logdir / f"up-{r}").exists() for r in range(RANKS)):
        assert proc.poll() is None and time.monotonic() < deadline, "the stand-in ranks did not start"
        time.sleep(0.1)
    return proc


def _signal_here(logdir: Path):
    """What job.signal_every_node's srun step runs on each node, run on this one."""
    on_each_node = job.signal_ranks_argv(str(logdir), nodes=1, sig="{sig}")
    on_each_node = on_each_node[on_each_node.index("--overlap") + 1:]

    def send(sig: str) -> bool:
        return subprocess.call([a.format(sig=sig) for a in on_each_node], cwd=REPO) == 0
    return send


def _ignores(pid: int, sig: signal.Signals) -> bool:
    """Whether ``sig`` is set to be ignored in process ``pid`` (the SigIgn mask of proc(5))."""
    mask = next(line.split()[1] for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                if line.startswith("SigIgn:"))
    return bool(int(mask, 16) >> (sig - 1) & 1)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_stop_request_reaches_every_rank_which_saves_and_the_job_reports_the_checkpoint(stand_in, tmp_path, capfd):
    logdir = tmp_path / "run"
    started = time.time()
    proc = _start_mpirun(stand_in, logdir, mode="train")
    stop = job.AttemptStop(proc, _signal_here(logdir))
    stop.request("slurm", "Slurm is ending this attempt", job.STOP_GRACE_S)
    rc = job.exit_status(job.wait_for_training(proc, str(logdir), since=started))
    record = read_stop_record(str(logdir), since=started)
    # every rank got exactly one request and finished its save: none was killed by mpirun
    assert [(logdir / f"saved-{r}").read_text() for r in range(RANKS)] == ["1"] * RANKS
    assert record["checkpoint"] == f"model-{record['step']}" and (logdir / f"{record['checkpoint']}.index").exists()
    assert not stop.killed
    status = job.end_attempt(rc, logdir=str(logdir), record=record, stop=stop.kind, attempt=1, max_attempts=4,
                             requeued=True)
    assert status == STOPPED_EXIT_STATUS
    out = capfd.readouterr().out
    assert f"SIGTERM sent to {RANKS} training rank(s) of {logdir} on this host" in out
    assert (f"training stopped at step {record['step']} with checkpoint model-{record['step']} "
            f"({logdir / record['checkpoint']})") in out
    assert f"Slurm requeued this job: its next attempt resumes from model-{record['step']}" in out


@pytest.mark.parametrize("kill_delay, saved", [("job", True), ("default", False)])
def test_ranks_save_when_slurm_signals_mpirun_too_only_with_the_jobs_kill_delay(stand_in, tmp_path, kill_delay, saved):
    # scancel and scontrol requeue send SIGTERM to every process of the job: the ranks and mpirun.
    # mpirun then kills its ranks; Open MPI's default delay (1 s, then 1 s more before SIGKILL)
    # leaves a rank that needs 4 s to save no chance.
    logdir = tmp_path / "run"
    started = time.time()
    proc = _start_mpirun(stand_in, logdir, mode="train", save_s=4,
                         env=None if kill_delay == "job" else {"OMPI_MCA_odls_base_sigkill_timeout": "1"})
    os.kill(proc.pid, signal.SIGTERM)
    assert _signal_here(logdir)("TERM")
    job.wait_for_training(proc, str(logdir), since=started)
    assert all((logdir / f"saved-{r}").exists() for r in range(RANKS)) is saved
    assert (read_stop_record(str(logdir), since=started) is not None) is saved


def test_open_mpis_kill_delay_is_half_the_stop_grace_and_a_grace_that_does_not_fit_is_refused(capsys):
    # SIGCONT, the delay, SIGTERM, the delay, SIGKILL: both delays fit in the grace
    assert job.mpirun_env({})["OMPI_MCA_odls_base_sigkill_timeout"] == "45"       # the default grace, 90 s
    assert job.mpirun_env({}, stop_grace_s=30)["OMPI_MCA_odls_base_sigkill_timeout"] == "15"
    with pytest.raises(SystemExit) as exit_:
        job.main(["--logdir", "/nonexistent", "--data-dir", "/nonexistent", "--stop-grace", "100"])
    assert exit_.value.code == 2
    assert "--stop-grace 100: must be 10 to 90 seconds" in capsys.readouterr().err


def test_a_stalled_attempt_is_stopped_and_its_hung_ranks_killed_after_the_grace(stand_in, tmp_path, capfd):
    logdir = tmp_path / "run"
    started = time.time()
    proc = _start_mpirun(stand_in, logdir, mode="hang")
    ranks = training_ranks(str(logdir))
    assert len(ranks) == RANKS
    stop = job.AttemptStop(proc, _signal_here(logdir), poll_s=0.1)
    requested = []

    def on_stall(_step):
        requested.append(time.monotonic())
        stop.request("stall", "watchdog", 3)
    watchdog = job.StepWatchdog(proc, str(logdir), stall_s=1, poll_s=0.2, on_stall=on_stall).start()
    rc = job.exit_status(job.wait_for_training(proc, str(logdir), since=started, poll_s=0.2))
    grace = time.monotonic() - requested[0]
    assert watchdog.fired and watchdog.stalled_at == 1 and stop.kind == "stall" and stop.killed
    assert grace >= 3, grace      # the kill waited the whole grace (a lower bound: a busy machine only adds)
    assert grace < 300, grace     # a backstop against a hang only: the order of events below is the check
    assert rc == 128 + signal.SIGKILL
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in ranks) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in ranks)
    assert read_stop_record(str(logdir), since=started) is None
    # the job's fourth failure: it fails for good (an earlier one would be requeued with scontrol)
    for attempt in (1, 2, 3):
        job.record_failure(str(logdir), job_id="", attempt=attempt, status=1)
    assert job.end_attempt(rc, logdir=str(logdir), record=None, stop=stop.kind, attempt=4,
                           max_attempts=4) == job.STALLED_STATUS
    out = capfd.readouterr().out
    # The stall, the request, the ranks' SIGTERM, the grace running out, their SIGKILL, in that order.
    problem = out_of_order(out, [r"watchdog: no training step for [0-9.]+ min \(last step 1\): stopping this attempt",
                                 r"watchdog: asking the ranks on every node to save a checkpoint and stop \(SIGTERM\)",
                                 rf"SIGTERM sent to {RANKS} training rank\(s\)",
                                 r"training still running 3 s after the stop request: killing it",
                                 rf"SIGKILL sent to {RANKS} training rank\(s\)",
                                 r"attempt 4 failed \(exit 3\): failure 4 of --max-attempts 4; the job fails for good"])
    assert problem is None, problem


class _TestClock:
    """The watchdog's clock, moved by the test; it counts its readings, one per look at the heartbeat,
    so the test knows when the watchdog has looked again (a loaded machine delays the looks, not the
    clock it judges by)."""

    def __init__(self):
        self.now, self.reads = 0.0, 0
        self._changed = threading.Condition()

    def __call__(self) -> float:
        with self._changed:
            self.reads += 1
            self._changed.notify_all()
            return self.now

    def wait_for_look(self, watchdog) -> None:
        """Until ``watchdog`` has looked at the heartbeat as it is now (two readings: a look may have
        been under way), or has fired (it looks no more then)."""
        deadline = time.monotonic() + 60   # a backstop: a look takes milliseconds
        with self._changed:
            target = self.reads + 2
            while self.reads < target and not watchdog.fired:
                assert time.monotonic() < deadline, "the watchdog stopped looking"
                self._changed.wait(timeout=0.05)


def test_the_watchdog_waits_while_steps_advance(tmp_path):
    logdir = tmp_path / "run"
    logdir.mkdir()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    stalls, clock = [], _TestClock()
    try:
        watchdog = job.StepWatchdog(sleeper, str(logdir), stall_s=0.6, poll_s=0.01, on_stall=stalls.append,
                                    clock=clock).start()
        for step in range(1, 16):          # 3 s of steps, 0.2 s apart, each seen by the watchdog
            write_heartbeat(str(logdir), step=step, epoch=1)
            clock.wait_for_look(watchdog)
            assert not watchdog.fired, f"fired at step {step}, {clock.now:.1f} s into steps 0.2 s apart"
            clock.now += 0.2
        clock.wait_for_look(watchdog)
        assert not watchdog.fired and stalls == []
        clock.now += 1.0                   # no step for more than stall_s: its next look stops
        deadline = time.monotonic() + 60   # a backstop: it takes one look
        while not stalls and time.monotonic() < deadline:
            time.sleep(0.01)
        assert watchdog.fired and stalls == [15]
    finally:
        sleeper.kill()
        sleeper.wait()


def test_the_srun_step_that_signals_every_node_is_valid_for_this_slurm(tmp_path):
    # Slurm's own srun parses the options before it contacts the controller (none here): an option
    # it does not know ends it with "unrecognized option" (status 255).
    require(None if shutil.which("srun") else
            "Slurm's srun is not installed (Debian package slurm-client; scripts/install.sh installs it)")
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=t\nSlurmctldHost=nobody(127.0.0.1)\nSlurmctldPort=9\nMessageTimeout=1\n"
                    "NodeName=master CPUs=1 State=CLOUD\nPartitionName=train Nodes=master Default=YES\n")
    argv = job.signal_ranks_argv("/efs/logs/run1", nodes=3)
    # srun(1) of Slurm 22.05: --overlap lets the step share the nodes with mpirun's running step;
    # --ntasks, or srun takes the job's task count from SLURM_NTASKS and runs several per node.
    assert {"--overlap", "--nodes=3", "--ntasks=3", "--ntasks-per-node=1"} <= set(argv)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    out = subprocess.run(argv, env={**env, "SLURM_CONF": str(conf)}, capture_output=True, text=True, timeout=60)
    assert "Unable to contact slurm controller" in out.stderr and out.returncode == 1, out.stderr


# `scontrol show job` as Slurm 22.05 prints it, during the stop of a job that was requeued once.
SHOW_JOB_REQUEUED = """JobId=1 JobName=run
   UserId=root(0) GroupId=root(0) MCS_label=N/A
   Priority=4294901759 Nice=0 Account=(null) QOS=(null)
   JobState=COMPLETING Reason=None Dependency=(null)
   Requeue=1 Restarts=1 BatchFlag=1 Reboot=0 ExitCode=0:0
"""


def test_requeued_or_cancelled_from_the_restart_count():
    assert job.restarts(SHOW_JOB_REQUEUED) == 1
    assert job.restarts(SHOW_JOB_REQUEUED.replace("Restarts=1", "Restarts=0")) == 0
    assert job.restarts("slurm_load_jobs error: Invalid job id specified") is None


@pytest.mark.parametrize("requeued, says", [
    (False, "the job was cancelled: `maskrcnn job submit --run-name run7 --resume` continues from model-40"),
    (None, "Slurm ended this attempt: if it requeued the job, the next attempt resumes from model-40; if it was "
           "cancelled, `maskrcnn job submit --run-name run7 --resume` continues from model-40"),
])
def test_a_slurm_stop_says_how_the_run_continues(tmp_path, capsys, requeued, says):
    record = {"signal": "SIGTERM", "step": 40, "epoch": 2, "checkpoint": "model-40", "time": time.time()}
    status = job.end_attempt(137, logdir=str(tmp_path / "run7"), record=record, stop="slurm", attempt=1,
                             max_attempts=4, requeued=requeued)
    assert status == STOPPED_EXIT_STATUS
    assert says in capsys.readouterr().out


def test_a_stop_whose_save_failed_names_no_checkpoint(tmp_path, capsys):
    record = {"signal": "SIGTERM", "step": 40, "epoch": 2, "checkpoint": None, "time": time.time()}
    job.end_attempt(STOPPED_EXIT_STATUS, logdir=str(tmp_path / "run7"), record=record, stop="slurm", attempt=1,
                    max_attempts=4, requeued=True)
    out = capsys.readouterr().out
    assert "training stopped at step 40 but could not save its checkpoint" in out
    assert f"Slurm requeued this job: its next attempt resumes from the latest checkpoint in {tmp_path / 'run7'}" in out


def test_ranks_stopped_by_hand_end_the_job_without_a_requeue(tmp_path, capsys):
    record = {"signal": "SIGTERM", "step": 12, "epoch": 1, "checkpoint": "model-12", "time": time.time()}
    assert job.end_attempt(STOPPED_EXIT_STATUS, logdir=str(tmp_path / "run7"), record=record, stop=None, attempt=1,
                           max_attempts=4) == STOPPED_EXIT_STATUS
    out = capsys.readouterr().out
    assert "the run stopped on request; `maskrcnn job submit --run-name run7 --resume` continues it" in out
    assert "requeued" not in out


# --------------------------------------------------------------------------------- the failure budget
# Slurm requeues a job for reasons of its own and counts them all in SLURM_RESTART_COUNT (sbatch(1):
# "If the job has been restarted due to system failure or has been explicitly requeued, this will be
# sent to the number of times the job has been restarted"), and "When a job is requeued, the batch
# script is initiated from its beginning" (sbatch --requeue). So attempt N of a job runs with
# SLURM_RESTART_COUNT=N-1 whatever ended the N-1 before it.

# What slurmctld does on `scontrol requeue` from inside the job: it ends the batch script with SIGTERM.
SCONTROL_STAND_IN = """#!/bin/sh
echo "$@" >> "$SCONTROL_LOG"
kill -TERM $PPID
"""


def _run_attempt(tmp_path, logdir: Path, *, restart_count: int, rc: int = 1, stop: str | None = None,
                 max_attempts: int = 4, prelude: str = "") -> tuple[int, str, list[str]]:
    """One attempt's end as the job script runs it (its own process, Slurm's environment), with
    ``scontrol`` on PATH standing in for slurmctld: (exit status, output, scontrol calls).
    ``prelude``: Python run first in that process."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "scontrol").write_text(SCONTROL_STAND_IN)
    (bin_dir / "scontrol").chmod(0o755)
    log = tmp_path / "scontrol.log"
    log.write_text("")
    code = (f"{prelude}\nimport sys; from launch.cluster import job; "
            f"sys.exit(job.end_attempt({rc}, logdir={str(logdir)!r}, record=None, stop={stop!r}, "
            f"attempt=job.attempt_number(), max_attempts={max_attempts}, requeued=True))")
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", PYTHONPATH=str(REPO),
               SLURM_JOB_ID="17", SLURM_RESTART_COUNT=str(restart_count), SCONTROL_LOG=str(log))
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True,
                         timeout=60)
    return out.returncode, out.stdout, log.read_text().splitlines()


def test_requeues_by_the_system_do_not_spend_the_failure_budget(tmp_path):
    logdir = tmp_path / "run7"
    logdir.mkdir()
    # attempts 1-3: a spot reclaim, a node failure, a pause: Slurm's SIGTERM, or the script killed
    # outright (nothing runs), or a prolog that failed (the script never starts)
    status, _, calls = _run_attempt(tmp_path, logdir, restart_count=0, rc=143, stop="slurm")
    assert status == 143 and calls == []
    # attempt 4 (SLURM_RESTART_COUNT=3): training's first error of this job
    status, out, calls = _run_attempt(tmp_path, logdir, restart_count=3, rc=1)
    assert calls == ["requeue 17"] and status == -signal.SIGTERM
    assert "attempt 4 failed (exit 1): failure 1 of --max-attempts 4; 3 requeue(s) by the system did not count" in out
    assert job.describe_attempts(str(logdir), "17") == (
        "attempt 4: 1 failure(s) counted; 3 requeue(s) by the system (not counted)")


@pytest.mark.parametrize("stop", [None, "stall"])
def test_a_requeued_attempt_ends_at_slurms_sigterm_even_while_its_stop_handler_is_installed(tmp_path, stop):
    # The job script's SIGTERM handler (AttemptStop.request) ignores every request after the first, so
    # Slurm's SIGTERM for the requeue must not reach it: the script would sleep on after the requeue
    # (out of reach of Slurm's SIGKILL once its shell has exited, see job.requeue).
    logdir = tmp_path / "run7"
    logdir.mkdir()
    status, out, calls = _run_attempt(
        tmp_path, logdir, restart_count=1, rc=1 if stop is None else job.STALLED_STATUS, stop=stop,
        prelude="import signal; signal.signal(signal.SIGTERM, lambda *_: None)")
    assert calls == ["requeue 17"] and status == -signal.SIGTERM, out


def test_the_jobs_max_attempts_th_failure_fails_it_for_good(tmp_path):
    logdir = tmp_path / "run7"
    logdir.mkdir()
    for restart_count in (0, 1):
        _, out, calls = _run_attempt(tmp_path, logdir, restart_count=restart_count, rc=1, max_attempts=3)
        assert calls == ["requeue 17"], out
    # attempt 3 was ended by the system; attempt 4 is the job's third failure
    status, out, calls = _run_attempt(tmp_path, logdir, restart_count=3, rc=1, max_attempts=3)
    assert status == 1 and calls == []
    assert ("attempt 4 failed (exit 1): failure 3 of --max-attempts 3; 1 requeue(s) by the system did not count; "
            "the job fails for good") in out


def test_a_new_job_of_the_run_starts_with_a_full_budget(tmp_path):
    logdir = tmp_path / "run7"
    for attempt in (1, 2, 3):
        job.record_failure(str(logdir), job_id="16", attempt=attempt, status=1)
    assert job.record_failure(str(logdir), job_id="17", attempt=1, status=1) == 1
    job.record_attempt(str(logdir), job_id="17", attempt=2, max_attempts=4)
    assert job.describe_attempts(str(logdir), "17") == (
        "attempt 2: 1 failure(s) of --max-attempts 4 counted; 0 requeue(s) by the system (not counted)")
    assert job.describe_attempts(str(logdir), "16") is None


# --------------------------------------------------------------------------------- input workers
def test_input_workers_survive_sigterm_so_the_rank_can_finish_its_step(tmp_path):
    # scancel sends SIGTERM to every process of the job, a rank's input workers too.
    from training.config import finalize, new_config
    from training.configs.cpu_synthetic import OVERRIDES
    from training.data.coco import load_split
    from training.data.pipeline import TrainingBatches
    from training.data.synthetic import SyntheticSpec, generate
    generate(tmp_path / "shapes", SyntheticSpec(train=6, val=1, size=80, min_object_size=16, max_object_size=40,
                                                seed=4))
    split = load_split(tmp_path / "shapes", "train2017")
    cfg = new_config()
    cfg.update_args(OVERRIDES + ["DATA.NUM_WORKERS=2", "TRAIN.BATCH_SIZE_PER_GPU=2"])
    finalize(cfg, num_ranks=1, class_names=split.class_names, has_gpu=False)
    before = child_pids(os.getpid())
    it = iter(TrainingBatches(split.training_roidb(), cfg, seed=0))
    next(it)
    workers = child_pids(os.getpid()) - before
    assert len(workers) == 2
    # They ignore SIGTERM (the kernel then drops it as it is sent), rather than handling it later.
    assert all(_ignores(pid, signal.SIGTERM) for pid in workers)
    for pid in workers:
        os.kill(pid, signal.SIGTERM)
    assert all(_alive(pid) for pid in workers)
    for _ in range(4):                 # and they still prepare batches
        next(it)
    assert all(_alive(pid) for pid in workers)
    del it
    gc.collect()                       # the pipeline closes its pool: the lifeline ends them
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in workers)


# --- the all-reduce check before training ---------------------------------------------------------

ALL_REDUCE_STAND_IN = REPO / "tests" / "recorded_machines" / "bin" / "all_reduce_perf"


@pytest.mark.parametrize("machine, efa, passes, said", [
    # The published 2-node p4d.24xlarge run over EFA: 7.80 GB/s average bus bandwidth, above the
    # floor of 5.8 (75% of it).
    ("p4d-healthy", True, True, "all-reduce check passed: 7.80083 GB/s average bus bandwidth (floor 5.8 GB/s)"),
    # The same sweep over TCP sockets (1.47 GB/s) on nodes launched with EFA: NCCL fell back.
    ("p4d-low-busbw", True, False, "avg bus bandwidth 1.46685 GB/s is below the floor of 5.8 GB/s"),
    # A cluster deployed with efa=false: NCCL is meant to use sockets, and the EFA floor does not
    # apply. The run finished with correct values, so the job goes on to train.
    ("p4d-low-busbw", False, True,
     "all-reduce check passed: 1.46685 GB/s average bus bandwidth (no floor over TCP sockets)"),
])
def test_the_all_reduce_across_the_nodes_is_judged_before_training(machine, efa, passes, said, monkeypatch,
                                                                   capsys):
    """The job's real mpirun command starts the recorded machine's all_reduce_perf (two ranks here,
    one per node there) and the job judges what it prints against the transport it configured."""
    monkeypatch.setenv("RECORDED_MACHINE", machine)
    assert job.check_fabric(nodes=2, gpus_per_node=1, instance_type="p4d.24xlarge", efa=efa,
                            program=str(ALL_REDUCE_STAND_IN)) is passes
    out = capsys.readouterr().out
    assert "mpirun --allow-run-as-root -np 2 " in out and said in out
    assert ("-x FI_PROVIDER=efa" in out) is efa
    assert ("no bus-bandwidth floor over TCP sockets (EFA is off)" in out) is not efa


def test_processes_that_ran_as_single_ranks_are_not_blamed_on_the_fabric(monkeypatch, capsys):
    """The real single-GPU run (h200-1gpu) printed by each of the two processes mpirun starts: each
    lists one rank and `# Avg bus bandwidth    : 0 `, as processes that never joined one run do."""
    monkeypatch.setenv("RECORDED_MACHINE", "h200-1gpu")
    assert not job.check_fabric(nodes=2, gpus_per_node=1, instance_type="p5en.48xlarge", efa=True,
                                program=str(ALL_REDUCE_STAND_IN))
    out = capsys.readouterr().out
    assert "all-reduce check failed: 1 rank: its bus bandwidth is 0 by definition" in out
    assert "did not join one run" in out
    assert "EFA path" not in out and "below the floor" not in out


def test_over_sockets_the_all_reduce_still_fails_on_wrong_values(tmp_path, monkeypatch, capsys):
    """Without a bandwidth floor the sockets check still catches wrong results: the recorded sockets
    run with its out-of-bounds line saying 3 wrong values."""
    recorded = REPO / "tests" / "recorded_machines" / "p4d-low-busbw" / "all_reduce_perf.txt"
    machine = tmp_path / "p4d-sockets-wrong-values"
    machine.mkdir()
    (machine / "all_reduce_perf.txt").write_text(
        recorded.read_text().replace("# Out of bounds values : 0 OK", "# Out of bounds values : 3 FAILED"))
    monkeypatch.setenv("RECORDED_MACHINE", str(machine))
    assert not job.check_fabric(nodes=2, gpus_per_node=1, instance_type="p4d.24xlarge", efa=False,
                                program=str(ALL_REDUCE_STAND_IN))
    assert "all-reduce check failed: 3 wrong values (# Out of bounds values)" in capsys.readouterr().out


@pytest.mark.parametrize("nodes, instance_type, program, reason", [
    (1, "p4d.24xlarge", str(ALL_REDUCE_STAND_IN), "a single node"),
    (3, "c5.xlarge", str(ALL_REDUCE_STAND_IN), "no bus-bandwidth floor is recorded for c5.xlarge"),
    (2, "p4d.24xlarge", None, "no all_reduce_perf on PATH"),
])
def test_the_all_reduce_check_says_when_it_does_not_apply(nodes, instance_type, program, reason, monkeypatch,
                                                          capsys):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert job.check_fabric(nodes=nodes, gpus_per_node=8, instance_type=instance_type, efa=True, program=program)
    assert capsys.readouterr().out == f"all-reduce check skipped: {reason}\n"


def test_marking_a_job_ended_leaves_a_later_job_of_the_run_alone(tmp_path):
    # `job list` marks a job that left the queue ended; by then `submit --resume` may have queued
    # the run's next job, whose record says it may write the run.
    job.record_attempt(str(tmp_path), job_id="7", attempt=0, max_attempts=4)
    job.mark_ended(str(tmp_path), "6")
    assert job.cluster_job_writing(str(tmp_path)) == "7"
    job.mark_ended(str(tmp_path), "7")
    assert job.cluster_job_writing(str(tmp_path)) is None
