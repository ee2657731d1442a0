"""Script mode's horovod strategy on 2 emulated hosts (tests/emulated_hosts.py), run the way SageMaker
runs the job ModelTrainer (sagemaker 3.x) creates with the project's image.

The job is built by examples/script_mode/sagemaker_launch.py against moto, and the request moto received is
played out on hosts algo-1 and algo-2: every channel of InputDataConfig is copied from moto's S3 into
each host's /opt/ml/input/data/<channel>, /opt/ml/input/config holds the resource, data and
hyperparameter files SageMaker writes, and each host runs the request's ContainerEntrypoint +
ContainerArguments (which replace the image's entry) with its Environment. From there it is the SDK's
own sm_train.sh and MPI driver (sshd, waiting for the other host over SSH, mpirun over both, status
files) and the real Horovod over MPI: script_mode/train.py trains on both hosts as 2 ranks.
"""
import json
import sys
from pathlib import Path

import boto3
import pytest

from script_mode import sagemaker_launch as launcher
from script_mode.sagemaker_launch import ScriptModeJob
from script_mode import data as digits_data

from aws_fakes import BUCKET, capture_requests, deploy_stack

HOSTS = {"algo-1": "10.77.31.11", "algo-2": "10.77.31.12"}
# The SDK's MPI driver (shipped in the job's sm_drivers channel) polls: the hosts for each other every
# 5 s, the worker for the leader's "done" file every 30 s. The waits are what this test runs, their
# periods only cost time here (up to ~40 s a run): this job's copy of the driver polls every second.
DRIVER_POLLS = {"time.sleep(5)": 3, "time.sleep(30)": 1}


def _download(s3, uri: str, into: Path) -> None:
    bucket, _, prefix = uri[len("s3://"):].partition("/")
    for obj in s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", []):
        target = into / obj["Key"][len(prefix):].lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(s3.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read())


def _poll_every_second(host) -> None:
    driver = host.path("/opt/ml/input/data/sm_drivers/distributed_drivers/mpi_utils.py")
    code = driver.read_text()
    for call, count in DRIVER_POLLS.items():
        # the SDK's driver changed if these are not as expected: look at its waits again
        assert code.count(call) == count, f"{driver.name}: {code.count(call)} x {call}, expected {count}"
        code = code.replace(call, "time.sleep(1)")
    driver.write_text(code)


def _provision(host, request: dict, s3) -> None:
    """What SageMaker puts in a training container's /opt/ml before starting it."""
    for channel in request["InputDataConfig"]:
        _download(s3, channel["DataSource"]["S3DataSource"]["S3Uri"],
                  host.path(f"/opt/ml/input/data/{channel['ChannelName']}"))
    config = host.path("/opt/ml/input/config")
    config.mkdir(parents=True)
    instance_type = request["ResourceConfig"]["InstanceType"]
    (config / "resourceconfig.json").write_text(json.dumps({
        "current_host": host.name, "current_instance_type": instance_type,
        "current_group_name": "homogeneousCluster", "hosts": sorted(HOSTS),
        "instance_groups": [{"instance_group_name": "homogeneousCluster", "instance_type": instance_type,
                             "hosts": sorted(HOSTS)}],
        "network_interface_name": "eth0"}))
    (config / "inputdataconfig.json").write_text(json.dumps({
        c["ChannelName"]: {"TrainingInputMode": "File", "S3DistributionType": "FullyReplicated",
                           "RecordWrapperType": "None"} for c in request["InputDataConfig"]}))
    (config / "hyperparameters.json").write_text(json.dumps(request["HyperParameters"]))
    for folder in ("/opt/ml/model", "/opt/ml/output/data", "/opt/ml/checkpoints"):
        host.path(folder).mkdir(parents=True)


@pytest.mark.slow
def test_horovod_job_runs_on_two_hosts_under_the_sdks_mpi_driver(emulated_hosts, sagemaker_env, tmp_path):
    session = boto3.session.Session()
    s3 = session.client("s3")
    s3.create_bucket(Bucket=BUCKET)
    deploy_stack(session)
    # A small training channel: one epoch is a few seconds on 2 ranks.
    digits_data.ensure(tmp_path / "data" / digits_data.DATA_FILE, n_train=2000, n_test=500)
    sent = capture_requests(session)
    launcher.start(ScriptModeJob(strategy="horovod", instance_count=2, data=str(tmp_path / "data"),
                                 hyperparameters={"epochs": 1}), session=session)
    request = sent[0]
    spec = request["AlgorithmSpecification"]

    hosts = emulated_hosts(HOSTS, private=["/opt/ml"])
    env = {**request["Environment"], "TRAINING_JOB_NAME": request["TrainingJobName"], "HOME": "/root",
           "LANG": "C.UTF-8", "PYTHONUNBUFFERED": "1",
           # The image's Python (with pip, as sm_train.sh requires) first on PATH.
           "PATH": f"{Path(sys.executable).parent}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
    procs, logs = {}, {}
    for host in hosts:
        _provision(host, request, s3)
        _poll_every_second(host)
        logs[host.name] = open(tmp_path / f"{host.name}.log", "w")
        procs[host.name] = host.popen([*spec["ContainerEntrypoint"], *spec["ContainerArguments"]], env=env,
                                      stdout=logs[host.name], stderr=logs[host.name], stop_host_on_exit=True)
    try:
        rc = {"algo-1": procs["algo-1"].wait(timeout=600)}
        # The worker polls for the master's "done" file (the SDK's driver), then exits.
        rc["algo-2"] = procs["algo-2"].wait(timeout=120)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
        for log in logs.values():
            log.close()
    out = {name: (tmp_path / f"{name}.log").read_text() for name in HOSTS}
    assert rc == {"algo-1": 0, "algo-2": 0}, out["algo-1"][-6000:] + "\n----- algo-2\n" + out["algo-2"][-3000:]
    one, two = hosts["algo-1"], hosts["algo-2"]
    assert "the job's SSH keys are installed" in out["algo-1"] and "the job's SSH keys are installed" in out["algo-2"]
    # The SDK's driver ran mpirun with the project's Open MPI parameters: waiting ranks yield their core.
    mpirun = [line for line in out["algo-1"].splitlines() if "Executing command: mpirun" in line]
    assert mpirun and "-mca mpi_yield_when_idle 1" in mpirun[0], out["algo-1"][-3000:]
    # The driver's handshake over SSH: algo-2 reported ready to algo-1, algo-1 told algo-2 it is done.
    assert one.path("/tmp/ready.algo-2").exists() and two.path("/tmp/done.algo-1").exists()
    metrics = json.loads(one.path("/opt/ml/model/metrics.json").read_text())
    assert metrics["strategy"] == "horovod" and metrics["workers"] == 2  # one rank on each host
    assert one.path("/opt/ml/model/1/saved_model.pb").exists()
    assert not one.path("/opt/ml/output/failure").exists() and not two.path("/opt/ml/output/failure").exists()
