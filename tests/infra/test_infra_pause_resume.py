"""What pause, resume and the idle scale-down need from the cluster stack's template.

Expected values are the configured sizes (1 master; cdk.json's default of 1 worker, 3 in the
variant, 0 in the configuration below) and CloudFormation's documented behaviour: a group's
creation policy counts one success signal per instance it launches at creation (DesiredCapacity),
and with the update policy IgnoreUnmodifiedGroupSizeProperties a stack update changes MinSize,
MaxSize and DesiredCapacity only when the template's values change (so a redeploy keeps a paused
group paused).
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


@pytest.mark.parametrize("synth_fixture, workers", [("default_synth", 1), ("variant_synth", 3),
                                                    ("no_workers_no_idle_synth", 0)])
def test_groups_start_at_the_configured_size_and_may_go_to_zero(request, synth_fixture, workers):
    groups = groups_by_role(request.getfixturevalue(synth_fixture))
    assert set(groups) == {"master", "worker"}
    for role, size in (("master", 1), ("worker", workers)):
        group = groups[role]
        props = group["Properties"]
        assert (props["MinSize"], props["MaxSize"], props["DesiredCapacity"]) == ("0", str(size), str(size))
        assert group["UpdatePolicy"]["AutoScalingScheduledAction"] == {
            "IgnoreUnmodifiedGroupSizeProperties": True}
        if size:
            assert group["CreationPolicy"]["ResourceSignal"]["Count"] == size
        else:
            assert "CreationPolicy" not in group     # nothing launches, nothing to wait for


def test_only_the_master_may_set_only_the_worker_groups_capacity(default_synth):
    scaling = []
    for logical_id, policy in default_synth.resources(CLUSTER, "AWS::IAM::Policy").items():
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            if "autoscaling:SetDesiredCapacity" in json.dumps(statement["Action"]):
                scaling.append((logical_id, statement))
    (policy_id, statement), = scaling
    assert policy_id.startswith("ClusterMasterRole")
    assert statement["Action"] == "autoscaling:SetDesiredCapacity" and statement["Effect"] == "Allow"
    assert "Condition" not in statement
    # One group, by name: the UUID in a group's ARN is assigned at its creation.
    (resource,) = [statement["Resource"]] if isinstance(statement["Resource"], dict) else statement["Resource"]
    assert json.dumps(resource).endswith(f':autoScalingGroup:*:autoScalingGroupName/{CLUSTER}-worker"]]}}')


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
