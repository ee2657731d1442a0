"""SageMaker entry for the horovod strategy: SSH between the job's instances, then the SDK's MPI driver.

With an MPI distribution, ModelTrainer (sagemaker 3.x) replaces the image's entry point: every
instance runs the SDK's ``sm_train.sh``, which runs its ``mpi_driver.py``. That driver starts
``/usr/sbin/sshd`` and reaches the other instances over SSH (paramiko, ``ssh``, then ``mpirun``) as
root, but brings no keys, and the training image ships none (host keys are never baked into an
image): sshd without a host key exits at once, and root has no identity the others accept, so the
instances never connect ("Timed out waiting for workers to be reachable").

The launcher (examples/script_mode/sagemaker_launch.py) makes a key pair and a host key for each job
(:func:`write_job_keys`) and stages them with the code, in ``job_ssh/``; it names this module as the
job's command. Run on every instance in the driver's place, it installs them:

- ``/etc/ssh/ssh_host_ed25519_key``: the job's host key, the same on every instance, which
- ``/root/.ssh/known_hosts`` pins for ``algo-*`` (host key checking stays on for ``ssh`` and mpirun);
- ``/root/.ssh/id_ed25519`` and ``authorized_keys``: the job's key, valid only inside this job's
  instances (nothing outside the job's security group reaches their sshd, and they end with it);

and then executes the SDK's driver unchanged.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

JOB_SSH_DIR = "job_ssh"            # next to the script_mode package in the job's code channel
CLIENT_KEY = "id_ed25519"
HOST_KEY = "ssh_host_ed25519_key"
HOST_PATTERN = "algo-*"            # SageMaker's names for a job's instances
DRIVER = "mpi_driver.py"
KEY_OPTIONS = "no-agent-forwarding,no-port-forwarding,no-X11-forwarding"


def write_job_keys(into: Path) -> Path:
    """A fresh key pair and host key for one job in ``into/job_ssh`` (OpenSSH formats)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    out = Path(into) / JOB_SSH_DIR
    out.mkdir(mode=0o700, parents=True)
    for name in (CLIENT_KEY, HOST_KEY):
        key = Ed25519PrivateKey.generate()
        private = out / name
        private.touch(mode=0o600)
        private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                              serialization.NoEncryption()))
        public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        (out / f"{name}.pub").write_bytes(public + b" maskrcnn-script-mode-job\n")
    return out


def _write(path: Path, data: bytes, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def install_ssh(keys: Path, *, etc_ssh: Path = Path("/etc/ssh"), root_ssh: Path = Path("/root/.ssh"),
                run_sshd: Path = Path("/run/sshd")) -> None:
    """Install the job's host key and root's key from ``keys`` (the staged ``job_ssh`` folder)."""
    missing = [n for n in (CLIENT_KEY, f"{CLIENT_KEY}.pub", HOST_KEY, f"{HOST_KEY}.pub") if not (keys / n).is_file()]
    if missing:
        raise SystemExit(f"error: {keys} lacks {', '.join(missing)}: start the job with "
                         f"python -m script_mode.sagemaker_launch, which stages the job's SSH keys with the code")
    client_pub = (keys / f"{CLIENT_KEY}.pub").read_text().strip()
    host_pub = (keys / f"{HOST_KEY}.pub").read_text().strip()
    _write(etc_ssh / HOST_KEY, (keys / HOST_KEY).read_bytes(), 0o600)
    _write(etc_ssh / f"{HOST_KEY}.pub", (host_pub + "\n").encode(), 0o644)
    root_ssh.mkdir(mode=0o700, parents=True, exist_ok=True)
    root_ssh.chmod(0o700)
    _write(root_ssh / CLIENT_KEY, (keys / CLIENT_KEY).read_bytes(), 0o600)
    _write(root_ssh / f"{CLIENT_KEY}.pub", (client_pub + "\n").encode(), 0o644)
    _write(root_ssh / "authorized_keys", f"{KEY_OPTIONS} {client_pub}\n".encode(), 0o600)
    # Only the key type and key: the comment field is not part of a known_hosts entry.
    _write(root_ssh / "known_hosts", f"{HOST_PATTERN} {' '.join(host_pub.split()[:2])}\n".encode(), 0o644)
    run_sshd.mkdir(parents=True, exist_ok=True)  # sshd's privilege-separation directory


def driver_path(environ=os.environ) -> Path:
    """The SDK's MPI driver, from the variables its sm_train.sh exported."""
    directory = environ.get("SM_DISTRIBUTED_DRIVER_DIR")
    if not directory or not (Path(directory) / DRIVER).is_file():
        raise SystemExit("error: SM_DISTRIBUTED_DRIVER_DIR does not hold the SDK's mpi_driver.py: this command "
                         "runs inside a SageMaker job that ModelTrainer started with an MPI distribution")
    return Path(directory) / DRIVER


def main() -> int:
    driver = driver_path()
    install_ssh(Path(__file__).resolve().parent.parent / JOB_SSH_DIR)
    print(f"sagemaker_mpi: the job's SSH keys are installed; running {driver}", flush=True)
    os.execv(sys.executable, [sys.executable, str(driver)])
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
