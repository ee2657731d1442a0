"""Idle scale-down (launch/cluster/idle.py) against moto, with the clock given to each check (no
waiting), the run lock in the test's directory and the process table a directory of the test's
(the /proc layout: <pid>/cmdline, NUL-separated). The groups are made as the cluster stack makes
them: MinSize 0, MaxSize and DesiredCapacity the configured size (1 master, 2 workers). The
default of 30 minutes is the setting's (infra/config.py), written out here."""
import fcntl
import os
import sys
from pathlib import Path

import boto3
import pytest

from launch.cluster import capacity, health, idle, run

from aws_fakes import node_groups

MASTER, WORKER = "c-master", "c-worker"
MINUTE = 60.0
T0 = 1_700_000_000.0          # any epoch time; the checks are one minute apart from here


@pytest.fixture
def cluster(aws_env, tmp_path, monkeypatch):
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


def test_workers_scale_to_zero_after_30_idle_minutes_and_the_master_stays(cluster):
    session = cluster[0]
    for minute in range(30):                       # minutes 0..29: idle, but not for 30 minutes yet
        assert "scales to 0 after 30" in check_at(cluster, minute)
        assert workers(session) == 2
    assert "from 2 to 0 nodes after 30 min" in check_at(cluster, 30)
    assert workers(session) == 0
    (master,) = session.client("autoscaling").describe_auto_scaling_groups(
        AutoScalingGroupNames=[MASTER])["AutoScalingGroups"]
    assert master["DesiredCapacity"] == 1
    assert "nothing to scale down" in check_at(cluster, 31)


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


def test_a_run_holding_the_lock_keeps_the_workers_and_restarts_the_count(cluster):
    session = cluster[0]
    check_at(cluster, 0)
    with idle.training_lock():                     # maskrcnn-train, from minute 1 to minute 60
        for minute in range(1, 61, 3):
            assert "maskrcnn-train holds the run lock" in check_at(cluster, minute)
    assert workers(session) == 2
    for minute in range(61, 91):                   # idle again from minute 61: 30 min end at 91
        check_at(cluster, minute)
    assert workers(session) == 2
    check_at(cluster, 91)
    assert workers(session) == 0


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
    (["python", "-m", "launch.cluster.run", "--dry-run"], True),
    (["python", "-m", "launch.cluster.idle"], False),
    (["/usr/sbin/sshd", "-D"], False),
    (["python", "training/train.py"], False),         # not how anything here starts training
    ([], False),
])
def test_which_processes_are_training(argv, training):
    assert idle.is_training(argv) is training


# --- the next run scales the workers back up ------------------------------------------------------

@pytest.fixture
def scaled_down(cluster, tmp_path, monkeypatch):
    """The cluster of test_cluster_run.py (CPU nodes; this machine stands in for each), after the
    idle check took the worker group to 0."""
    session, env, _ = cluster
    session.client("autoscaling").update_auto_scaling_group(AutoScalingGroupName=WORKER, MaxSize=1,
                                                            DesiredCapacity=0)
    efs = Path(env["EFS_MOUNT"])
    (efs / "data" / "coco" / "annotations").mkdir(parents=True)
    env_file = tmp_path / "cluster.env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in env.items()) + "SSH_PORT=2222\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}:{Path(sys.executable).parent}:{os.environ['PATH']}")
    return session, env_file, efs, bin_dir


def test_the_next_run_scales_the_workers_up_and_holds_the_lock_while_training(cluster, scaled_down,
                                                                              tmp_path, capsys):
    session, env_file, efs, bin_dir = scaled_down
    log, probe = tmp_path / "mpirun.log", tmp_path / "lock-probe"
    # The stand-in mpirun records its arguments and whether the idle check could take the lock now.
    (bin_dir / "mpirun").write_text(
        f"#!/bin/sh\necho \"$*\" >> {log}\n"
        f"{sys.executable} -c 'import fcntl, os\n"
        f"fd = os.open(\"{idle.RUN_LOCK}\", os.O_RDWR)\n"
        f"try:\n    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB); print(\"free\")\n"
        f"except BlockingIOError:\n    print(\"held\")' > {probe}\n")
    (bin_dir / "mpirun").chmod(0o755)
    assert run.main(["--cluster-env", str(env_file), "--run-name", "r1"], runner=health.LocalRunner()) == 0
    out = capsys.readouterr().out
    assert f"scaling the worker group {WORKER} from 0 to 1 node(s)" in out
    assert workers(session) == 1
    assert " -np 2 " in log.read_text()              # master + the worker launched for this run
    assert probe.read_text().strip() == "held"        # the idle check could not have scaled down
    assert "no training job for 0 min" in check_at(cluster, 0)   # released when the run ended


def test_a_dry_run_only_says_the_workers_are_down(scaled_down, capsys):
    session, env_file, _, _ = scaled_down
    assert run.main(["--cluster-env", str(env_file), "--dry-run"], runner=health.LocalRunner()) == 0
    assert f"the worker group {WORKER} is at 0 of its 1 node(s)" in capsys.readouterr().out
    assert workers(session) == 0


def test_a_new_run_waits_for_the_nodes_that_are_starting():
    master = run.ClusterNode("i-1", "10.0.0.1", "c5.xlarge", "master", 0)
    worker = run.ClusterNode("i-2", "10.0.0.2", "c5.xlarge", "worker", 0)
    healthy = iter([[master], [master], [master, worker]])   # the worker passes at the third check
    now, slept = [0.0], []

    def sleep(seconds):
        slept.append(seconds)
        now[0] += seconds

    ok = run.wait_for_ranks(lambda: [master, worker], lambda nodes: (next(healthy), "table"), wanted=None,
                            allow_fewer=False, wait_s=100, poll_s=5, clock=lambda: now[0], sleep=sleep,
                            starting=lambda ok: 2)
    assert ok == [master, worker] and slept == [5, 5]
    with pytest.raises(run.LaunchError, match="1 of the cluster's 2 nodes are healthy after waiting 10 s"):
        run.wait_for_ranks(lambda: [master, worker], lambda nodes: ([master], "table"), wanted=None,
                           allow_fewer=False, wait_s=10, poll_s=5, clock=lambda: now[0], sleep=sleep,
                           starting=lambda ok: 2)


def test_which_runs_wait_for_starting_nodes():
    from datetime import datetime, timedelta, timezone
    now = datetime(2025, 1, 1, 12, tzinfo=timezone.utc)

    def group(role, desired, in_service):
        return capacity.GroupState(role, role, desired=desired, min_size=0, max_size=desired,
                                   in_service=tuple(in_service), instances=tuple(in_service))

    up = [group("master", 1, ["m"]), group("worker", 2, ["w1", "w2"])]
    launched = {"m": now - timedelta(days=2), "w1": now - timedelta(days=2), "w2": now - timedelta(days=2)}
    starting = run.nodes_starting
    assert starting(up, {"m", "w1", "w2"}, launched, scaled=True, now=now) is None      # all healthy
    assert starting(up, {"m", "w1"}, launched, scaled=True, now=now) == 3              # this run scaled up
    # A long-running node that fails its checks is not waited for (the run starts on the others)...
    assert starting(up, {"m", "w1"}, launched, scaled=False, now=now) is None
    # ... one launched 10 minutes ago is: it may still be pulling the image.
    assert starting(up, {"m", "w1"}, {**launched, "w2": now - timedelta(minutes=10)},
                    scaled=False, now=now) == 3
    assert starting(up, {"m", "w1"}, {**launched, "w2": now - timedelta(minutes=46)},
                    scaled=False, now=now) is None
    # A group with fewer InService instances than it wants is still launching.
    launching = [group("master", 1, ["m"]), capacity.GroupState("worker", "worker", 2, 0, 2, ("w1",), ("w1", "w2"))]
    assert starting(launching, {"m", "w1"}, launched, scaled=False, now=now) == 3
