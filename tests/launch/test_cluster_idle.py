"""Idle scale-down (launch/cluster/idle.py) against moto, with the clock given to each check (no
waiting), the run lock in the test's directory and the process table a directory of the test's
(the /proc layout: <pid>/cmdline, NUL-separated). The groups are made as the cluster stack makes
them: MinSize 0, MaxSize and DesiredCapacity the configured size (1 master, 2 workers). The
default of 30 minutes is the setting's (infra/config.py), written out here.

Slurm's queue comes from stand-in ``squeue`` and ``sbatch`` programs on PATH that print what the
real ones print for the format launch/cluster/jobs.py asks for; tests/launch/test_cluster_slurm.py
asks a real slurmctld."""
import fcntl
import os
import sys
from pathlib import Path

import boto3
import pytest

from launch.cluster import capacity, idle, jobs

from aws_fakes import deploy_stack, node_groups
from infra import outputs

MASTER, WORKER = "c-master", "c-worker"
MINUTE = 60.0
T0 = 1_700_000_000.0          # any epoch time; the checks are one minute apart from here


# squeue -h -o "%i|%j|%T|%D|%N|%r|%M" of a job requeued after a node was lost, waiting for nodes.
QUEUED = "7|coco-24ep|PENDING|3|(null)|BeginTime|0:00\n"


@pytest.fixture
def slurm_queue(tmp_path, monkeypatch):
    """A file holding what squeue prints; squeue fails (slurmctld down) when it is missing."""
    bin_dir, queue = tmp_path / "bin", tmp_path / "squeue.out"
    bin_dir.mkdir()
    (bin_dir / "squeue").write_text(f"#!/bin/sh\nif [ -f {queue} ]; then cat {queue}; else\n"
                                    f"echo 'squeue: error: Unable to contact slurm controller' >&2; exit 1; fi\n")
    (bin_dir / "squeue").chmod(0o755)
    queue.write_text("")
    monkeypatch.setenv("PATH", f"{bin_dir}:{Path(sys.executable).parent}:{os.environ['PATH']}")
    return queue


@pytest.fixture
def cluster(aws_env, tmp_path, monkeypatch, slurm_queue):
    session = boto3.session.Session()
    node_groups(session, {MASTER: (0, 1, 1), WORKER: (0, 2, 2)})
    monkeypatch.setattr(idle, "RUN_LOCK", str(tmp_path / "training.lock"))
    proc = tmp_path / "proc"
    proc.mkdir()
    env = {"AWS_REGION": "us-east-1", "STACK_NAME": "c", "MASTER_ASG_NAME": MASTER,
           "WORKER_ASG_NAME": WORKER, "EFS_MOUNT": str(tmp_path / "efs"), "IDLE_SCALEDOWN_MINUTES": "30"}
    return session, env, proc


def workers(session) -> int:
    (group,) = session.client("autoscaling").describe_auto_scaling_groups(
        AutoScalingGroupNames=[WORKER])["AutoScalingGroups"]
    return group["DesiredCapacity"]


def check_at(cluster, minute: float, **env) -> str:
    session, base, proc = cluster
    return idle.check(session, {**base, **env}, now=T0 + minute * MINUTE, proc_root=str(proc))


def master(session) -> int:
    (group,) = session.client("autoscaling").describe_auto_scaling_groups(
        AutoScalingGroupNames=[MASTER])["AutoScalingGroups"]
    return group["DesiredCapacity"]


def test_the_whole_cluster_pauses_after_30_idle_minutes(cluster):
    session = cluster[0]
    for minute in range(30):                       # minutes 0..29: idle, but not for 30 minutes yet
        assert "pauses after 30" in check_at(cluster, minute)
        assert (master(session), workers(session)) == (1, 2)
    # An idle master is a full GPU node with nothing to do: it goes too, after the workers.
    said = check_at(cluster, 30)
    assert f"worker group {WORKER} from 2 to 0, master group {MASTER} from 1 to 0" in said, said
    assert "`maskrcnn cluster resume --wait`" in said
    assert (master(session), workers(session)) == (0, 0)


def test_a_master_whose_workers_are_already_at_zero_pauses_too(cluster):
    session = cluster[0]
    session.client("autoscaling").set_desired_capacity(AutoScalingGroupName=WORKER, DesiredCapacity=0)
    for minute in range(30):
        check_at(cluster, minute)
    assert master(session) == 1
    assert f"master group {MASTER} from 1 to 0" in check_at(cluster, 30)
    assert (master(session), workers(session)) == (0, 0)


def test_cluster_resume_wait_brings_a_paused_cluster_back(cluster, capsys):
    session = cluster[0]
    for minute in range(31):
        check_at(cluster, minute)
    assert (master(session), workers(session)) == (0, 0)
    deploy_stack(session, "c", {outputs.MASTER_ASG_NAME: MASTER, outputs.WORKER_ASG_NAME: WORKER})
    assert capacity.main(["resume", "--wait", "--stack", "c", "--region", "us-east-1"],
                         sleep=lambda s: None) == 0
    assert (master(session), workers(session)) == (1, 2)
    # The master's first check after it is back (a gap of more than 5 minutes) counts from zero.
    assert "no training job for 0 min" in check_at(cluster, 120)


def test_the_idle_time_survives_restarts_in_its_file_on_efs(cluster):
    session, env, _ = cluster
    # Every check is a new process in life (the timer's): only the file carries the count.
    for minute in range(0, 29, 4):                 # 0, 4, ..., 28: gaps shorter than MAX_GAP_S
        check_at(cluster, minute)
    state = idle.state_file(env)
    assert state == Path(env["EFS_MOUNT"], ".maskrcnn", "c", "idle.json")
    assert '"idle_since": 1700000000.0' in state.read_text()
    assert workers(session) == 2
    check_at(cluster, 32)                          # 32 min after the first idle check
    assert workers(session) == 0


def test_a_queued_job_keeps_the_workers_and_restarts_the_count(cluster, slurm_queue):
    session = cluster[0]
    check_at(cluster, 0)
    slurm_queue.write_text(QUEUED)                 # from minute 1 to minute 60 a job waits or runs
    for minute in range(1, 61, 3):
        assert "busy (Slurm job 7 coco-24ep (PENDING))" in check_at(cluster, minute)
    slurm_queue.write_text("")
    assert workers(session) == 2
    for minute in range(61, 91):                   # idle again from minute 61: 30 min end at 91
        check_at(cluster, minute)
    assert workers(session) == 2
    check_at(cluster, 91)
    assert workers(session) == 0


def test_a_slurm_that_does_not_answer_counts_as_busy(cluster, slurm_queue):
    slurm_queue.unlink()
    for minute in range(0, 61, 4):
        assert "busy (Slurm did not answer" in check_at(cluster, minute)
    assert workers(cluster[0]) == 2


def test_a_submit_holding_the_lock_counts_as_busy(cluster):
    with idle.training_lock():
        assert "busy (a job is being submitted)" in check_at(cluster, 0)


def test_a_training_process_started_by_hand_counts_as_a_job(cluster):
    session, _, proc = cluster
    (proc / "4242").mkdir()
    (proc / "4242" / "cmdline").write_bytes(b"/usr/bin/python\0-m\0training.train\0--logdir\0/efs/logs/x\0")
    (proc / "self").mkdir()                         # not a process id: skipped
    for minute in range(0, 61, 4):
        assert "-m training.train --logdir /efs/logs/x" in check_at(cluster, minute)
    assert workers(session) == 2


def test_a_gap_without_checks_restarts_the_count(cluster):
    session = cluster[0]
    for minute in range(0, 20):
        check_at(cluster, minute)
    # No check for 11 minutes (the master was off): idle time counts again from minute 30.
    for minute in range(30, 60):
        check_at(cluster, minute)
    assert workers(session) == 2
    check_at(cluster, 60)
    assert workers(session) == 0


def test_workers_brought_back_up_are_not_scaled_down_at_once(cluster):
    session = cluster[0]
    for minute in range(0, 31):
        check_at(cluster, minute)
    assert workers(session) == 0
    # `resume`, or a run that has since ended, brings them back: a fresh 30 minutes.
    session.client("autoscaling").set_desired_capacity(AutoScalingGroupName=WORKER, DesiredCapacity=2)
    for minute in range(32, 62):
        check_at(cluster, minute)
    assert workers(session) == 2
    check_at(cluster, 62)
    assert workers(session) == 0


def test_zero_minutes_turns_it_off(cluster):
    session = cluster[0]
    for minute in range(0, 120, 4):
        assert check_at(cluster, minute, IDLE_SCALEDOWN_MINUTES="0") == (
            "idle scale-down is off (IDLE_SCALEDOWN_MINUTES=0)")
    assert workers(session) == 2


def test_a_bad_setting_is_one_error_line(cluster, tmp_path, capsys):
    env_file = tmp_path / "cluster.env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in {**cluster[1], "IDLE_SCALEDOWN_MINUTES": "half"}.items()))
    assert idle.main(["--cluster-env", str(env_file)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: IDLE_SCALEDOWN_MINUTES in /etc/maskrcnn/cluster.env is 'half'")
    assert len(err.splitlines()) == 1 and workers(cluster[0]) == 2


def test_the_run_lock_is_shared_between_runs_and_exclusive_to_the_check(cluster):
    with idle.training_lock():
        probe = os.open(idle.RUN_LOCK, os.O_RDWR)
        try:
            fcntl.flock(probe, fcntl.LOCK_SH | fcntl.LOCK_NB)      # a second run: no wait
            fcntl.flock(probe, fcntl.LOCK_UN)
            with pytest.raises(BlockingIOError):                     # the check: refused
                fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(probe)


@pytest.mark.parametrize("argv, training", [
    (["mpirun", "--allow-run-as-root", "-np", "16"], True),
    (["/opt/amazon/openmpi/bin/orted", "-mca", "ess", "env"], True),
    (["python", "-m", "training.train", "--logdir", "/efs/logs/r"], True),
    (["python", "-m", "launch.cluster.idle"], False),
    (["/usr/sbin/sshd", "-D"], False),
    (["python", "training/train.py"], False),         # not how anything here starts training
    ([], False),
])
def test_which_processes_are_training(argv, training):
    assert idle.is_training(argv) is training


# --- the next job scales the workers back up ------------------------------------------------------

def test_the_next_job_scales_the_workers_up_while_holding_the_lock(cluster, slurm_queue, tmp_path, capsys):
    session, env, _ = cluster
    session.client("autoscaling").update_auto_scaling_group(AutoScalingGroupName=WORKER, DesiredCapacity=0)
    efs = Path(env["EFS_MOUNT"])
    (efs / "data" / "coco" / "annotations").mkdir(parents=True)
    for split in ("train2017", "val2017"):
        (efs / "data" / "coco" / "annotations" / f"instances_{split}.json").write_text("{}")
        (efs / "data" / "coco" / split).mkdir()
    log, probe = tmp_path / "sbatch.log", tmp_path / "lock-probe"
    # The stand-in sbatch records its arguments and whether the idle check could take the lock now,
    # and prints what `sbatch --parsable` prints.
    (slurm_queue.parent / "bin" / "sbatch").write_text(
        f"#!/bin/sh\necho \"$*\" >> {log}\n"
        f"{sys.executable} -c 'import fcntl, os\n"
        f"fd = os.open(\"{idle.RUN_LOCK}\", os.O_RDWR)\n"
        f"try:\n    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB); print(\"free\")\n"
        f"except BlockingIOError:\n    print(\"held\")' > {probe}\necho 12\n")
    (slurm_queue.parent / "bin" / "sbatch").chmod(0o755)
    env = {**env, "WORKER_COUNT": "2", "INSTANCE_TYPE": "c5.xlarge"}
    name, job_id = jobs.submit(env, run_name="r1", resume=False, overrides=[], nodes=None, data_dir=None,
                               stage_to_nvme=True, max_attempts=4, stall_minutes=30)
    assert (name, job_id) == ("r1", "12")
    assert f"scaling the worker group {WORKER} from 0 to 2 node(s)" in capsys.readouterr().out
    assert workers(session) == 2
    assert "--nodes=3 " in log.read_text()              # the master and both workers
    assert probe.read_text().strip() == "held"           # the idle check could not have scaled down
    assert " --efa " not in log.read_text()              # no EFA interfaces on c5.xlarge
    # Nodes with EFA interfaces (cluster.env's EFA_INTERFACES): the job routes NCCL over EFA.
    jobs.submit({**env, "EFA_INTERFACES": "4"}, run_name="r2", resume=False, overrides=[], nodes=None,
                data_dir=None, stage_to_nvme=True, max_attempts=4, stall_minutes=30)
    assert " --efa " in log.read_text().splitlines()[-1]


def test_a_dataset_staged_under_its_own_name_is_checked_before_it_is_queued(cluster, slurm_queue, tmp_path):
    """`submit --dataset parts` reads /efs/data/parts (`maskrcnn data upload --name parts`, then
    `to-efs --name parts`), with splits named by their files; a split that is not there stops the
    submit with the file it looked for, before anything is queued."""
    _, env, _ = cluster
    parts = Path(env["EFS_MOUNT"]) / "data" / "parts"
    (parts / "images" / "train").mkdir(parents=True)
    (parts / "train.json").write_text("{}")
    log = tmp_path / "sbatch.log"
    (slurm_queue.parent / "bin" / "sbatch").write_text(f"#!/bin/sh\necho \"$*\" >> {log}\necho 13\n")
    (slurm_queue.parent / "bin" / "sbatch").chmod(0o755)
    env = {**env, "WORKER_COUNT": "0", "INSTANCE_TYPE": "c5.xlarge"}
    overrides = ["DATA.TRAIN=('train.json:images/train',)", "DATA.VAL=('val.json:images/val',)"]
    with pytest.raises(jobs.LaunchError, match=r"val\.json"):
        jobs.submit(env, run_name="p1", resume=False, overrides=overrides, nodes=None, data_dir=None,
                    stage_to_nvme=False, max_attempts=4, stall_minutes=30, dataset="parts")
    assert not log.exists() and not (Path(env["EFS_MOUNT"]) / "logs" / "p1").exists()
    (parts / "images" / "val").mkdir(parents=True)
    (parts / "val.json").write_text("{}")
    assert jobs.submit(env, run_name="p1", resume=False, overrides=overrides, nodes=None, data_dir=None,
                       stage_to_nvme=False, max_attempts=4, stall_minutes=30, dataset="parts") == ("p1", "13")
    assert f"--data-dir {parts} " in log.read_text()


@pytest.mark.parametrize("seconds", [5, 91])
def test_a_stop_grace_that_does_not_fit_is_refused_before_anything_is_queued(cluster, slurm_queue, tmp_path, seconds):
    # Slurm's SIGKILL comes KillWait (110 s) after its SIGTERM, and the job script needs 20 s of that to
    # report: a grace of 91 s would be cut short; 5 s is not enough for a step and a save.
    _, env, _ = cluster
    log = tmp_path / "sbatch.log"
    (slurm_queue.parent / "bin" / "sbatch").write_text(f"#!/bin/sh\necho \"$*\" >> {log}\necho 14\n")
    (slurm_queue.parent / "bin" / "sbatch").chmod(0o755)
    for split in ("train2017", "val2017"):
        (tmp_path / "annotations").mkdir(exist_ok=True)
        (tmp_path / "annotations" / f"instances_{split}.json").write_text("{}")
        (tmp_path / split).mkdir()
    env = {**env, "WORKER_COUNT": "0", "INSTANCE_TYPE": "c5.xlarge"}
    kwargs = dict(resume=False, overrides=[], nodes=None, data_dir=str(tmp_path), stage_to_nvme=False,
                  max_attempts=4, stall_minutes=30)
    with pytest.raises(jobs.LaunchError, match=rf"--stop-grace {seconds}: must be 10 to 90 seconds"):
        jobs.submit(env, run_name="g1", stop_grace=seconds, **kwargs)
    assert not log.exists() and not (Path(env["EFS_MOUNT"]) / "logs" / "g1").exists()
    jobs.submit(env, run_name="g1", **kwargs)
    assert " --stop-grace 90 " in log.read_text()
    jobs.submit(env, run_name="g2", stop_grace=10, **kwargs)
    assert " --stop-grace 10 " in log.read_text().splitlines()[-1]
