"""The notebook's on-start lifecycle script (infra/userdata/notebook_on_start.sh), run for real as
the stack renders it (infra.constructs.notebook.on_start_script: the settings and the idle check
prepended), in a private mount namespace whose /home, /usr/local/sbin and /etc/systemd/system are
scratch directories. Stood in for: mount, mountpoint, dnf, chown (there is no ec2-user here),
systemctl (no systemd here), the AWS CLI's download of the project asset (a zip made here from the
real notebooks/ folder) and, in one case, the EFS mount helper."""
from __future__ import annotations

import configparser
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from infra.constructs.notebook import IDLE_STOP_SCRIPT, on_start_script

from cdk_synth import REPO_ROOT
from machine import require

@pytest.fixture(autouse=True)
def _needs_a_mount_namespace():
    require(None if os.geteuid() == 0 and shutil.which("unshare")
            and subprocess.run(["unshare", "--mount", "true"], capture_output=True).returncode == 0
            else "needs root and unshare --mount")

STUBS = {
    "mount": 'echo "mount $*" >> "$CALLS"; mkdir -p "$MOUNTED"',
    "mountpoint": '[ -d "$MOUNTED" ]',
    "dnf": 'echo "dnf $*" >> "$CALLS"; exit 1',     # no repository reachable
    "chown": 'echo "chown $*" >> "$CALLS"',
    "systemctl": 'echo "systemctl $*" >> "$CALLS"',
    "aws": 'echo "aws $*" >> "$CALLS"; cp "$PROJECT_ZIP" "${*: -1}"',
}
ASSET_URL = "s3://cdk-hnb659fds-assets-123456789012-eu-west-1/0123abcd.zip"
JUPYTER_ROOT = "home/ec2-user/SageMaker"


# Where the script installs the idle check; each is a scratch directory in the namespace.
SYSTEM_DIRS = ("usr/local/sbin", "usr/local/bin", "etc/systemd/system")


def _run(tmp_path: Path, *, with_helper: bool, starts: int = 1, idle_minutes: int = 60,
         stack_name: str = "SageMakerStack", stubs_over: dict[str, str] | None = None, then: str | None = None) -> list[str]:
    """Runs the script ``starts`` times, then (in the same namespace) the shell command ``then``,
    whose output goes to tmp_path/then.out; returns the stubs' calls."""
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    with zipfile.ZipFile(tmp_path / "project.zip", "w") as archive:
        for path in (REPO_ROOT / "notebooks").iterdir():
            archive.write(path, f"notebooks/{path.name}")
        archive.write(REPO_ROOT / "README.md", "README.md")
        for module in ("launch/__init__.py", "launch/cli.py", "launch/deployment.py", "launch/aws.py",
                       "launch/cluster/__init__.py", "launch/cluster/node_env.py",
                       "infra/__init__.py", "infra/outputs.py", "infra/node_contract.py"):
            archive.write(REPO_ROOT / module, module)
    for name, body in {**STUBS, **({"mount.efs": "exit 0"} if with_helper else {}),
                       **(stubs_over or {})}.items():
        (stubs / name).write_text("#!/bin/bash\n" + textwrap.dedent(body) + "\n")
        (stubs / name).chmod(0o755)
    script = tmp_path / "on-start.sh"
    script.write_text("".join(on_start_script(
        file_system_id="fs-0123456789abcdef0", region="eu-west-1", project_code_url=ASSET_URL,
        stack_name=stack_name, idle_minutes=idle_minutes)))
    (tmp_path / JUPYTER_ROOT).mkdir(parents=True)      # SageMaker's persistent volume
    binds = [f"/usr/bin/mount --bind {tmp_path / 'home'} /home"]
    for directory in SYSTEM_DIRS:
        (tmp_path / directory).mkdir(parents=True)
        binds.append(f"/usr/bin/mount --bind {tmp_path / directory} /{directory}")
    env = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}",
           "CALLS": str(tmp_path / "calls.log"), "MOUNTED": str(tmp_path / "mounted"),
           "PROJECT_ZIP": str(tmp_path / "project.zip")}
    for start in range(starts):
        last = start == starts - 1 and then
        result = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "bash", "-c",
             " && ".join(binds + [f"bash {script}", *([f"({then}) > {tmp_path / 'then.out'}"] if last else [])])],
            env=env, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        (tmp_path / "stderr.log").write_text(result.stderr)
    assert (tmp_path / "home" / "ec2-user" / "efs").is_dir()
    return (tmp_path / "calls.log").read_text().splitlines()


def _unit(path: Path) -> configparser.ConfigParser:
    unit = configparser.ConfigParser(interpolation=None)
    unit.optionxform = str      # systemd's keys are case-sensitive
    unit.read_string(path.read_text())
    return unit


def test_opens_ready_to_use_with_the_project_and_efs_in_the_jupyter_root(tmp_path):
    calls = _run(tmp_path, with_helper=True, starts=2)
    root = tmp_path / JUPYTER_ROOT
    assert (root / "maskrcnn-on-aws" / "notebooks" / "sagemaker_training.ipynb").read_bytes() == (
        REPO_ROOT / "notebooks" / "sagemaker_training.ipynb").read_bytes()
    assert (root / "maskrcnn-on-aws" / "README.md").exists()
    assert os.readlink(root / "efs") == "/home/ec2-user/efs"
    # Downloaded and handed to the notebook user once: the second start keeps the user's edits.
    downloads = [c for c in calls if c.startswith("aws ")]
    assert len(downloads) == 1 and downloads[0].startswith(f"aws s3 cp --only-show-errors {ASSET_URL} ")
    assert "chown -R ec2-user:ec2-user /home/ec2-user/SageMaker/maskrcnn-on-aws" in calls


def test_a_terminal_has_the_project_s_command(tmp_path):
    """`maskrcnn` runs launch/cli.py from the unpacked project with the terminal's python3, from
    any directory, and keeps the terminal's own PYTHONPATH after it."""
    _run(tmp_path, with_helper=True, then="cd / && PYTHONPATH=/elsewhere /usr/local/bin/maskrcnn --help")
    assert (tmp_path / "then.out").read_text().startswith("usage: maskrcnn COMMAND")
    wrapper = (tmp_path / "usr/local/bin/maskrcnn").read_text()
    assert 'PYTHONPATH="/home/ec2-user/SageMaker/maskrcnn-on-aws${PYTHONPATH:+:$PYTHONPATH}"' in wrapper


def test_the_projects_commands_find_the_deployments_stacks_from_the_notebooks(tmp_path):
    """A deployment with a name prefix names its stacks `<prefix>-<id>`: the script records the
    notebook's stack, from which the project's commands (launch/deployment.py), run from the
    unpacked project, take the prefix of the other stacks too."""
    code = tmp_path / JUPYTER_ROOT / "maskrcnn-on-aws"
    _run(tmp_path, with_helper=True, stack_name="team-a-SageMakerStack",
         then=f"cd / && PYTHONPATH={code} {sys.executable} -c 'from launch import deployment; "
              f"print(deployment.stack_name(\"SageMakerStack\"), deployment.stack_name(\"NetworkStorageStack\"))'")
    assert (tmp_path / "then.out").read_text().split() == ["team-a-SageMakerStack", "team-a-NetworkStorageStack"]
    assert (tmp_path / JUPYTER_ROOT / ".maskrcnn-stack").read_text() == "team-a-SageMakerStack\n"


def test_mounts_with_tls_when_the_efs_mount_helper_is_there(tmp_path):
    calls = [c for c in _run(tmp_path, with_helper=True) if c.startswith(("mount", "dnf"))]
    assert calls[0] == "mount -t efs -o tls fs-0123456789abcdef0:/ /home/ec2-user/efs"
    assert not [c for c in calls if c.startswith("dnf")]


def test_falls_back_to_nfs_when_the_helper_cannot_be_installed(tmp_path):
    calls = [c for c in _run(tmp_path, with_helper=False) if c.startswith(("mount", "dnf"))]
    assert calls[0] == "dnf install -y -q amazon-efs-utils"
    assert calls[1] == (
        "mount -t nfs4 -o nfsvers=4.1,rsize=1048576,wsize=1048576,hard,timeo=600,retrans=2,"
        "noresvport fs-0123456789abcdef0.efs.eu-west-1.amazonaws.com:/ /home/ec2-user/efs")


def test_installs_the_idle_stop_with_the_configured_minutes(tmp_path):
    calls = _run(tmp_path, with_helper=True, idle_minutes=45)
    installed = tmp_path / "usr/local/sbin/notebook-idle-stop"
    assert installed.read_text() == IDLE_STOP_SCRIPT.read_text()
    assert installed.stat().st_mode & 0o777 == 0o755
    units = tmp_path / "etc/systemd/system"
    service = _unit(units / "notebook-idle-stop.service")
    assert dict(service["Service"]) == {
        "Type": "oneshot", "User": "ec2-user",
        "ExecStart": "/usr/bin/python3 /usr/local/sbin/notebook-idle-stop --idle-minutes 45"}
    timer = _unit(units / "notebook-idle-stop.timer")
    assert dict(timer["Timer"]) == {"OnActiveSec": "5min", "OnUnitActiveSec": "5min"}
    assert timer["Install"]["WantedBy"] == "timers.target"
    assert [c for c in calls if c.startswith("systemctl")] == [
        "systemctl daemon-reload", "systemctl enable --now notebook-idle-stop.timer"]


def test_no_idle_stop_when_its_minutes_are_0(tmp_path):
    calls = _run(tmp_path, with_helper=True, idle_minutes=0)
    for directory in ("usr/local/sbin", "etc/systemd/system"):      # where the idle stop goes
        assert not list((tmp_path / directory).iterdir())
    assert not [c for c in calls if c.startswith("systemctl")]


def test_a_timer_that_cannot_start_does_not_keep_the_notebook_from_starting(tmp_path):
    calls = _run(tmp_path, with_helper=True, idle_minutes=45,
                 stubs_over={"systemctl": 'echo "systemctl $*" >> "$CALLS"; exit 1'})
    assert "systemctl daemon-reload" in calls
    assert "this notebook will not stop when idle" in (tmp_path / "stderr.log").read_text()
    assert [c for c in calls if c.startswith("mount")]      # the start went on to the EFS mount
