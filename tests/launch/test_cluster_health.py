"""Health checks run for real against this machine (LocalRunner) and over real ssh to a closed port.

What a cluster node has and this machine lacks is stood in for locally: an `nvidia-smi` on PATH that
lists GPUs, and a temporary folder as the EFS mount. tests/launch/test_cluster_emulated.py runs the
same checks over SSH on emulated hosts.
"""
import sys

import pytest

from launch.cluster import health
from launch.cluster.health import LocalRunner, SshRunner, check_cluster, check_node, efs_marker, format_table
from launch.code_version import code_version


@pytest.fixture
def fake_gpus(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "nvidia-smi"
    script.write_text("#!/bin/sh\n[ \"$1\" = -L ] || exit 2\n"
                      "echo 'GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-0)'\n"
                      "echo 'GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-1)'\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{__import__('os').environ['PATH']}")


def test_healthy_node(fake_gpus, tmp_path):
    with efs_marker(str(tmp_path)) as marker:
        h = check_node(LocalRunner(), "localhost", role="master", expected_gpus=2, efs_mount=str(tmp_path),
                       efs_marker=marker, expected_code_version=code_version(), python=sys.executable)
        assert marker.is_file()
    assert not marker.exists()  # the master cleans up after the check
    assert h.healthy, h.problems
    assert (h.reachable, h.gpus_visible, h.efs_mounted, h.code_version) == (True, 2, True, code_version())


def test_problems_are_named(fake_gpus, tmp_path):
    # The master's marker is not where this node looks: its /efs is not the master's EFS.
    h = check_node(LocalRunner(), "localhost", expected_gpus=8, efs_mount="/efs",
                   efs_marker=tmp_path / "elsewhere" / "marker",
                   expected_code_version="0123456789ab", python=sys.executable)
    assert not h.healthy
    assert h.problems == ["2 of 8 GPUs visible",
                          "/efs does not show the master's EFS (not mounted, or another file system)",
                          f"code {code_version()} differs from master's 0123456789ab"]


def test_no_gpu_driver_means_zero_gpus(tmp_path, monkeypatch):
    (tmp_path / "true").symlink_to(__import__("shutil").which("true"))
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi, no test: both checks fail, not crash
    h = check_node(LocalRunner(), "localhost", expected_gpus=1, efs_mount="/", efs_marker="/nonexistent",
                   python=sys.executable)
    assert h.gpus_visible == 0
    assert "0 of 1 GPUs visible" in h.problems
    assert h.efs_mounted is False


def test_unreachable_node_over_ssh(tmp_path):
    with __import__("socket").socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    key = tmp_path / "id_ed25519"
    key.write_text("")
    h = check_node(SshRunner(port=port, key=str(key)), "127.0.0.1", expected_gpus=8)
    assert not h.reachable and h.gpus_visible is None
    assert h.problems[0].startswith("unreachable")


def test_table_shows_each_node(fake_gpus, tmp_path):
    results = check_cluster(LocalRunner(), [("10.0.0.4", "master", 2), ("10.0.0.5", "worker", 4)],
                            expected_code_version=code_version(), efs_mount=str(tmp_path), python=sys.executable)
    table = format_table(results)
    lines = table.splitlines()
    assert lines[0].split() == ["NODE", "ROLE", "REACHABLE", "GPUS", "EFS", "CODE", "STATUS"]
    assert lines[1].split()[:6] == ["10.0.0.4", "master", "yes", "2/2", "yes", code_version()]
    assert lines[1].endswith("ok")
    assert "2 of 4 GPUs visible" in lines[2]
    assert lines[-1] == "1 of 2 nodes healthy"
    assert list((tmp_path / health.MARKER_DIR).iterdir()) == []
