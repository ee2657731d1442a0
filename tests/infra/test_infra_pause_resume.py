"""What pause, resume and the idle scale-down need from the cluster stack's template.

Expected values are the configured sizes (1 master; cdk.json's default of 1 worker, 3 in the
variant, 0 in the configuration below) and CloudFormation's documented behaviour (quoted in
docs/infra.md): when CloudFormation updates an auto-scaling group it "always sets the group size
property values of your Auto Scaling group to the values that are defined in the
AWS::AutoScaling::AutoScalingGroup resource of your template" (only a group with a scheduled
action can opt out, with the AutoScalingScheduledAction update policy), and a group created
without DesiredCapacity starts at its minimum size ("If you do not specify a desired capacity,
the default is the minimum size of the group"); CDK's `desired_capacity`: "If this is set to a
number, every deployment will reset the amount of instances to this number".
"""
from __future__ import annotations

import json
import re

import pytest

from infra import outputs
from infra.userdata import CLUSTER_NODE_SCRIPT

from cdk_synth import synthesize

CLUSTER = outputs.EFS_CLUSTER_STACK


@pytest.fixture(scope="module")
def no_workers_no_idle_synth(tmp_path_factory):
    return synthesize(tmp_path_factory.mktemp("cdk-no-idle"),
                      {"worker_count": "0", "idle_scaledown_minutes": "0"})


def groups_by_role(synth) -> dict[str, dict]:
    groups = synth.resources(CLUSTER, "AWS::AutoScaling::AutoScalingGroup").values()
    name = synth.stack_names[CLUSTER]
    return {g["Properties"]["AutoScalingGroupName"].removeprefix(f"{name}-"): g for g in groups}


def env_values(synth, key: str) -> set[str]:
    """The values `key` gets in the cluster.env that each launch template's user data writes."""
    found = set()
    for template in synth.resources(CLUSTER, "AWS::EC2::LaunchTemplate").values():
        text = json.dumps(template["Properties"]["LaunchTemplateData"]["UserData"])
        found |= set(re.findall(rf"\\n{key}=([^\\]*)\\n", text))
    return found


SIZE_PROPERTIES = {"MinSize": "min", "MaxSize": "max", "DesiredCapacity": "desired"}


def after_update(running: dict[str, int], group: dict) -> dict[str, int]:
    """A running group's sizes after CloudFormation updates it to ``group`` (the documented rule
    above): every size property the template defines is set, the others are left as they are."""
    props = group["Properties"]
    new = {**running, **{key: int(props[prop]) for prop, key in SIZE_PROPERTIES.items()
                         if prop in props}}
    new["desired"] = min(max(new["desired"], new["min"]), new["max"])   # AWS keeps min <= desired <= max
    return new


@pytest.mark.parametrize("synth_fixture, workers", [("default_synth", 1), ("variant_synth", 3),
                                                    ("no_workers_no_idle_synth", 0)])
def test_a_redeploy_never_changes_a_running_groups_size(request, synth_fixture, workers):
    groups = groups_by_role(request.getfixturevalue(synth_fixture))
    assert set(groups) == {"master", "worker"}
    for role, size in (("master", 1), ("worker", workers)):
        group = groups[role]
        # Created at MinSize 0 (no node until `cluster resume`), MaxSize the configured size.
        assert after_update({"min": 0, "max": size, "desired": 0}, group) == {
            "min": 0, "max": size, "desired": 0}
        # Whatever pause, resume, a run's scale-up and the idle scale-down left (they set the
        # desired capacity between 0 and MaxSize), a deploy of the same sizes keeps it: a paused
        # group stays paused, a running one keeps its nodes.
        for desired in range(size + 1):
            running = {"min": 0, "max": size, "desired": desired}
            assert after_update(running, group) == running, (role, desired)
        # Nothing waits at creation for nodes that are not launched then.
        assert "CreationPolicy" not in group


def test_a_changed_worker_count_reaches_the_worker_groups_maximum(default_synth, variant_synth):
    # default: 1 worker; variant: 3. The running size changes only through MaxSize: growing it
    # starts no node (the next run or `resume` scales to it), shrinking it below the running size
    # stops the surplus.
    (before, after) = (groups_by_role(s)["worker"] for s in (default_synth, variant_synth))
    assert after_update({"min": 0, "max": 1, "desired": 1}, after) == {"min": 0, "max": 3, "desired": 1}
    assert after_update({"min": 0, "max": 3, "desired": 3}, before) == {"min": 0, "max": 1, "desired": 1}


def test_only_the_master_may_set_the_groups_capacity(default_synth):
    """The master scales the workers for a run, and its idle check pauses both groups."""
    scaling = []
    for logical_id, policy in default_synth.resources(CLUSTER, "AWS::IAM::Policy").items():
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            if "autoscaling:SetDesiredCapacity" in json.dumps(statement["Action"]):
                scaling.append((logical_id, statement))
    (policy_id, statement), = scaling
    assert policy_id.startswith("ClusterMasterRole")
    assert statement["Action"] == "autoscaling:SetDesiredCapacity" and statement["Effect"] == "Allow"
    assert "Condition" not in statement
    # The two groups, by name: the UUID in a group's ARN is assigned at its creation.
    ends = sorted(json.dumps(r)[-30:] for r in statement["Resource"])
    assert [e.rsplit("/", 1)[1] for e in ends] == [f'{CLUSTER}-master"]]}}', f'{CLUSTER}-worker"]]}}']


def test_cluster_env_carries_the_idle_minutes(default_synth, no_workers_no_idle_synth):
    assert env_values(default_synth, "IDLE_SCALEDOWN_MINUTES") == {"30"}   # infra/config.py's default
    assert env_values(no_workers_no_idle_synth, "IDLE_SCALEDOWN_MINUTES") == {"0"}


def test_the_master_runs_the_idle_check_every_minute_in_the_container():
    script = CLUSTER_NODE_SCRIPT.read_text()
    body = script[script.index("install_idle_check() {"):]
    body = body[:body.index("\n}\n")]
    assert "(( ${IDLE_SCALEDOWN_MINUTES:-0} > 0 )) || return 0" in body      # 0: no timer at all
    assert "exec docker exec maskrcnn python -m launch.cluster.idle" in body
    assert "OnCalendar=minutely" in body and "Type=oneshot" in body
    assert "systemctl enable --now maskrcnn-idle.timer" in body
    # Called on the master only.
    master_block = script[script.rindex('if [[ "$ROLE" == master ]]; then'):]
    assert master_block.split("else", 1)[0].count("install_idle_check") == 1
    assert script.count("install_idle_check\n") == 1
