"""The cluster container's sshd (docker/entrypoint.sh cluster-node, as the boot script's
cluster.env configures it) listens on the node's private address only, never on all addresses.

Run for real: the image's entry script starts the real sshd in a private network and mount
namespace (a dummy interface holds the node's private address, a second interface stands for any
other address of the host; /etc and /run are copies), and `ss` reads what it listens on.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from cdk_synth import REPO_ROOT
from machine import require

ENTRYPOINT = REPO_ROOT / "docker" / "entrypoint.sh"
PRIVATE_IP = "10.0.0.5"
OTHER_IP = "172.17.0.1"     # e.g. docker0 on the same host

@pytest.fixture(autouse=True)
def _needs_a_network_namespace_and_sshd():
    require(None if os.geteuid() == 0 and Path("/usr/sbin/sshd").exists() and shutil.which("ss")
            and subprocess.run(["unshare", "--net", "--mount", "true"], capture_output=True).returncode == 0
            else "needs root, unshare --net --mount, /usr/sbin/sshd and ss")


def _listening(tmp_path: Path, cluster_env: str) -> tuple[list[str], str]:
    cluster_dir = tmp_path / "maskrcnn"
    (cluster_dir / "ssh").mkdir(parents=True)
    (cluster_dir / "cluster.env").write_text(cluster_env)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f",
                    str(cluster_dir / "ssh" / "id_ed25519")], check=True)
    (cluster_dir / "ssh" / "authorized_keys").write_text(
        (cluster_dir / "ssh" / "id_ed25519.pub").read_text())
    (tmp_path / "etc").mkdir()
    subprocess.run(["cp", "-a", "/etc/.", str(tmp_path / "etc")], check=True)
    (tmp_path / "etc" / "MASKRCNN_SANDBOX").touch()
    (tmp_path / "run").mkdir()
    script = f"""
set -e
/usr/bin/mount --bind {tmp_path / 'etc'} /etc
/usr/bin/mount --bind {tmp_path / 'run'} /run
test -e /etc/MASKRCNN_SANDBOX
ip link set lo up
ip link add node0 type veth peer name other0
ip addr add {PRIVATE_IP}/24 dev node0
ip addr add {OTHER_IP}/16 dev other0
ip link set node0 up
ip link set other0 up
# Its own process group: the entry starts sshd in the background and then the Slurm daemons
# (which stop at once here, without a munge key), so the group is what ends sshd too.
MASKRCNN_CLUSTER_DIR={cluster_dir} setsid bash {ENTRYPOINT} cluster-node 2> {tmp_path / 'sshd.log'} &
node=$!
for _ in $(seq 100); do ss -ltnH | grep -q ':2222 ' && break; sleep 0.1; done
ss -ltnH
kill -- -"$node"
"""
    result = subprocess.run(["unshare", "--net", "--mount", "--propagation", "private",
                             "bash", "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return ([line.split()[3] for line in result.stdout.splitlines() if ":2222" in line],
            (tmp_path / "sshd.log").read_text())


def test_sshd_listens_on_the_private_address_only(tmp_path):
    # cluster.env as the boot script leaves it: the user data's lines plus PRIVATE_IP.
    addresses, log = _listening(tmp_path, "STACK_NAME=EfsClusterStack\nSSH_PORT=2222\n"
                                          f"PRIVATE_IP={PRIVATE_IP}\n")
    assert addresses == [f"{PRIVATE_IP}:2222"], log
