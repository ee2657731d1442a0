"""Pause, resume and status of the cluster (launch/cluster/capacity.py) against moto: the two
auto-scaling groups created as the cluster stack creates them (launch templates; MinSize 0,
MaxSize and DesiredCapacity the configured size: 1 master, 2 workers here) and a stack whose
outputs name them, under a name prefix as a second deployment would have."""
import json

import boto3
import pytest

from aws_fakes import deploy_stack
from infra import outputs
from launch.cluster import capacity

STACK = f"team-a-{outputs.EFS_CLUSTER_STACK}"
MASTER, WORKER = f"{STACK}-master", f"{STACK}-worker"
SIZES = {MASTER: 1, WORKER: 2}


def _groups(min_size=None):
    session = boto3.session.Session()
    ec2, asg = session.client("ec2"), session.client("autoscaling")
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.1.0/24")["Subnet"]["SubnetId"]
    for name, size in SIZES.items():
        ec2.create_launch_template(LaunchTemplateName=f"{name}-lt", LaunchTemplateData={
            "ImageId": "ami-12c6146b", "InstanceType": "g5.48xlarge"})
        asg.create_auto_scaling_group(
            AutoScalingGroupName=name, LaunchTemplate={"LaunchTemplateName": f"{name}-lt"},
            MinSize=size if min_size is None else min_size, MaxSize=size, DesiredCapacity=size,
            VPCZoneIdentifier=subnet)
    deploy_stack(session, STACK, {outputs.MASTER_ASG_NAME: MASTER, outputs.WORKER_ASG_NAME: WORKER})
    return asg


@pytest.fixture
def cluster(aws_env):
    return _groups(min_size=0)


def desired(asg) -> dict[str, int]:
    groups = asg.describe_auto_scaling_groups(AutoScalingGroupNames=list(SIZES))["AutoScalingGroups"]
    return {g["AutoScalingGroupName"]: g["DesiredCapacity"] for g in groups}


def status(capsys) -> dict:
    assert capacity.main(["--stack", STACK, "status", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_pause_then_resume_restores_the_configured_sizes(cluster, capsys):
    assert desired(cluster) == {MASTER: 1, WORKER: 2}
    assert capacity.main(["--name-prefix", "team-a", "pause"]) == 0
    out = capsys.readouterr().out
    assert desired(cluster) == {MASTER: 0, WORKER: 0}
    assert f"worker group {WORKER}: desired 2 -> 0" in out and f"master group {MASTER}: desired 1 -> 0" in out
    assert "EFS, the bucket, the image and the settings are kept" in out
    after_pause = status(capsys)
    assert after_pause["paused"] and after_pause["state"] == "paused"
    assert [(g["role"], g["desired"], g["in_service"], g["max"]) for g in after_pause["groups"]] == [
        ("master", 0, 0, 1), ("worker", 0, 0, 2)]

    # The deployment's options go before or after the command.
    assert capacity.main(["resume", "--wait", "--region", "us-east-1", "--name-prefix", "team-a"]) == 0
    out = capsys.readouterr().out
    assert desired(cluster) == {MASTER: 1, WORKER: 2}
    assert f"worker group {WORKER}: desired 0 -> 2" in out
    resumed = status(capsys)
    assert resumed["state"] == "running" and not resumed["paused"]
    assert [(g["desired"], g["in_service"]) for g in resumed["groups"]] == [(1, 1), (2, 2)]


def test_pause_and_resume_twice_change_nothing_more(cluster, capsys):
    assert capacity.main(["--stack", STACK, "resume"]) == 0
    assert "every group is already at its configured size" in capsys.readouterr().out
    assert desired(cluster) == {MASTER: 1, WORKER: 2}
    assert capacity.main(["--stack", STACK, "pause"]) == 0
    assert capacity.main(["--stack", STACK, "pause"]) == 0
    assert "it was already" in capsys.readouterr().out
    assert desired(cluster) == {MASTER: 0, WORKER: 0}


def test_status_text_names_each_group_and_an_idle_scaled_down_cluster(cluster, capsys):
    cluster.set_desired_capacity(AutoScalingGroupName=WORKER, DesiredCapacity=0)  # the idle check
    assert capacity.main(["--stack", STACK, "status"]) == 0
    out = capsys.readouterr().out
    assert f"cluster {STACK}: workers scaled down (idle)" in out
    assert f"master  {MASTER}  desired 1 of 1, 1 InService" in out
    assert f"worker  {WORKER}  desired 0 of 2, 0 InService" in out
    assert status(capsys)["state"] == "workers-scaled-down"


def test_a_group_deployed_with_a_fixed_size_is_named_with_the_fix(aws_env, capsys):
    asg = _groups(min_size=None)          # MinSize = MaxSize, as before the groups allowed 0
    assert capacity.main(["--stack", STACK, "pause"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: group {WORKER} allows 2 to 2 instances, not 0")
    assert "redeploy the cluster stack" in err and len(err.strip().splitlines()) == 1
    assert desired(asg) == {MASTER: 1, WORKER: 2}


def test_resume_warns_when_a_group_stopped_launching(cluster, capsys):
    capacity.main(["--stack", STACK, "pause"])
    cluster.suspend_processes(AutoScalingGroupName=WORKER, ScalingProcesses=["Launch"])
    assert capacity.main(["--stack", STACK, "resume"]) == 0
    err = capsys.readouterr().err
    assert f"warning: {WORKER} has its Launch process suspended" in err
    assert (f"aws autoscaling resume-processes --auto-scaling-group-name {WORKER} "
            "--scaling-processes Launch") in err
    assert desired(cluster) == {MASTER: 1, WORKER: 2}


def test_a_stack_that_is_not_there_is_one_error_line(aws_env, capsys):
    assert capacity.main(["--name-prefix", "nobody", "status"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: stack 'nobody-{outputs.EFS_CLUSTER_STACK}' does not exist")
    assert len(err.splitlines()) == 1


def test_waiting_gives_up_with_the_counts(monkeypatch):
    # A group that stays one instance short (moto launches every instance at once, so the groups'
    # state is given here; the loop and its clock are what is tested).
    short = capacity.GroupState("worker", WORKER, desired=2, min_size=0, max_size=2,
                                in_service=("i-1",), instances=("i-1", "i-2"))
    monkeypatch.setattr(capacity, "describe_groups", lambda session, names: [short])
    now, slept = [0.0], []

    def sleep(seconds):
        slept.append(seconds)
        now[0] += seconds

    with pytest.raises(capacity.LaunchError, match=f"not InService after waiting 60 s: {WORKER} has 1 of 2"):
        capacity.wait_in_service(None, {"worker": WORKER}, timeout_s=60, poll_s=15,
                                 clock=lambda: now[0], sleep=sleep)
    assert slept == [15, 15, 15, 15]     # checks at 0, 15, 30, 45 and 60 s of the injected clock


def _run_record(run: str, active: float, minutes_ago: float, deployment: str = STACK) -> None:
    """A record rank 0 writes (training/cloudwatch_metrics.py): run_active 1 while training, 0 in
    its last record; dimensions Deployment (the stack) and Run."""
    from datetime import datetime, timedelta, timezone
    from training import metrics as m
    boto3.client("cloudwatch").put_metric_data(Namespace=m.NAMESPACE, MetricData=[{
        "MetricName": m.RUN_ACTIVE, "Value": active,
        "Timestamp": datetime.now(timezone.utc) - timedelta(minutes=minutes_ago),
        "Dimensions": [{"Name": m.DEPLOYMENT_DIMENSION, "Value": deployment},
                       {"Name": m.RUN_DIMENSION, "Value": run}]}])


def test_pause_refuses_while_a_run_trains_and_names_it(cluster, capsys):
    _run_record("coco-24ep", 1, minutes_ago=3)
    _run_record("coco-24ep", 1, minutes_ago=2)
    _run_record("old-run", 0, minutes_ago=10)                     # ended with its last record
    _run_record("other-team", 1, minutes_ago=1, deployment="team-b-EfsClusterStack")
    assert capacity.main(["--stack", STACK, "pause"]) == 2
    err = capsys.readouterr().err
    assert "run coco-24ep is training" in err and "old-run" not in err and "other-team" not in err
    assert "`sudo maskrcnn job stop coco-24ep`" in err and "--force" in err
    assert desired(cluster) == {MASTER: 1, WORKER: 2}             # nothing was paused

    # Once the job has stopped gracefully, its last record says so, and pause goes ahead.
    _run_record("coco-24ep", 0, minutes_ago=0)
    assert capacity.main(["--stack", STACK, "pause"]) == 0
    assert desired(cluster) == {MASTER: 0, WORKER: 0}


def test_pause_force_pauses_a_training_run(cluster):
    _run_record("coco-24ep", 1, minutes_ago=1)
    assert capacity.main(["--stack", STACK, "pause", "--force"]) == 0
    assert desired(cluster) == {MASTER: 0, WORKER: 0}


def test_a_run_silent_for_longer_than_the_window_does_not_block_pause(cluster):
    # Killed without its last record over half an hour ago: nothing trains any more.
    _run_record("crashed", 1, minutes_ago=capacity.RUN_ACTIVE_WINDOW_S / 60 + 5)
    assert capacity.main(["--stack", STACK, "pause"]) == 0
    assert desired(cluster) == {MASTER: 0, WORKER: 0}
