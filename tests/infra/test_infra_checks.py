"""Static checks on what synth produces: cdk-nag's AWS Solutions pack (zero unacknowledged
findings), cfn-lint (zero errors and warnings) and shellcheck on the boot scripts."""
from __future__ import annotations

import json
import subprocess
import shutil
from pathlib import Path

import pytest
from cfnlint.api import ManualArgs, lint

from infra import outputs
from infra.userdata import USERDATA_DIR

from cdk_synth import REPO_ROOT, cdk_json_context, load_app_module

STACKS = (outputs.NETWORK_STORAGE_STACK, outputs.EFS_CLUSTER_STACK, outputs.SAGEMAKER_STACK)


def failing_reports(outdir: Path) -> list[dict]:
    report = json.loads((outdir / "validation-report.json").read_text())
    return [r for r in report["pluginReports"] if r.get("conclusion") != "success"]


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


@pytest.mark.parametrize("synth_fixture", ["default_synth", "variant_synth"])
@pytest.mark.parametrize("stack", STACKS)
def test_cfn_lint_finds_no_errors_or_warnings(request, synth_fixture, stack):
    synth = request.getfixturevalue(synth_fixture)
    matches = lint(json.dumps(synth.templates[stack]),
                   config=ManualArgs(regions=["us-east-1", "eu-west-1"]))
    problems = [f"{m.rule.id}: {m.message}" for m in matches if m.rule.id[0] in "EW"]
    assert problems == []


@pytest.mark.parametrize("script", sorted(p.name for p in USERDATA_DIR.glob("*.sh")))
def test_boot_scripts_pass_shellcheck(script):
    shellcheck = shutil.which("shellcheck") or str(REPO_ROOT / ".venv" / "bin" / "shellcheck")
    result = subprocess.run([shellcheck, "--severity=style", "--shell=bash", script],
                            cwd=USERDATA_DIR, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout
    assert subprocess.run(["bash", "-n", script], cwd=USERDATA_DIR).returncode == 0
