"""The notebook's on-start lifecycle script (infra/userdata/notebook_on_start.sh), run for real as
the stack renders it (FILE_SYSTEM_ID and AWS_REGION prepended), in a private mount namespace whose
/home is a scratch directory. Stood in for: mount, mountpoint, dnf, chown (there is no ec2-user
here) and, in one case, the EFS mount helper."""
from __future__ import annotations

import os
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from infra.userdata import NOTEBOOK_ON_START_SCRIPT, script_body

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("unshare")
    or subprocess.run(["unshare", "--mount", "true"], capture_output=True).returncode,
    reason="needs root and unshare --mount")

STUBS = {
    "mount": 'echo "mount $*" >> "$CALLS"; mkdir -p "$MOUNTED"',
    "mountpoint": '[ -d "$MOUNTED" ]',
    "dnf": 'echo "dnf $*" >> "$CALLS"; exit 1',     # no repository reachable
    "chown": 'echo "chown $*" >> "$CALLS"',
}


def _run(tmp_path: Path, *, with_helper: bool) -> list[str]:
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    for name, body in {**STUBS, **({"mount.efs": "exit 0"} if with_helper else {})}.items():
        (stubs / name).write_text("#!/bin/bash\n" + textwrap.dedent(body) + "\n")
        (stubs / name).chmod(0o755)
    script = tmp_path / "on-start.sh"
    script.write_text("#!/bin/bash\nexport FILE_SYSTEM_ID=fs-0123456789abcdef0\n"
                      "export AWS_REGION=eu-west-1\n" + script_body(NOTEBOOK_ON_START_SCRIPT))
    (tmp_path / "home").mkdir()
    env = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}",
           "CALLS": str(tmp_path / "calls.log"), "MOUNTED": str(tmp_path / "mounted")}
    result = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "bash", "-c",
         f"/usr/bin/mount --bind {tmp_path / 'home'} /home && exec bash {script}"],
        env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "home" / "ec2-user" / "efs").is_dir()
    return (tmp_path / "calls.log").read_text().splitlines()


def test_mounts_with_tls_when_the_efs_mount_helper_is_there(tmp_path):
    calls = _run(tmp_path, with_helper=True)
    assert calls[0] == "mount -t efs -o tls fs-0123456789abcdef0:/ /home/ec2-user/efs"
    assert not [c for c in calls if c.startswith("dnf")]


def test_falls_back_to_nfs_when_the_helper_cannot_be_installed(tmp_path):
    calls = _run(tmp_path, with_helper=False)
    assert calls[0] == "dnf install -y -q amazon-efs-utils"
    assert calls[1] == (
        "mount -t nfs4 -o nfsvers=4.1,rsize=1048576,wsize=1048576,hard,timeo=600,retrans=2,"
        "noresvport fs-0123456789abcdef0.efs.eu-west-1.amazonaws.com:/ /home/ec2-user/efs")
