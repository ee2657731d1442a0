"""The cluster's AMI is read once and kept. With the account and region known (the CDK CLI sets
CDK_DEFAULT_ACCOUNT/REGION when it has credentials; app.py makes the stacks environment-specific),
the Deep Learning AMI's SSM parameter is a context lookup: a synth without its value asks the CLI
for it (the assembly's missing context), the CLI writes the answer to cdk.context.json, and every
later synth uses that value. The context keys below are written as CDK writes them into
cdk.context.json: `<provider>:<prop>=<value>:...`, props sorted by name. Offline (no account) the
parameter stays a CloudFormation parameter (test_infra_stacks.py), and the `ami_id` setting wins over both."""
from __future__ import annotations

import pytest

from infra import outputs
from infra.config import SETTINGS

from cdk_synth import (DEPLOY_ACCOUNT, DEPLOY_REGION, ZONES_LOOKUP_KEY, ami_lookup_key, cfn_lint_problems,
                       deploy_environment, failing_reports, recorded_lookups, synthesize)

CLUSTER = outputs.EFS_CLUSTER_STACK
ENV = deploy_environment()
REGION = DEPLOY_REGION
DLAMI_PARAMETER = SETTINGS["dlami_ssm_parameter"].default
# Written out by hand, as cdk.context.json holds them.
AMI_KEY = f"ssm:account={DEPLOY_ACCOUNT}:parameterName={DLAMI_PARAMETER}:region={DEPLOY_REGION}"
RECORDED = recorded_lookups()
AMI_PARAMETER_TYPE = "AWS::SSM::Parameter::Value<AWS::EC2::Image::Id>"


def image_ids(synth) -> set:
    return {lt["Properties"]["LaunchTemplateData"]["ImageId"]
            for lt in synth.resources(CLUSTER, "AWS::EC2::LaunchTemplate").values()}


def ami_parameters(synth) -> list:
    return [p for p in synth.templates[CLUSTER].get("Parameters", {}).values()
            if p["Type"] == AMI_PARAMETER_TYPE]


@pytest.fixture(scope="module")
def first_synth(tmp_path_factory):
    """A synth with credentials before any lookup: cdk.context.json holds nothing yet."""
    return synthesize(tmp_path_factory.mktemp("first"), env=ENV)


@pytest.fixture(scope="module")
def recorded_synth(tmp_path_factory):
    """Every later synth: the CLI passes cdk.context.json's values as context."""
    return synthesize(tmp_path_factory.mktemp("recorded"), RECORDED, env=ENV)


def test_with_an_account_the_first_synth_asks_the_cli_to_look_the_ami_up(first_synth):
    assert ami_lookup_key(DLAMI_PARAMETER) == AMI_KEY and set(RECORDED) == {AMI_KEY, ZONES_LOOKUP_KEY}
    assert first_synth.missing_context.get(AMI_KEY) == "ssm"
    assert first_synth.missing_context.get(ZONES_LOOKUP_KEY) == "availability-zones"
    assert ami_parameters(first_synth) == []   # not re-read by CloudFormation at each deploy
    # Until the CLI has looked it up, an id of an AMI's shape, so that this synth passes the
    # template checks and the CLI goes on to the lookup.
    assert image_ids(first_synth) == {"ami-00000000000000000"}


def test_the_recorded_ami_is_used_as_is_and_reported(recorded_synth):
    assert recorded_synth.missing_context == {}
    assert ami_parameters(recorded_synth) == []
    assert image_ids(recorded_synth) == {RECORDED[AMI_KEY]}
    assert recorded_synth.templates[CLUSTER]["Outputs"][outputs.CLUSTER_AMI_ID]["Value"] == RECORDED[AMI_KEY]


def test_the_ami_id_setting_wins_over_the_recorded_ami(tmp_path):
    pinned = "ami-0123456789abcdef0"
    synth = synthesize(tmp_path, {**RECORDED, "ami_id": pinned}, env=ENV)
    assert image_ids(synth) == {pinned}
    assert synth.templates[CLUSTER]["Outputs"][outputs.CLUSTER_AMI_ID]["Value"] == pinned


@pytest.mark.parametrize("stack", [outputs.NETWORK_STORAGE_STACK, CLUSTER, outputs.SAGEMAKER_STACK])
def test_the_templates_bound_to_an_account_pass_cfn_lint(recorded_synth, stack):
    """What a deploy with credentials creates: literal zones and AMI (cdk-nag and cdk-preflight ran
    in the synth)."""
    assert cfn_lint_problems(recorded_synth.templates[stack], regions=(REGION,)) == []


def test_a_deploy_with_credentials_passes_the_synth_checks_with_the_image_built_in_codebuild(tmp_path):
    """cdk-nag's findings name ARNs as the template writes them, literal in a stack bound to an
    account: the acknowledgments hold in both spellings (synth raises on an unacknowledged one)."""
    synth = synthesize(tmp_path, {**RECORDED, "image_build": "codebuild"}, env=ENV)
    assert failing_reports(synth.outdir) == []
    assert synth.missing_context == {}
