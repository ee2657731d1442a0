"""The SageMaker launcher against a moto server: the CreateTrainingJob request that reaches it."""
import json
import os
import re

import boto3
import botocore.exceptions
import pytest

from aws_fakes import FS_ID, STACK_OUTPUTS, capture_requests, deploy_stack
from infra import outputs
from launch.aws import LaunchError
from launch.sagemaker import launcher
from launch.sagemaker.launcher import JobSpec
from recorded_aws import Replay, training_hour_query
from training.cloudwatch_metrics import TENSORBOARD_DIR_ENV
from training.metrics import METRIC_DEFINITIONS


def test_start_sends_the_full_request(sagemaker_env):
    session = boto3.session.Session()
    deploy_stack(session)
    sent = capture_requests(session)
    spec = JobSpec(instance_type="ml.p4d.24xlarge", instance_count=4, volume_size_gb=100, max_run_seconds=400000,
                   hyperparameters={"mode_mask": "True", "batch_size_per_gpu": "4",
                                    "config:TRAIN.GRADIENT_CLIP": "1.5"})
    result = launcher.start_job(spec, session=session)
    assert len(sent) == 1
    body = sent[0]
    assert body["TrainingJobName"] == result["TrainingJobName"]
    assert body["TrainingJobName"].startswith("maskrcnn-")
    assert body["AlgorithmSpecification"]["TrainingImage"] == STACK_OUTPUTS[outputs.TRAINING_IMAGE_URI]
    assert body["AlgorithmSpecification"]["TrainingInputMode"] == "File"
    assert body["AlgorithmSpecification"]["MetricDefinitions"] == METRIC_DEFINITIONS
    # Every loss, images/s, the learning rate and each mAP (training/metrics.py).
    assert {"images/s", "learning_rate"} <= {
        d["Name"] for d in body["AlgorithmSpecification"]["MetricDefinitions"]}
    assert body["RoleArn"] == STACK_OUTPUTS[outputs.TRAINING_ROLE_ARN]
    assert body["ResourceConfig"] == {"InstanceType": "ml.p4d.24xlarge", "InstanceCount": 4, "VolumeSizeInGB": 100}
    assert body["StoppingCondition"] == {"MaxRuntimeInSeconds": 400000}
    assert body["VpcConfig"] == {"SecurityGroupIds": ["sg-0123456789abcdef0"],
                                 "Subnets": ["subnet-0aaa1111bbbb2222c", "subnet-0ddd3333eeee4444f"]}
    assert body["OutputDataConfig"]["S3OutputPath"] == "s3://maskrcnn-data-bucket/maskrcnn/output"
    assert body["HyperParameters"] == {"mode_mask": "True", "batch_size_per_gpu": "4",
                                       "config:TRAIN.GRADIENT_CLIP": "1.5"}
    channels = {c["ChannelName"]: c["DataSource"]["FileSystemDataSource"] for c in body["InputDataConfig"]}
    assert channels == {
        "train": {"FileSystemId": FS_ID, "FileSystemAccessMode": "ro", "FileSystemType": "EFS",
                  "DirectoryPath": "/data/coco"},
        "log": {"FileSystemId": FS_ID, "FileSystemAccessMode": "rw", "FileSystemType": "EFS",
                "DirectoryPath": "/logs"},
    }
    assert "EnableManagedSpotTraining" not in body or body["EnableManagedSpotTraining"] is False
    assert "CheckpointConfig" not in body
    run = body["Environment"][launcher.RUN_NAME_ENV]
    assert re.fullmatch(r"maskrcnn-\d{8}-\d{6}-[0-9a-f]{4}", run)
    # The run name is also the job's tag, by which a later start finds the run's jobs.
    assert body["Tags"] == [{"Key": "maskrcnn-run-name", "Value": run}]
    # TensorBoard events go where SageMaker uploads them from while the job runs, per run.
    assert body["Environment"][TENSORBOARD_DIR_ENV] == "/opt/ml/output/tensorboard"
    assert body["TensorBoardOutputConfig"] == {
        "LocalPath": "/opt/ml/output/tensorboard",
        "S3OutputPath": f"s3://maskrcnn-data-bucket/maskrcnn/output/tensorboard/{run}"}
    # moto recorded the job: describe works through the companion command.
    assert launcher.describe_job(body["TrainingJobName"], session)["TrainingJobName"] == body["TrainingJobName"]


def test_spot_resumes_from_the_run_directory_on_efs(sagemaker_env):
    """The entry keeps checkpoints in <log channel>/<run name> on EFS: a CheckpointConfig would sync
    /opt/ml/checkpoints, which stays empty, so a spot job carries none; its restart keeps the run name."""
    session = boto3.session.Session()
    deploy_stack(session)
    sent = capture_requests(session)
    launcher.start_job(JobSpec(spot=True, run_name="coco-24ep", max_run_seconds=3600), session=session)
    body = sent[0]
    assert body["EnableManagedSpotTraining"] is True
    assert body["StoppingCondition"] == {"MaxRuntimeInSeconds": 3600, "MaxWaitTimeInSeconds": 7200}
    assert "CheckpointConfig" not in body
    assert body["Environment"][launcher.RUN_NAME_ENV] == "coco-24ep"
    log = [c for c in body["InputDataConfig"] if c["ChannelName"] == "log"][0]
    assert log["DataSource"]["FileSystemDataSource"]["FileSystemAccessMode"] == "rw"
    # Defaults where neither the user nor the stack says otherwise.
    assert body["ResourceConfig"] == {"InstanceType": launcher.DEFAULT_INSTANCE_TYPE, "InstanceCount": 1,
                                      "VolumeSizeInGB": 100}


def _jobs(session) -> list[str]:
    """The training jobs moto has recorded (what reached it, also from the CLI's own session)."""
    return [j["TrainingJobName"] for j in session.client("sagemaker").list_training_jobs()["TrainingJobSummaries"]]


def test_every_new_job_gets_its_own_run_and_only_a_resumed_run_is_continued(sagemaker_env, capsys):
    """A new experiment must never pick up an earlier one's checkpoints: without --run-name every job
    gets a run name (its checkpoint directory) no other job has; --run-name with --resume continues
    that run, and every job carries its run name as a tag."""
    session = boto3.session.Session()
    deploy_stack(session)
    sent = capture_requests(session)
    requests = [launcher.start_job(JobSpec(spot=True), session=session, dry_run=dry) for dry in (False, True)]
    first, second = (r["Environment"][launcher.RUN_NAME_ENV] for r in requests)
    assert first != second and first.startswith("maskrcnn-") and second.startswith("maskrcnn-")
    assert all("CheckpointConfig" not in r for r in requests)
    # Other base job names: SageMaker job names carry the time only to the second.
    launcher.start_job(JobSpec(run_name=first, resume=True, base_job_name="resumed"), session=session)
    assert [b["Environment"][launcher.RUN_NAME_ENV] for b in sent] == [first, first]
    assert [b["Tags"] for b in sent] == [[{"Key": "maskrcnn-run-name", "Value": first}]] * 2
    # The CLI continues a run the same way, and says how.
    assert launcher.main(["start", "--job-name", "continued", "--run-name", first, "--resume"]) == 0
    assert f"start --run-name {first} --resume" in capsys.readouterr().out
    assert len(_jobs(session)) == 3


def test_naming_an_existing_run_is_refused_before_anything_is_sent(sagemaker_env, capsys):
    session = boto3.session.Session()
    deploy_stack(session)
    assert launcher.main(["start", "--run-name", "coco-r50"]) == 0
    (job,) = _jobs(session)
    for args in (["--run-name", "coco-r50"], ["--run-name", "coco-r50", "--dry-run"]):
        assert launcher.main(["start", *args]) == 2
        err = capsys.readouterr().err
        assert f"a run named coco-r50 exists (training job {job}): pass --resume to continue it" in err
        assert "or choose another --run-name" in err
    sent = capture_requests(session)
    with pytest.raises(LaunchError, match="a run named coco-r50 exists"):
        launcher.start_job(JobSpec(run_name="coco-r50"), session=session)
    assert sent == [] and _jobs(session) == [job]
    # Exact names: a run whose name starts with, or is part of, coco-r50 is another run.
    for other in ("coco-r50-b", "coco-r5", "coco"):
        launcher.start_job(JobSpec(run_name=other), session=session)
    assert [b["Environment"][launcher.RUN_NAME_ENV] for b in sent] == ["coco-r50-b", "coco-r5", "coco"]


@pytest.mark.parametrize("args, message", [
    (["--run-name", "no-such-run", "--resume"], "--resume: there is no run named no-such-run in us-east-1"),
    (["--resume"], "--resume continues a run: name it with --run-name"),
])
def test_resume_needs_a_run_that_exists(sagemaker_env, capsys, args, message):
    session = boto3.session.Session()
    deploy_stack(session)
    # A run whose name only starts with the one asked for is another run.
    earlier = launcher.start_job(JobSpec(run_name="no-such-run-2"), session=session)["TrainingJobName"]
    for dry_run in ([], ["--dry-run"]):
        assert launcher.main(["start", *args, *dry_run]) == 2
        assert message in capsys.readouterr().err
    assert _jobs(session) == [earlier]


# The rule itself is tested in test_run_names.py; here, that the launcher applies it.
@pytest.mark.parametrize("name", ["../other", "a/b", ".hidden", "x" * 64])
def test_a_run_name_that_is_not_a_directory_name_is_refused(sagemaker_env, name):
    session = boto3.session.Session()
    deploy_stack(session)
    with pytest.raises(LaunchError, match=f"run name {re.escape(repr(name))}: use letters, digits and hyphens"):
        launcher.start_job(JobSpec(run_name=name), session=session, dry_run=True)


def test_the_sdks_role_check_does_not_stop_the_launcher(sagemaker_env, monkeypatch, capsys):
    """ModelTrainer checks the role with iam:SimulatePrincipalPolicy when the SDK switch is on (its
    default): for a caller allowed to simulate, a scoped role can fail that check (and moto, which has
    no such API, answers it with an error). The launcher uses the stack's own role, unchecked."""
    monkeypatch.delenv("SAGEMAKER_VALIDATE_ROLE")
    session = boto3.session.Session()
    deploy_stack(session)
    simulated = []
    session.events.register("before-send.iam.SimulatePrincipalPolicy",
                            lambda request, **kw: simulated.append(request.body))
    assert launcher.main(["start", "--dry-run"]) == 0
    assert json.loads(capsys.readouterr().out)["RoleArn"] == STACK_OUTPUTS[outputs.TRAINING_ROLE_ARN]
    launcher.start_job(JobSpec(), session=session, dry_run=True)
    assert simulated == []
    assert "SAGEMAKER_VALIDATE_ROLE" not in os.environ  # the switch is only flipped while building


def test_dry_run_prints_the_request_and_sends_nothing(sagemaker_env, capsys):
    session = boto3.session.Session()
    deploy_stack(session)
    assert launcher.main(["start", "--dry-run", "--instance-count", "2", "-H", "batch_norm=GN"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["ResourceConfig"]["InstanceCount"] == 2
    assert printed["HyperParameters"] == {"batch_norm": "GN"}
    assert printed["InputDataConfig"][0]["DataSource"]["FileSystemDataSource"]["FileSystemId"] == FS_ID
    assert session.client("sagemaker").list_training_jobs()["TrainingJobSummaries"] == []


def test_a_deployment_with_a_name_prefix_is_found_without_stack(sagemaker_env, capsys, tmp_path, monkeypatch):
    # `cdk deploy` names the stacks <name_prefix>-<id> (infra/config.py): the settings file's prefix
    # leads the launcher to that stack, not to an unprefixed one of another deployment.
    from infra import settings
    session = boto3.session.Session()
    deploy_stack(session, name=f"team-a-{outputs.SAGEMAKER_STACK}")
    deploy_stack(session, values={**STACK_OUTPUTS, outputs.FILE_SYSTEM_ID: "fs-0000000000000000f"})
    monkeypatch.setattr(settings, "DEFAULT_PATH", tmp_path / "settings.json")
    (tmp_path / "settings.json").write_text(json.dumps({"name_prefix": "team-a"}))
    assert launcher.main(["start", "--dry-run"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["InputDataConfig"][0]["DataSource"]["FileSystemDataSource"]["FileSystemId"] == FS_ID


@pytest.mark.parametrize("args, message", [
    (["-H", "batch_norm=BatchNorm"], "batch_norm"),
    (["-H", "no_such_thing=1"], "unknown hyperparameter 'no_such_thing'"),
    (["-H", "novalue"], "must be NAME=VALUE"),
    (["--instance-type", "p4d.24xlarge"], "not a SageMaker type"),
    (["--train-path", "data/coco"], "absolute path on the EFS file system"),
    (["--stack", "NoSuchStack"], "stack 'NoSuchStack' does not exist"),
    # A new run is <job name>-<UTC time>-<4 hex>: 21 characters after the base, 63 in all.
    (["--job-name", "x" * 43], "at most 42 characters"),
])
def test_bad_input_is_refused_before_anything_is_sent(sagemaker_env, capsys, args, message):
    session = boto3.session.Session()
    deploy_stack(session)
    assert launcher.main(["start", "--dry-run", *args]) == 2
    assert message in capsys.readouterr().err


def test_missing_output_and_wrong_ids_are_named(sagemaker_env):
    session = boto3.session.Session()
    partial = {k: v for k, v in STACK_OUTPUTS.items() if k != outputs.TRAINING_SECURITY_GROUP_ID}
    deploy_stack(session, "OldStack", partial)
    with pytest.raises(LaunchError, match=f"has no output '{outputs.TRAINING_SECURITY_GROUP_ID}'"):
        launcher.start_job(JobSpec(stack="OldStack"), session=session, dry_run=True)
    deploy_stack(session, "WrongStack", {**STACK_OUTPUTS, outputs.FILE_SYSTEM_ID: "vol-123"})
    with pytest.raises(LaunchError, match="is not an EFS id"):
        launcher.start_job(JobSpec(stack="WrongStack"), session=session, dry_run=True)
    deploy_stack(session, "BadSubnets", {**STACK_OUTPUTS, outputs.PRIVATE_SUBNET_IDS: "vpc-1, ,"})
    with pytest.raises(LaunchError, match="of BadSubnets is not a list of subnet ids"):
        launcher.start_job(JobSpec(stack="BadSubnets"), session=session, dry_run=True)
    deploy_stack(session, "BadGroup", {**STACK_OUTPUTS, outputs.TRAINING_SECURITY_GROUP_ID: "subnet-1"})
    with pytest.raises(LaunchError, match="of BadGroup is not a security group id"):
        launcher.start_job(JobSpec(stack="BadGroup"), session=session, dry_run=True)


def test_companion_commands(sagemaker_env, capsys, monkeypatch):
    session = boto3.session.Session()
    deploy_stack(session)
    name = launcher.start_job(JobSpec(), session=session)["TrainingJobName"]
    assert launcher.main(["describe", name]) == 0
    assert json.loads(capsys.readouterr().out)["TrainingJobName"] == name
    # moto reports every job Completed at once, so following its logs ends at once.
    # The final status, then the finished job's cost: moto bills nothing, and SageMakerStack's
    # default type (ml.p4d.24xlarge) is priced from AWS's Price List (moto has none: a stand-in,
    # tests/launch/recorded_aws/get_products.json, whose $12.5/h is chosen, not AWS's).
    with Replay({"GetProducts": {training_hour_query("ml.p4d.24xlarge"): "ml.p4d.24xlarge-training"}}).serve() as url:
        monkeypatch.setenv("AWS_ENDPOINT_URL_PRICING", url)
        assert launcher.main(["logs", name]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-2:]
    assert last[0] == f"{name}: Completed"
    assert last[1].startswith("estimated cost: $0.00 = 1 x ml.p4d.24xlarge x 0.00 h x $12.5/h (on-demand "
                              "price in us-east-1 from AWS's Price List, effective 2025-06-01, read ")
    assert launcher.main(["describe", "no-such-job"]) == 2
    assert "no training job named 'no-such-job'" in capsys.readouterr().err
    assert launcher.main(["stop", "no-such-job"]) == 2


def test_stop_sends_the_job_name(sagemaker_env, monkeypatch):
    """moto has no StopTrainingJob: check the request that reaches it, then its not-implemented answer."""
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    session = boto3.session.Session()
    deploy_stack(session)
    name = launcher.start_job(JobSpec(), session=session)["TrainingJobName"]
    sent = []
    session.events.register("before-send.sagemaker.StopTrainingJob", lambda request, **kw: sent.append(request.body))
    with pytest.raises(botocore.exceptions.ClientError):
        launcher.stop_job(name, session)
    assert [json.loads(b) for b in sent] == [{"TrainingJobName": name}]


LUSTRE_OUTPUTS = {outputs.LUSTRE_FILE_SYSTEM_ID: "fs-0fedcba9876543210", outputs.LUSTRE_MOUNT_NAME: "abcdefgh",
                  outputs.LUSTRE_SUBNET_ID: "subnet-0ddd3333eeee4444f"}


def test_fsx_reads_the_train_channel_from_lustre_in_its_subnet(sagemaker_env, capsys):
    """--fsx: the train channel is the stack's FSx for Lustre file system (/<mount name>/coco, what
    s3://bucket/data/coco shows as), read-only; the log channel stays on EFS; the job runs in the
    file system's zone."""
    session = boto3.session.Session()
    deploy_stack(session, values={**STACK_OUTPUTS, **LUSTRE_OUTPUTS})
    sent = capture_requests(session)
    launcher.start_job(JobSpec(fsx=True, run_name="r1"), session=session)
    (body,) = sent
    # The CLI flag builds the same request (for r1, which now exists, continuing it).
    assert launcher.main(["start", "--fsx", "--run-name", "r1", "--resume", "--dry-run"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert (printed["InputDataConfig"], printed["VpcConfig"]) == (body["InputDataConfig"], body["VpcConfig"])
    channels = {c["ChannelName"]: c["DataSource"]["FileSystemDataSource"] for c in body["InputDataConfig"]}
    assert channels == {
        "train": {"FileSystemId": "fs-0fedcba9876543210", "FileSystemAccessMode": "ro",
                  "FileSystemType": "FSxLustre", "DirectoryPath": "/abcdefgh/coco"},
        "log": {"FileSystemId": FS_ID, "FileSystemAccessMode": "rw", "FileSystemType": "EFS",
                "DirectoryPath": "/logs"},
    }
    assert body["VpcConfig"] == {"SecurityGroupIds": ["sg-0123456789abcdef0"],
                                 "Subnets": ["subnet-0ddd3333eeee4444f"]}
    # Another directory on Lustre.
    request = launcher.start_job(JobSpec(fsx=True, train_path="/coco-mini"), session=session, dry_run=True)
    (train,) = [c for c in request["InputDataConfig"] if c["ChannelName"] == "train"]
    assert train["DataSource"]["FileSystemDataSource"]["DirectoryPath"] == "/abcdefgh/coco-mini"


def test_fsx_without_a_lustre_file_system_says_how_to_get_one(sagemaker_env, capsys):
    session = boto3.session.Session()
    deploy_stack(session)
    assert launcher.main(["start", "--fsx", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "has no FSx for Lustre file system" in err and "maskrcnn settings set fsx_lustre_storage_gib=1200" in err


def _maskrcnn_without_an_account(*args, home):
    """`maskrcnn ARGS` with no credentials, no region and no endpoint: nothing can reach AWS."""
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull,
               AWS_EC2_METADATA_DISABLED="true", HOME=str(home), PYTHONPATH=str(repo))
    return subprocess.run([sys.executable, "-m", "launch.cli", *args], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("args, message", [
    (["-H", "no_such_thing=1"], "unknown hyperparameter 'no_such_thing'"),
    (["-H", "batch_norm=BatchNorm"], "batch_norm"),
    (["--instance-type", "p4d.24xlarge"], "not a SageMaker type"),
    (["--spot", "--max-run", "3600", "--max-wait", "60"], "--max-wait must be at least --max-run"),
])
def test_a_dry_run_checks_hyperparameters_and_job_settings_before_asking_for_credentials(tmp_path, args, message):
    result = _maskrcnn_without_an_account("sagemaker", "start", "--dry-run", *args, home=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error: ") and message in result.stderr, result.stderr
    assert "credentials" not in result.stderr
    # Good input gets past the checks to the first thing that needs the account.
    good = _maskrcnn_without_an_account("sagemaker", "start", "--dry-run", "-H", "batch_norm=GN", home=tmp_path)
    assert good.returncode == 2 and "no AWS credentials found" in good.stderr, good.stderr


# --- a job that fails while `--wait` waits for it --------------------------------------------------
# The moto server has no request that fails a training job (it reports every job Completed at once):
# with `moto_in_process` the test sets the job's status in moto's backend right after
# CreateTrainingJob, as SageMaker would report it later; the launcher and the SDK's wait still go
# through HTTP.
TRAINING_FAILURE = "AlgorithmError: training exited with status 1"


def _fail_training_jobs(session):
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.sagemaker.models import sagemaker_backends

    def fail(http_response, parsed, model, **kwargs):
        backend = sagemaker_backends[DEFAULT_ACCOUNT_ID][session.region_name]
        for job in backend.training_jobs.values():
            job.training_job_status, job.failure_reason = "Failed", TRAINING_FAILURE
    session.events.register("after-call.sagemaker.CreateTrainingJob", fail)


def test_wait_on_a_failed_job_prints_its_status_and_cost_and_exits_1(moto_in_process, capsys, monkeypatch):
    session = boto3.session.Session()
    monkeypatch.setattr(launcher, "make_session", lambda region=None: session)
    deploy_stack(session)
    _fail_training_jobs(session)
    assert launcher.main(["start", "--wait", "--instance-type", "ml.m5.xlarge"]) == 1
    captured = capsys.readouterr()
    lines = captured.out.strip().splitlines()
    (name,) = [job["TrainingJobName"] for job in
               session.client("sagemaker").list_training_jobs()["TrainingJobSummaries"]]
    assert lines[-3:-1] == [f"{name}: Failed", f"failure reason: {TRAINING_FAILURE}"]
    assert lines[-1].startswith("estimated cost: ")
    assert "Traceback" not in captured.err


# --- one run name, one writer, on both paths ----------------------------------------------------
# The log channel (/logs on EFS) is the cluster's <EFS>/logs: a run is its directory there, whichever
# path made it. The notebook sees it at ~/efs (MASKRCNN_EFS_MOUNT here).
def _cluster_run(efs, name: str, *, ended: bool) -> None:
    """A cluster run as `maskrcnn job submit` and the job script leave it (their own code)."""
    from launch.cluster import job
    logdir = efs / "logs" / name
    logdir.mkdir(parents=True)
    job.record_attempt(str(logdir), job_id="17", attempt=0, max_attempts=4)     # submitted, queued
    if ended:
        job.mark_ended(str(logdir), "17")


def test_a_cluster_runs_name_is_taken_and_its_run_resumed_only_when_no_job_writes_it(sagemaker_env, capsys,
                                                                                       tmp_path, monkeypatch):
    efs = tmp_path / "efs"
    monkeypatch.setenv("MASKRCNN_EFS_MOUNT", str(efs))     # documented in docs/launch.md
    session = boto3.session.Session()
    deploy_stack(session)
    _cluster_run(efs, "exp1", ended=True)
    assert launcher.main(["start", "--run-name", "exp1"]) == 2
    assert f"a run named exp1 exists (directory {efs / 'logs' / 'exp1'}): pass --resume" in capsys.readouterr().err
    assert _jobs(session) == []
    _cluster_run(efs, "exp2", ended=False)
    assert launcher.main(["start", "--run-name", "exp2", "--resume"]) == 2
    assert ("--resume: run exp2 is still being written: cluster job 17 is queued or running "
            "(`maskrcnn job stop exp2` on the master)") in capsys.readouterr().err
    assert _jobs(session) == []
    # the cluster run that has ended continues on SageMaker
    assert launcher.main(["start", "--run-name", "exp1", "--resume"]) == 0
    assert len(_jobs(session)) == 1


def test_resume_is_refused_while_a_training_job_of_the_run_may_write_it(moto_in_process, capsys, monkeypatch):
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.sagemaker.models import sagemaker_backends
    session = boto3.session.Session()
    deploy_stack(session)
    first = launcher.start_job(JobSpec(run_name="exp3", spot=True), session=session)["TrainingJobName"]
    (job,) = sagemaker_backends[DEFAULT_ACCOUNT_ID][session.region_name].training_jobs.values()
    for status in ("InProgress", "Stopping"):     # a spot job waiting for capacity is InProgress
        job.training_job_status = status
        assert launcher.main(["start", "--run-name", "exp3", "--resume"]) == 2
        assert (f"--resume: run exp3 is still being written: training job {first} is {status} "
                f"(`maskrcnn sagemaker stop {first}`, then wait until it is Stopped)") in capsys.readouterr().err
    assert _jobs(session) == [first]
    job.training_job_status = "Stopped"
    assert launcher.main(["start", "--run-name", "exp3", "--resume", "--job-name", "again"]) == 0
    assert len(_jobs(session)) == 2
