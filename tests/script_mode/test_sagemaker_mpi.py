"""script_mode/sagemaker_mpi.py on its own: the job's keys are real OpenSSH keys, installed where sshd,
ssh and paramiko look, with the permissions they insist on; a job without them stops with the fix.
(test_sagemaker_mpi_emulated.py runs it for real under the SDK's MPI driver on 2 emulated hosts.)"""
import subprocess

import pytest

from script_mode import sagemaker_mpi


def _public(private) -> str:
    return subprocess.run(["ssh-keygen", "-y", "-f", str(private)], capture_output=True, text=True,
                          check=True).stdout.split()[1]


def test_job_keys_install_for_root_and_sshd(tmp_path):
    keys = sagemaker_mpi.write_job_keys(tmp_path / "code")
    etc_ssh, root_ssh, run_sshd = tmp_path / "etc/ssh", tmp_path / "root/.ssh", tmp_path / "run/sshd"
    sagemaker_mpi.install_ssh(keys, etc_ssh=etc_ssh, root_ssh=root_ssh, run_sshd=run_sshd)
    host_key, client_key = etc_ssh / "ssh_host_ed25519_key", root_ssh / "id_ed25519"
    assert host_key.stat().st_mode & 0o777 == 0o600 and client_key.stat().st_mode & 0o777 == 0o600
    assert root_ssh.stat().st_mode & 0o777 == 0o700 and run_sshd.is_dir()
    # sshd accepts the job's key for root; ssh finds the job's host key pinned for every algo-N.
    assert (root_ssh / "authorized_keys").read_text().split()[2] == _public(client_key)
    pattern, key_type, key = (root_ssh / "known_hosts").read_text().split()
    assert (pattern, key_type, key) == ("algo-*", "ssh-ed25519", _public(host_key))
    # A second job gets other keys.
    assert _public(sagemaker_mpi.write_job_keys(tmp_path / "other") / "id_ed25519") != _public(client_key)


def test_missing_keys_and_driver_are_named(tmp_path):
    with pytest.raises(SystemExit, match="lacks id_ed25519, id_ed25519.pub.*python -m script_mode.sagemaker_launch"):
        sagemaker_mpi.install_ssh(tmp_path, etc_ssh=tmp_path / "e", root_ssh=tmp_path / "r", run_sshd=tmp_path / "s")
    with pytest.raises(SystemExit, match="ModelTrainer started with an MPI distribution"):
        sagemaker_mpi.driver_path({"SM_DISTRIBUTED_DRIVER_DIR": str(tmp_path)})
