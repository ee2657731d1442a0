"""Multi-host SageMaker training on emulated hosts: 2 hosts x 2 processes, each host running the
image's `train` with SageMaker's own files (tests/emulated_sagemaker.py), the real toolkit, sshd,
mpirun and Horovod over MPI, on CPU with the tiny synthetic preset.
"""
from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

import pytest

from emulated_sagemaker import EFS, Job, addresses, cpu_hyperparameters, write_sagemaker_files
from event_order import out_of_order
from training.data import synthetic

HOSTS = addresses(2)
PROCESSES_PER_HOST = 2
JOB_NAME = "emulated-job"
JOB_TIMEOUT = 600         # far above a normal run: a hang fails the test instead of stalling the suite


def _require_cluster_tools() -> None:
    missing = [t for t in ("mpirun", "orted", "ssh", "ssh-keygen") if not shutil.which(t)]
    missing += [] if Path("/usr/sbin/sshd").exists() else ["/usr/sbin/sshd"]
    if missing:
        pytest.fail(f"{', '.join(missing)} missing: scripts/install.sh installs openssh-server and openmpi-bin")
    import horovod.tensorflow as hvd
    if not hvd.mpi_built():
        pytest.fail("Horovod in the venv is built without MPI: re-run scripts/install.sh")


@pytest.fixture(scope="module")
def efs(tmp_path_factory):
    """The shared file system: a synthetic COCO dataset, the log directory, an empty directory."""
    root = tmp_path_factory.mktemp("efs")
    synthetic.main(["--output", str(root / "data" / "coco"), "--train", "8", "--val", "2", "--size", "128"])
    (root / "logs").mkdir()
    (root / "empty").mkdir()
    return root


def start_job(emulated_hosts, efs: Path, tmp_path: Path, *, images_per_epoch: int = 8,
              train_channels: dict[str, str] | None = None):
    _require_cluster_tools()
    hosts = emulated_hosts(HOSTS, private=["/opt/ml"], shared={EFS: efs})
    hps = cpu_hyperparameters(images_per_epoch=images_per_epoch, processes_per_host=PROCESSES_PER_HOST)
    for host in hosts:
        write_sagemaker_files(host, hosts=list(HOSTS), hyperparameters=hps,
                              train_channel=(train_channels or {}).get(host.name, f"{EFS}/data/coco"))
    return hosts, Job(hosts, job_name=JOB_NAME, logs=tmp_path / "logs")


def wait_all(job: Job, timeout: float) -> dict[str, int]:
    deadline = job.started + timeout
    codes = {name: job.wait(name, deadline=deadline) for name in HOSTS}
    hung = [name for name, code in codes.items() if code is None]
    assert not hung, f"{hung} still running after {timeout} s:\n{job.outputs()}"
    return codes


@pytest.mark.slow
def test_two_hosts_train_and_the_leader_exports_the_model(emulated_hosts, efs, tmp_path):
    hosts, job = start_job(emulated_hosts, efs, tmp_path)
    codes = wait_all(job, JOB_TIMEOUT)
    assert codes == {"algo-1": 0, "algo-2": 0}, job.outputs()
    leader = job.log("algo-1")
    assert f"training on {len(HOSTS) * PROCESSES_PER_HOST} rank(s)" in leader, leader[-3000:]
    # The toolkit tags each rank's lines with its host: ranks 2 and 3 ran on algo-2.
    assert "mpirank:3,algo-2" in leader, leader[-3000:]
    assert re.search(r"step 1/1 ", leader), leader[-3000:]   # 8 images = 1 step of 4 ranks x 2 images
    model = sorted(p.name for p in hosts["algo-1"].path("/opt/ml/model").iterdir())
    assert "checkpoint" in model and "config.json" in model and any(n.endswith(".index") for n in model)
    for host in hosts:
        assert host.path("/opt/ml/output/success").exists(), host.name
        assert not host.path("/opt/ml/output/failure").exists(), host.name
    assert (efs / "logs" / JOB_NAME / "checkpoint").exists()
    shared = efs / "logs" / ".jobs" / JOB_NAME
    assert json.loads((shared / "outcome.json").read_text())["ok"] is True
    assert not (shared / "id_rsa").exists()     # the job's private key does not outlive the job
    # The job ends once training has. The leader: the toolkit's mpirun command, training, the
    # export, the outcome for the other hosts, and not the ending of the toolkit's MasterRunner.run
    # (a status file on each other host, then a fixed 30 s sleep, billed on every instance). The
    # worker: it exits on the leader's outcome.
    problem = out_of_order(leader, [r"Invoking script with the following command:", r"<stdout>:.*\bstep 1/1 ",
                                    r"^\[entry\] model in ",
                                    r"^\[entry\] the job's outcome \(succeeded\) is in .*: the other hosts exit"])
    assert problem is None, problem
    assert "status file" not in leader, leader[-3000:]
    assert "[entry] the leader algo-1 reports the job succeeded" in job.log("algo-2"), job.log("algo-2")[-3000:]
    # A backstop only (generous for a loaded machine): the events above are the check.
    trained = (efs / "logs" / JOB_NAME / "eval_results.json").stat().st_mtime
    lingered = (shared / "outcome.json").stat().st_mtime - trained
    assert lingered < 120, f"the leader exited {lingered:.0f} s after training ended"


@pytest.mark.slow
def test_a_failing_rank_on_the_other_host_fails_every_host(emulated_hosts, efs, tmp_path):
    # algo-2's train channel is empty (as if its file system mount were wrong): its ranks fail at once.
    hosts, job = start_job(emulated_hosts, efs, tmp_path, train_channels={"algo-2": f"{EFS}/empty"})
    codes = wait_all(job, 300)
    assert codes["algo-1"] != 0 and codes["algo-2"] != 0, job.outputs()
    failure = hosts["algo-1"].path("/opt/ml/output/failure").read_text()
    assert failure.startswith("training failed on the cluster"), failure[:2000]
    # The cause first (algo-2's ranks' error), not its consequences on other ranks.
    assert "error: no annotation file for split 'train2017'" in failure.splitlines()[0], failure[:2000]
    assert re.search(r"algo-2\]<stderr>:error: no annotation file", failure), failure[:3000]
    worker_failure = hosts["algo-2"].path("/opt/ml/output/failure").read_text()
    assert worker_failure.startswith("the job failed (reported by the leader algo-1): training failed"), \
        worker_failure[:2000]
    for host in hosts:
        assert not host.path("/opt/ml/output/success").exists(), host.name


@pytest.mark.slow
def test_a_worker_host_that_dies_ends_the_job(emulated_hosts, efs, tmp_path):
    # algo-2 vanishes once all 4 ranks have joined the job (before the first step: cheaper, and the
    # ranks meet in collectives from here on): its link drops, no TCP reset comes back.
    hosts, job = start_job(emulated_hosts, efs, tmp_path, images_per_epoch=4000)
    assert job.wait_for_output("algo-1", r"training on 4 rank\(s\)", deadline=job.started + JOB_TIMEOUT), \
        job.outputs()
    hosts["algo-2"].disconnect()
    lost = time.time()
    # The keepalives on the leader's connections to algo-2 (about 25 s, then mpirun ends the job)
    # against Open MPI's default of 8 minutes: 180 s, generous for a loaded machine, tells them apart.
    code = job.wait("algo-1", deadline=lost + 180)
    ended_after = time.time() - lost
    hosts["algo-2"].stop()    # SageMaker stops the other instances of a failed job
    assert code is not None and code != 0, f"still running {ended_after:.0f} s after algo-2 vanished\n{job.outputs()}"
    print(f"the leader ended the job {ended_after:.0f} s after algo-2 vanished")
    assert hosts["algo-1"].path("/opt/ml/output/failure").read_text().startswith("training failed on the cluster")
    problem = out_of_order(job.log("algo-1"), [r"training on 4 rank\(s\)",
                                               r"^\[entry\] the job's outcome \(failed\) is in ",
                                               r"^\[entry\] FAILED: training failed on the cluster"])
    assert problem is None, problem
