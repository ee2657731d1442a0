"""examples/script_mode/sagemaker_launch.py against a moto server: the CreateTrainingJob request that
reaches it, and the code/driver files ModelTrainer staged in the stack's bucket."""
import json
import tempfile
from pathlib import Path

import boto3
import pytest

from infra import outputs
from script_mode import sagemaker_launch as launcher
from script_mode.sagemaker_launch import ScriptModeJob
from script_mode import data as digits_data

from aws_fakes import BUCKET, STACK_OUTPUTS, capture_requests, deploy_stack

VPC = {"SecurityGroupIds": [STACK_OUTPUTS[outputs.TRAINING_SECURITY_GROUP_ID]],
       "Subnets": STACK_OUTPUTS[outputs.PRIVATE_SUBNET_IDS].split(",")}


@pytest.fixture
def stack(sagemaker_env):
    """A deployed SageMakerStack (tests/aws_fakes.py) and its bucket; yields a boto3 session."""
    session = boto3.session.Session()
    session.client("s3").create_bucket(Bucket=BUCKET)
    deploy_stack(session)
    return session


@pytest.fixture(scope="module")
def small_digits(tmp_path_factory):
    """A small digits file for the jobs whose data is not the point: without one, each launch
    generates the default 14,000 digits (seconds). test_ps_job checks that generation."""
    d = tmp_path_factory.mktemp("digits")
    digits_data.ensure(d / digits_data.DATA_FILE, n_train=20, n_test=10)
    return d


def _staged(session, channel):
    """{relative key: bytes} of the S3 prefix a channel of the request points at."""
    uri = channel["DataSource"]["S3DataSource"]["S3Uri"]
    bucket, _, prefix = uri[len("s3://"):].partition("/")
    s3 = session.client("s3")
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])]
    return {k[len(prefix):].lstrip("/"): s3.get_object(Bucket=bucket, Key=k)["Body"].read()
            for k in keys}


def _run(session, data_dir, **kw):
    """One job per test: sagemaker-core caches its client, so a hook added later misses it."""
    sent = capture_requests(session)
    job = ScriptModeJob(data=str(data_dir), **kw)
    launcher.start(job, session=session)
    assert len(sent) == 1
    body = sent[0]
    channels = {c["ChannelName"]: c for c in body["InputDataConfig"]}
    return body, channels


def test_ps_job(stack, tmp_path):
    session = stack
    body, channels = _run(session, tmp_path / "data", strategy="ps", instance_type="ml.c5.2xlarge",
                          instance_count=3, hyperparameters={"epochs": 6, "batch_size": 128})
    assert body["TrainingJobName"].startswith("script-mode-ps-")
    assert body["ResourceConfig"] == {"InstanceType": "ml.c5.2xlarge", "InstanceCount": 3,
                                      "VolumeSizeInGB": 30}
    assert body["VpcConfig"] == VPC
    assert body["RoleArn"] == STACK_OUTPUTS[outputs.TRAINING_ROLE_ARN]
    assert body["HyperParameters"] == {"strategy": "ps", "epochs": "6", "batch_size": "128"}
    assert body["AlgorithmSpecification"]["TrainingImage"] == STACK_OUTPUTS[outputs.TRAINING_IMAGE_URI]
    assert body["OutputDataConfig"]["S3OutputPath"] == f"s3://{BUCKET}/script-mode/output"
    assert set(channels) == {"training", "code", "sm_drivers"}
    for c in channels.values():
        assert c["DataSource"]["S3DataSource"]["S3Uri"].startswith(f"s3://{BUCKET}/script-mode/")
    # The generated digits went to the training channel; only the package went as code.
    assert list(_staged(session, channels["training"])) == ["digits.npz"]
    code = _staged(session, channels["code"])
    assert "script_mode/train.py" in code and "script_mode/sagemaker_ps.py" in code
    assert all(k.startswith("script_mode/") and "__pycache__" not in k for k in code)
    drivers = _staged(session, channels["sm_drivers"])
    # Every instance runs the per-instance ps entry with the hyperparameters as arguments.
    assert json.loads(drivers["sourcecode.json"])["entry_script"] == "script_mode/sagemaker_ps.py"
    assert json.loads(drivers["distributed.json"]) == {}
    assert b"basic_script_driver.py" in drivers["sm_train.sh"]


def test_horovod_job(stack, small_digits):
    session = stack
    body, channels = _run(session, small_digits, strategy="horovod", instance_type="ml.m5.xlarge",
                          instance_count=2, processes_per_host=2)
    assert body["ResourceConfig"] == {"InstanceType": "ml.m5.xlarge", "InstanceCount": 2,
                                      "VolumeSizeInGB": 30}
    assert body["VpcConfig"] == VPC
    assert body["HyperParameters"] == {"strategy": "horovod"}
    assert body["Environment"] == {"TF_USE_LEGACY_KERAS": "1"}
    # The project's image: Horovod built with MPI, mpi4py for the MPI driver.
    assert body["AlgorithmSpecification"]["TrainingImage"] == STACK_OUTPUTS[outputs.TRAINING_IMAGE_URI]
    drivers = _staged(session, channels["sm_drivers"])
    assert json.loads(drivers["sourcecode.json"])["entry_script"] == "script_mode/train.py"
    # -np is the job's rank count (2 instances x 2), not the SDK driver's per-instance count.
    assert json.loads(drivers["distributed.json"]) == {
        "process_count_per_node": 2,
        "mpi_additional_options": ["-x", "TF_USE_LEGACY_KERAS", "-mca", "mpi_yield_when_idle", "1", "-np", "4"]}
    # Every instance runs the wrapper, which installs the job's SSH keys and then the SDK's driver.
    assert b"python script_mode/sagemaker_mpi.py" in drivers["sm_train.sh"]
    assert "distributed_drivers/mpi_driver.py" in drivers
    code = _staged(session, channels["code"])
    keys = {k for k in code if k.startswith("job_ssh/")}
    assert keys == {"job_ssh/id_ed25519", "job_ssh/id_ed25519.pub", "job_ssh/ssh_host_ed25519_key",
                    "job_ssh/ssh_host_ed25519_key.pub"}
    assert code["job_ssh/id_ed25519"].startswith(b"-----BEGIN OPENSSH PRIVATE KEY-----")


def test_image_override(stack, small_digits):
    body, _ = _run(stack, small_digits, strategy="horovod", image_uri="my/image:1")
    assert body["AlgorithmSpecification"]["TrainingImage"] == "my/image:1"


def test_aws_tensorflow_image_for_ps(stack, small_digits):
    # AWS's TensorFlow CPU training container of the project's TensorFlow version.
    body, _ = _run(stack, small_digits, strategy="ps", aws_tf_image=True)
    assert body["AlgorithmSpecification"]["TrainingImage"] == \
        "763104351884.dkr.ecr.us-east-1.amazonaws.com/tensorflow-training:2.18-cpu-py310"


@pytest.mark.parametrize("args, message", [
    (["--strategy", "allreduce"], "unknown strategy 'allreduce'"),
    (["--strategy", "ps", "--instance-count", "1"], "needs at least 2 instances"),
    (["--strategy", "horovod", "--instance-count", "0"], "instance count must be at least 1"),
    (["--strategy", "horovod", "--processes-per-host", "0"], "must be at least 1"),
    (["--strategy", "ps", "--processes-per-host", "2"], "applies only to --strategy horovod"),
    (["--strategy", "ps", "--instance-type", "ml.p3.2xlarge"], "not a CPU training type"),
    (["--strategy", "ps", "-H", "epoch=3"], "unknown hyperparameter 'epoch'"),
    (["--strategy", "ps", "-H", "epochs=0"], "epochs must be at least 1"),
    (["--strategy", "ps", "-H", "strategy=horovod"], "set the strategy with --strategy"),
    (["--strategy", "ps", "-H", "epochs"], "must be NAME=VALUE"),
    (["--strategy", "horovod", "--aws-tf-image"], "has no Horovod"),
    (["--strategy", "ps", "--stack", "NoSuchStack"], "stack 'NoSuchStack' does not exist"),
])
def test_bad_input_is_refused_before_anything_is_sent(stack, tmp_path, capsys, args,
                                                       message):
    session = stack
    assert launcher.main([*args, "--data", str(tmp_path / "data")]) == 2
    assert message in capsys.readouterr().err
    assert session.client("sagemaker").list_training_jobs()["TrainingJobSummaries"] == []
    assert not (tmp_path / "data").exists()  # not even the data was generated


def test_dry_run_prints_the_request_and_creates_no_job(stack, small_digits, capsys):
    assert launcher.main(["--strategy", "horovod", "--instance-count", "3", "--dry-run",
                          "--data", str(small_digits)]) == 0
    request = json.loads(capsys.readouterr().out)
    assert request["ResourceConfig"]["InstanceCount"] == 3
    assert request["HyperParameters"] == {"strategy": "horovod"}
    assert stack.client("sagemaker").list_training_jobs()["TrainingJobSummaries"] == []


def test_the_sdks_role_check_does_not_stop_the_launcher(stack, small_digits, monkeypatch):
    """With the SDK's role check on (its default), building the trainer would simulate the stack's
    scoped role (iam:SimulatePrincipalPolicy; moto has no such API and errors): the launcher skips it."""
    monkeypatch.delenv("SAGEMAKER_VALIDATE_ROLE")
    simulated = []
    stack.events.register("before-send.iam.SimulatePrincipalPolicy",
                          lambda request, **kw: simulated.append(request.body))
    with tempfile.TemporaryDirectory() as code_dir:
        trainer = launcher.build_trainer(stack, ScriptModeJob(strategy="ps", data=str(small_digits)),
                                         Path(code_dir))
    assert trainer.role == STACK_OUTPUTS[outputs.TRAINING_ROLE_ARN]
    assert simulated == []
