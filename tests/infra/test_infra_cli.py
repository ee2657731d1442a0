"""The real CDK CLI (pinned in package.json, installed by scripts/install.sh) synthesizes the app
from the repository root with no AWS credentials, and reports bad context in one line."""
from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from infra import outputs

from cdk_synth import REPO_ROOT

STACKS = (outputs.NETWORK_STORAGE_STACK, outputs.EFS_CLUSTER_STACK, outputs.SAGEMAKER_STACK)


def run_cdk(*args: str, outdir) -> subprocess.CompletedProcess:
    assert (REPO_ROOT / "node_modules" / ".bin" / "cdk").exists(), \
        "the CDK CLI is missing: run scripts/install.sh (make install)"
    assert shutil.which("npx"), "Node.js (npx) is needed for the CDK CLI"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("AWS_") and k not in ("CDK_DEFAULT_ACCOUNT", "CDK_DEFAULT_REGION")}
    env.update(AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull,
               JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION="20")
    # --no: never download a CLI; use the pinned one in node_modules.
    return subprocess.run(["npx", "--no", "cdk", "synth", "--quiet", "-o", str(outdir), *args],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_cdk_synth_all_stacks_without_credentials(tmp_path):
    result = run_cdk(outdir=tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    for stack in STACKS:
        template = json.loads((tmp_path / f"{stack}.template.json").read_text())
        assert template["Resources"]
    assert "WARNING" not in result.stderr and "Error" not in result.stderr, result.stderr


@pytest.mark.slow
def test_cdk_synth_stops_on_bad_context_with_a_one_line_message(tmp_path):
    result = run_cdk("-c", "worker_count=-1", outdir=tmp_path)
    assert result.returncode != 0
    assert ("error: context key 'worker_count' is -1; allowed: a whole number from 0 to 64"
            in result.stderr)
    assert "Traceback" not in result.stderr
    assert not list(tmp_path.glob("*.template.json"))
