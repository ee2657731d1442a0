"""Static checks on what synth produces: cdk-nag's AWS Solutions pack (zero unacknowledged
findings), cdk-preflight in enforce mode and CDK's default validation rules as errors (on the
default deployment and its variants), cfn-lint (zero errors and warnings) and shellcheck on the
boot scripts."""
from __future__ import annotations

import json
import subprocess
import shutil

import pytest

from infra import outputs
from infra.userdata import USERDATA_DIR

from cdk_synth import (REPO_ROOT, VARIANT_CONTEXT, cdk_json_context, cfn_lint_problems, failing_reports,
                       load_app_module)
from test_infra_capacity import G5_RESERVATION_GROUP, P5_CAPACITY_BLOCK
from test_infra_spot import SPOT

STACKS = (outputs.NETWORK_STORAGE_STACK, outputs.EFS_CLUSTER_STACK, outputs.SAGEMAKER_STACK)


@pytest.mark.parametrize("synth_fixture", ["default_synth", "variant_synth"])
def test_cdk_nag_reports_no_unacknowledged_findings(request, synth_fixture):
    synth = request.getfixturevalue(synth_fixture)   # synth itself fails on a finding
    assert failing_reports(synth.outdir) == []


def test_cdk_nag_runs_on_every_synth_and_fails_it(tmp_path):
    """The app registers the AWS Solutions pack itself: an insecure resource fails synth."""
    import aws_cdk as cdk
    from aws_cdk import aws_s3 as s3

    app = cdk.App(context={**cdk_json_context(), "settings_file": "none"},
                  outdir=str(tmp_path))
    stacks = load_app_module().build(app)
    s3.CfnBucket(stacks.shared, "UnencryptedUnloggedBucket")
    with pytest.raises(Exception, match="ValidationFailed"):
        app.synth()
    (report,) = failing_reports(tmp_path)
    rules = {v["ruleName"] for v in report["violations"]}
    assert {"AwsSolutions-S1", "AwsSolutions-S10"} <= rules
    paths = {c["constructPath"] for v in report["violations"] for c in v["violatingConstructs"]}
    assert paths == {"NetworkStorageStack/UnencryptedUnloggedBucket"}


def test_cdk_preflight_runs_on_every_synth_in_enforce_mode(tmp_path):
    """The app registers cdk-preflight itself, enforcing: a template that would fail at deploy
    (an EventBridge input template with a placeholder it does not declare: PutTargets refuses
    it) fails synth."""
    import aws_cdk as cdk
    from aws_cdk import aws_events as events

    from infra import settings

    app = cdk.App(context={**cdk_json_context(), "settings_file": settings.NO_FILE, "image_build": "local"},
                  outdir=str(tmp_path))
    stacks = load_app_module().build(app)
    events.CfnRule(stacks.sagemaker, "RuleWithAnUndeclaredPlaceholder",
                   event_pattern={"source": ["aws.sagemaker"]},
                   targets=[events.CfnRule.TargetProperty(
                       id="Target0", arn="arn:aws:sns:us-east-1:123456789012:topic",
                       input_transformer=events.CfnRule.InputTransformerProperty(
                           input_paths_map={"name": "$.detail.TrainingJobName"},
                           input_template='"Job <name> ended: maskrcnn sagemaker describe <job>"'))])
    with pytest.raises(Exception, match="ValidationFailed"):
        app.synth()
    (report,) = failing_reports(tmp_path)
    assert report["pluginName"] == "cdk-preflight"
    (violation,) = report["violations"]
    assert violation["ruleName"] == "pf-events-input-transformer-placeholders"
    assert "<job>" in violation["description"]
    (construct,) = violation["violatingConstructs"]
    assert construct["constructPath"] == "SageMakerStack/RuleWithAnUndeclaredPlaceholder"


def test_cdk_default_validation_rules_fail_synth():
    """cdk.json turns CDK's default CloudFormation validation rules into errors ("When this flag is
    explicitly set to `true`, violations are treated as errors and will fail synthesis",
    aws-cdk-lib FEATURE_FLAGS.md); the tests synthesize with cdk.json's context."""
    from infra.checks import DEFAULT_RULES_AS_ERRORS

    context = json.loads((REPO_ROOT / "cdk.json").read_text())["context"]
    assert context[DEFAULT_RULES_AS_ERRORS] is True
    assert cdk_json_context()[DEFAULT_RULES_AS_ERRORS] is True


# The deployments whose templates must pass every check: each is synthesized once per session
# (the `synth_of` fixture, shared with the other files that read them), under cdk-nag,
# cdk-preflight in enforce mode and CDK's default rules as errors.
VARIANTS = {
    # p4d.24xlarge with EFA on its 4 cards, FSx for Lustre, a name prefix, an alerts email ...
    "p4d-efa-fsx-prefix": VARIANT_CONTEXT,
    # p5.48xlarge with EFA on its 32 cards in a Capacity Block.
    "p5-efa-capacity-block": P5_CAPACITY_BLOCK,
    # Any open reservation of a resource group (g5.48xlarge, EFA).
    "capacity-reservation-group": G5_RESERVATION_GROUP,
    "spot-workers": SPOT,
    "budget": {"monthly_budget_usd": "500"},
}


@pytest.mark.parametrize("variant", ["default", *VARIANTS])
def test_the_default_deployment_and_its_variants_pass_every_synth_check(synth_of, variant):
    # the synthesis raises on any finding; the variants other files read are synthesized once for all
    synth = synth_of({} if variant == "default" else VARIANTS[variant])
    assert failing_reports(synth.outdir) == []
    assert set(synth.templates) == set(STACKS)


@pytest.mark.parametrize("synth_fixture", ["default_synth", "variant_synth"])
@pytest.mark.parametrize("stack", STACKS)
def test_cfn_lint_finds_no_errors_or_warnings(request, synth_fixture, stack):
    synth = request.getfixturevalue(synth_fixture)
    assert cfn_lint_problems(synth.templates[stack]) == []


@pytest.mark.parametrize("script", sorted(p.name for p in USERDATA_DIR.glob("*.sh")))
def test_boot_scripts_pass_shellcheck(script):
    shellcheck = shutil.which("shellcheck") or str(REPO_ROOT / ".venv" / "bin" / "shellcheck")
    result = subprocess.run([shellcheck, "--severity=style", "--shell=bash", script],
                            cwd=USERDATA_DIR, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout
    assert subprocess.run(["bash", "-n", script], cwd=USERDATA_DIR).returncode == 0
