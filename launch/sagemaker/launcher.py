"""Start, describe, stop and follow SageMaker training jobs of the Mask R-CNN image.

    maskrcnn sagemaker start [--instance-count 4] [--spot] [-H mode_mask=True ...] [--dry-run]
    maskrcnn sagemaker describe JOB
    maskrcnn sagemaker stop JOB
    maskrcnn sagemaker logs JOB

Everything the job needs from the deployment is read from SageMakerStack's CloudFormation outputs
(names in infra/outputs.py): the image, the role, the EFS file system, the private subnets and the
security group, the bucket for the output. Channels are EFS directories: ``train`` read-only (the
staged COCO tree), ``log`` read-write (the entry writes checkpoints and TensorBoard events into
``<log>/<run name>``). With ``--fsx`` the train channel is the stack's FSx for Lustre file system
instead (the app's fsx_lustre_storage_gib; the dataset at /<mount name>/coco, loaded from the bucket
on first read) and the job runs in that file system's subnet. Run names follow launch/run_names.py,
as on the EC2 cluster: every job gets a new run name unless ``--run-name`` gives one, a name that
an earlier run has (a cluster run's too: the log channel is the cluster's /efs/logs, checked where
this machine mounts EFS) is refused unless ``--resume`` continues that run, so a new experiment
never picks up an old one's checkpoints; a resume is refused while another job writes the run; a
spot job that SageMaker restarts keeps its run name and resumes from EFS. The metric definitions come from training.metrics (the 22 of AWS's EFS example,
images/s and the learning rate); rank 0's TensorBoard events also go to the job's TensorBoard output
(s3://<bucket>/<output prefix>/tensorboard/<run name>, uploaded while the job runs). Hyperparameters
(with training.hparams) and the job settings given are checked offline, before credentials are looked
for: a bad value fails the same with or without an account.

The same :func:`start_job` is what notebooks/sagemaker_training.ipynb calls. ``describe`` and ``logs``
of a finished job (and ``start --wait``) add its estimated cost (:func:`job_cost`, launch/cost.py).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

import boto3

from infra import outputs
from launch import cost, deployment
from launch.aws import (LaunchError, make_session, require_output, stack_outputs, stack_role_trusted,
                        training_networking)
from launch.run_names import check_run_name, new_run_name

DEFAULT_INSTANCE_TYPE = "ml.p4d.24xlarge"
TRAIN_CHANNEL_PATH = "/data/coco"     # on the EFS file system; `maskrcnn data to-efs` fills it
LOG_CHANNEL_PATH = "/logs"
# On the FSx for Lustre file system, below its mount name: s3://<bucket>/data/coco appears as /coco.
LUSTRE_TRAIN_PATH = f"/{outputs.LUSTRE_COCO_DIR}"
RUN_NAME_ENV = "MASKRCNN_RUN_NAME"    # read by launch/sagemaker/entry.py
TENSORBOARD_LOCAL_PATH = "/opt/ml/output/tensorboard"   # SageMaker's default TensorBoard directory
# Every job carries its run name as this tag, which is how the launcher finds a run's earlier jobs:
# one Search request with an exact Tags.<key> Equals filter (a run `a` does not match `a-b`), whatever
# the job names are. Matching job names (ListTrainingJobs NameContains) would need the run name in
# every job name, where SageMaker's 63 characters leave it too little room, and an exact check of
# each candidate after the substring match.
RUN_NAME_TAG = "maskrcnn-run-name"
# A job in these states may still write its run directory (Stopping: its ranks save a checkpoint;
# InProgress includes a spot job waiting for capacity).
WRITING_STATUSES = ("InProgress", "Stopping")
WRITER_SEARCH_LIMIT = 100      # Search's largest page: the run's newest jobs
NOTEBOOK_EFS_MOUNT = "~/efs"   # infra/userdata/notebook_on_start.sh mounts EFS there
EFS_MOUNT_ENV = "MASKRCNN_EFS_MOUNT"


@dataclasses.dataclass
class JobSpec:
    """What a user chooses for one job; the rest comes from the stack."""
    stack: str = outputs.SAGEMAKER_STACK
    base_job_name: str = "maskrcnn"
    instance_type: str | None = None       # default: the stack's output if it has one, else DEFAULT_INSTANCE_TYPE
    instance_count: int | None = None
    volume_size_gb: int | None = None
    max_run_seconds: int | None = None
    hyperparameters: dict[str, Any] = dataclasses.field(default_factory=dict)
    train_path: str = TRAIN_CHANNEL_PATH   # with fsx: on the Lustre file system, default LUSTRE_TRAIN_PATH
    fsx: bool = False                      # train channel from the stack's FSx for Lustre file system
    log_path: str = LOG_CHANNEL_PATH
    run_name: str | None = None            # log subdirectory; default: new_run_name(), a new run
    resume: bool = False                   # continue run_name, which an earlier job must have
    spot: bool = False
    max_wait_seconds: int | None = None    # spot only; default 2 x max run
    output_prefix: str = "maskrcnn/output"
    environment: dict[str, str] = dataclasses.field(default_factory=dict)


# Job defaults when the stack does not state them (the SageMaker EFS example used 4 x ml.p3.16xlarge, 100 GB, 400,000 s).
FALLBACKS = {"instance_type": DEFAULT_INSTANCE_TYPE, "instance_count": 1, "volume_size_gb": 100,
             "max_run_seconds": 5 * 24 * 3600}
# Optional stack outputs for those defaults (infra/outputs.py names them if SageMakerStack decides them).
_OPTIONAL_OUTPUTS = {"instance_type": "TRAINING_INSTANCE_TYPE", "instance_count": "TRAINING_INSTANCE_COUNT",
                     "volume_size_gb": "TRAINING_VOLUME_SIZE_GB", "max_run_seconds": "TRAINING_MAX_RUNTIME_S"}


def _efs_path(path: str, what: str) -> str:
    if not path.startswith("/") or ".." in path.split("/"):
        raise LaunchError(f"{what} {path!r} must be an absolute path on the EFS file system, like /data/coco")
    return path


def resolve(spec: JobSpec, stack: dict[str, str]) -> JobSpec:
    """``spec`` with every unset job setting filled from the stack's outputs or the fallbacks, validated."""
    values = {}
    for field, fallback in FALLBACKS.items():
        value = getattr(spec, field)
        if value is None:
            name = getattr(outputs, _OPTIONAL_OUTPUTS[field], None)
            value = stack.get(name) if name else None
            value = fallback if value in (None, "") else type(fallback)(value)
        values[field] = value
    if spec.resume and not spec.run_name:
        raise LaunchError("--resume continues a run: name it with --run-name (`start` printed the name)")
    values["run_name"] = check_run_name(spec.run_name) if spec.run_name else new_run_name(spec.base_job_name)
    if spec.fsx and spec.train_path == TRAIN_CHANNEL_PATH:
        values["train_path"] = LUSTRE_TRAIN_PATH
    out = dataclasses.replace(spec, **values)
    if not out.instance_type.startswith("ml."):
        raise LaunchError(f"instance type {out.instance_type!r} is not a SageMaker type; they start with 'ml.', "
                          f"e.g. ml.p4d.24xlarge")
    if out.instance_count < 1 or out.volume_size_gb < 1 or out.max_run_seconds < 1:
        raise LaunchError("instance count, volume size and max run time must be positive")
    if out.spot and out.max_wait_seconds is not None and out.max_wait_seconds < out.max_run_seconds:
        raise LaunchError("--max-wait must be at least --max-run (SageMaker's rule for spot jobs)")
    _efs_path(out.train_path, "train channel path")
    _efs_path(out.log_path, "log channel path")
    return out


def check_hyperparameters(hyperparameters: dict[str, Any]) -> None:
    """Fail here, not an hour later in the container, on a wrong hyperparameter name or value."""
    from training.config import ConfigError
    from training.hparams import to_overrides
    try:
        to_overrides(hyperparameters)
    except ConfigError as err:
        raise LaunchError(str(err)) from None


def check_offline(spec: JobSpec) -> None:
    """What can be checked without the account, before credentials are looked for: the job
    settings the user gave (the stack's defaults fill the rest later) and the hyperparameters."""
    resolve(spec, {})
    check_hyperparameters(spec.hyperparameters)


def build_trainer(session: boto3.session.Session, spec: JobSpec):
    """A ``sagemaker.train.ModelTrainer`` for ``spec`` and the resolved spec."""
    from sagemaker.core.helper.session_helper import Session
    from sagemaker.core.training.configs import (Compute, FileSystemDataSource, InputData, MetricDefinition,
                                                 Networking, OutputDataConfig, StoppingCondition, Tag,
                                                 TensorBoardOutputConfig)
    from sagemaker.train import ModelTrainer

    from training.cloudwatch_metrics import TENSORBOARD_DIR_ENV
    from training.metrics import METRIC_DEFINITIONS

    stack = stack_outputs(session, spec.stack)

    def need(name):
        return require_output(stack, name, spec.stack)

    image, role = need(outputs.TRAINING_IMAGE_URI), need(outputs.TRAINING_ROLE_ARN)
    fs_id, bucket = need(outputs.FILE_SYSTEM_ID), need(outputs.BUCKET_NAME)
    subnets, security_group = training_networking(stack, spec.stack)
    if not fs_id.startswith("fs-"):
        raise LaunchError(f"output {outputs.FILE_SYSTEM_ID}={fs_id!r} of {spec.stack} is not an EFS id (fs-...)")
    spec = resolve(spec, stack)
    check_hyperparameters(spec.hyperparameters)
    train_source = FileSystemDataSource(file_system_id=fs_id, file_system_type="EFS",
                                        file_system_access_mode="ro", directory_path=spec.train_path)
    if spec.fsx:
        train_source, subnets = _lustre_train_channel(stack, spec, FileSystemDataSource)

    # The run directory <log>/<run name> holds the checkpoints; a spot job SageMaker restarts keeps
    # this environment, so it resumes there.
    environment = {**spec.environment, RUN_NAME_ENV: spec.run_name}
    # Rank 0 also writes its TensorBoard events where SageMaker uploads them from while the job runs
    # (training/cloudwatch_metrics.py), to s3://<bucket>/<output prefix>/tensorboard/<run name>.
    environment.setdefault(TENSORBOARD_DIR_ENV, TENSORBOARD_LOCAL_PATH)
    tensorboard = TensorBoardOutputConfig(
        s3_output_path=f"s3://{bucket}/{spec.output_prefix.strip('/')}/tensorboard/{spec.run_name}",
        local_path=environment[TENSORBOARD_DIR_ENV])
    stopping = StoppingCondition(max_runtime_in_seconds=spec.max_run_seconds)
    if spec.spot:
        # No CheckpointConfig: its S3 sync covers /opt/ml/checkpoints, and the checkpoints are on EFS.
        stopping = StoppingCondition(max_runtime_in_seconds=spec.max_run_seconds,
                                     max_wait_time_in_seconds=spec.max_wait_seconds or 2 * spec.max_run_seconds)
    with stack_role_trusted():
        trainer = ModelTrainer(
            sagemaker_session=Session(boto_session=session),
            role=role,
            training_image=image,
            base_job_name=spec.base_job_name,
            compute=Compute(instance_type=spec.instance_type, instance_count=spec.instance_count,
                            volume_size_in_gb=spec.volume_size_gb, enable_managed_spot_training=spec.spot or None),
            networking=Networking(subnets=subnets, security_group_ids=[security_group]),
            stopping_condition=stopping,
            output_data_config=OutputDataConfig(s3_output_path=f"s3://{bucket}/{spec.output_prefix.strip('/')}"),
            input_data_config=[
                InputData(channel_name="train", data_source=train_source),
                InputData(channel_name="log", data_source=FileSystemDataSource(
                    file_system_id=fs_id, file_system_type="EFS", file_system_access_mode="rw",
                    directory_path=spec.log_path)),
            ],
            hyperparameters={k: str(v) for k, v in spec.hyperparameters.items()},
            environment=environment,
            tags=[Tag(key=RUN_NAME_TAG, value=spec.run_name)],
        ).with_metric_definitions([MetricDefinition(name=m["Name"], regex=m["Regex"]) for m in METRIC_DEFINITIONS]
                                  ).with_tensorboard_output_config(tensorboard)
    return trainer, spec


def _lustre_train_channel(stack: dict[str, str], spec: JobSpec, source_type):
    """The FSxLustre train channel and the one subnet the job may run in (the file system's zone)."""
    names = (outputs.LUSTRE_FILE_SYSTEM_ID, outputs.LUSTRE_MOUNT_NAME, outputs.LUSTRE_SUBNET_ID)
    if not all(stack.get(name) for name in names):
        raise LaunchError(f"--fsx: {spec.stack} has no FSx for Lustre file system (outputs "
                          f"{', '.join(names)}); `maskrcnn settings set fsx_lustre_storage_gib=1200` "
                          f"(or a multiple of 2400) and deploy, or leave out --fsx to read from EFS")
    fs_id, mount_name, subnet = (stack[name] for name in names)
    if not fs_id.startswith("fs-") or not subnet.startswith("subnet-"):
        raise LaunchError(f"outputs {outputs.LUSTRE_FILE_SYSTEM_ID}={fs_id!r} / {outputs.LUSTRE_SUBNET_ID}="
                          f"{subnet!r} of {spec.stack} are not a file system and a subnet id")
    # SageMaker takes the Lustre path with the mount name first: /<mount name>/<path>.
    source = source_type(file_system_id=fs_id, file_system_type="FSxLustre", file_system_access_mode="ro",
                         directory_path=f"/{mount_name}{spec.train_path}")
    return source, [subnet]


def jobs_of_run(session: boto3.session.Session, run_name: str) -> list[tuple[str, str]]:
    """(name, status) of the newest training jobs tagged with the run name, newest first."""
    found = session.client("sagemaker").search(
        Resource="TrainingJob", MaxResults=WRITER_SEARCH_LIMIT, SortBy="CreationTime", SortOrder="Descending",
        SearchExpression={"Filters": [{"Name": f"Tags.{RUN_NAME_TAG}", "Operator": "Equals", "Value": run_name}]})
    return [(r["TrainingJob"]["TrainingJobName"], r["TrainingJob"].get("TrainingJobStatus", ""))
            for r in found["Results"]]


def latest_job_of_run(session: boto3.session.Session, run_name: str) -> str | None:
    """The name of the newest training job tagged with the run name, None when no job has it."""
    jobs = jobs_of_run(session, run_name)
    return jobs[0][0] if jobs else None


def visible_run_root(log_path: str = LOG_CHANNEL_PATH) -> Path | None:
    """Where this machine sees the log channel's directory of runs on EFS (the notebook mounts EFS
    at ~/efs; ``MASKRCNN_EFS_MOUNT`` names another mount), or None where EFS is not mounted."""
    mount = Path(os.environ.get(EFS_MOUNT_ENV) or NOTEBOOK_EFS_MOUNT).expanduser()
    return mount / log_path.strip("/") if os.path.ismount(mount) or os.environ.get(EFS_MOUNT_ENV) else None


def check_named_run(session: boto3.session.Session, run_name: str, resume: bool,
                    run_root: Path | None = None) -> None:
    """The cluster's rule (launch/cluster/jobs.py) over both paths' runs: a named run must be new,
    unless it is resumed, and then it must exist and nothing else may be writing it. A run is its
    directory on EFS (``run_root``, when this machine sees it: cluster and SageMaker runs alike) or,
    where EFS is not mounted, a training job tagged with its name."""
    from launch.cluster.job import cluster_job_writing

    jobs = jobs_of_run(session, run_name)
    run_dir = run_root / run_name if run_root is not None else None
    found = [f"training job {jobs[0][0]}"] if jobs else []
    if run_dir is not None and run_dir.is_dir():
        found.append(f"directory {run_dir}")
    if found and not resume:
        raise LaunchError(f"a run named {run_name} exists ({', '.join(found)}): pass --resume to continue "
                          f"it from its latest checkpoint, or choose another --run-name (or leave it out for "
                          f"a new name)")
    if resume and not found:
        where = f"{run_dir} does not exist and " if run_dir is not None else ""
        raise LaunchError(f"--resume: there is no run named {run_name} in {session.region_name} ({where}no "
                          f"training job has the tag {RUN_NAME_TAG}={run_name}); check the name (`start` printed "
                          f"it), or leave out --resume to start a new run")
    if not resume:
        return
    writers = [f"training job {name} is {status} (`maskrcnn sagemaker stop {name}`, then wait until it is "
               f"Stopped)" for name, status in jobs if status in WRITING_STATUSES]
    cluster_job = cluster_job_writing(str(run_dir)) if run_dir is not None else None
    if cluster_job:
        writers.append(f"cluster job {cluster_job} is queued or running (`maskrcnn job stop {run_name}` on the "
                       f"master)")
    if writers:
        raise LaunchError(f"--resume: run {run_name} is still being written: {'; '.join(writers)}. Two jobs "
                          f"writing one run directory would overwrite each other's checkpoints")


def start_job(spec: JobSpec, *, session: boto3.session.Session | None = None, dry_run: bool = False,
              wait: bool = False) -> dict[str, Any]:
    """Create the training job (or with ``dry_run`` only build it); returns the CreateTrainingJob request.
    A named run is checked against the earlier jobs first, also in a dry run, which shows what would be sent."""
    session = session or make_session()
    trainer, resolved = build_trainer(session, spec)
    if spec.run_name:    # a new name is new by construction: the time and random digits
        check_named_run(session, resolved.run_name, spec.resume, visible_run_root(resolved.log_path))
    request = trainer._create_training_job_args(boto3=True)  # the exact API request, for --dry-run and the notebook
    if dry_run:
        return request
    # ModelTrainer names the job again inside train(); use that name.
    try:
        trainer.train(wait=wait, logs=wait)
    except Exception as err:
        # A job that ends Failed (or Stopped) is an outcome to report, with its status and cost
        # (main), not a traceback.
        if not (wait and failed_status(err)):
            raise
    job = trainer._latest_training_job
    request["TrainingJobName"] = job.training_job_name if job is not None else request["TrainingJobName"]
    return request


FINISHED = ("Completed", "Failed", "Stopped")


def failed_status(err: BaseException) -> bool:
    """Whether ``err`` is sagemaker-core's FailedStatusError: what its waits raise when the resource
    they wait for ends in a failed state (a training or transform job Failed or Stopped)."""
    return type(err).__name__ == "FailedStatusError"


def job_cost(description: dict[str, Any], session: boto3.session.Session | None = None
             ) -> cost.CostEstimate | None:
    """A finished job's estimated cost (None while it runs): its billed seconds x InstanceCount x
    the ml.* type's price. Billed seconds are BillableTimeInSeconds, which SageMaker documents as
    per instance (to be multiplied by InstanceCount) and which managed spot makes shorter than the
    training time; without it TrainingTimeInSeconds, else the time from TrainingStartTime to
    TrainingEndTime, the interval SageMaker documents as billed. With ``session``, a type without a
    recorded price is priced from AWS's Price List in the session's region."""
    if description.get("TrainingJobStatus") not in FINISHED:
        return None
    resources = description.get("ResourceConfig") or {}
    if not resources.get("InstanceType"):
        return None
    seconds = description.get("BillableTimeInSeconds")
    if seconds is None:
        seconds = description.get("TrainingTimeInSeconds")
    if seconds is None:
        start, end = description.get("TrainingStartTime"), description.get("TrainingEndTime")
        seconds = (end - start).total_seconds() if start and end else 0
    return cost.estimate(resources["InstanceType"], int(resources.get("InstanceCount", 1)), seconds,
                         session=session)


def describe_job(name: str, session: boto3.session.Session | None = None) -> dict[str, Any]:
    session = session or make_session()
    sm = session.client("sagemaker")
    try:
        d = sm.describe_training_job(TrainingJobName=name)
    except sm.exceptions.ClientError as err:
        if "ValidationException" in str(err) or "not found" in str(err).lower():
            raise LaunchError(f"no training job named {name!r} in {session.region_name}: "
                              f"list them with `aws sagemaker list-training-jobs`") from None
        raise
    keep = ("TrainingJobName", "TrainingJobStatus", "SecondaryStatus", "FailureReason", "CreationTime",
            "TrainingStartTime", "TrainingEndTime", "BillableTimeInSeconds", "ModelArtifacts", "FinalMetricDataList")
    described = {k: d[k] for k in keep if k in d}
    estimate = job_cost(d, session)
    if estimate is not None:
        described["EstimatedCostUSD"] = None if estimate.usd is None else round(estimate.usd, 2)
        described["EstimatedCost"] = estimate.line()
    return described


def stop_job(name: str, session: boto3.session.Session | None = None) -> None:
    session = session or make_session()
    describe_job(name, session)  # a clear error for a wrong name
    session.client("sagemaker").stop_training_job(TrainingJobName=name)


def follow_logs(name: str, session: boto3.session.Session | None = None) -> str:
    """Print the job's CloudWatch log streams until it ends; returns the final status."""
    from sagemaker.core.resources import TrainingJob

    session = session or make_session()
    describe_job(name, session)
    job = TrainingJob.get(training_job_name=name, session=session, region=session.region_name)
    try:
        job.wait(logs=True)
    except Exception as err:  # FailedStatusError carries the failure reason; report, don't trace back
        if not failed_status(err):
            raise
    job.refresh()
    return job.training_job_status


def _hyperparameters(pairs: list[str], json_file: str | None) -> dict[str, str]:
    hps: dict[str, str] = {}
    if json_file:
        from training.hparams import load_hyperparameters_json
        hps.update({k: str(v) for k, v in load_hyperparameters_json(json_file).items()})
    for pair in pairs or []:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise LaunchError(f"hyperparameter {pair!r} must be NAME=VALUE, e.g. -H batch_size_per_gpu=4 "
                              f"or -H config:TRAIN.GRADIENT_CLIP=1.5")
        hps[name] = value
    return hps


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="maskrcnn sagemaker", description=__doc__.splitlines()[0])
    p.add_argument("--region")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("start", help="start a training job")
    s.add_argument("--stack", help=deployment.stack_help(outputs.SAGEMAKER_STACK))
    s.add_argument("--job-name", default="maskrcnn", help="base name; SageMaker's job name adds a timestamp")
    s.add_argument("--instance-type")
    s.add_argument("--instance-count", type=int)
    s.add_argument("--volume-size", type=int, help="GB of EBS per instance")
    s.add_argument("--max-run", type=int, help="seconds")
    s.add_argument("--spot", action="store_true",
                   help="managed spot capacity; an interrupted job resumes from its checkpoints on EFS")
    s.add_argument("--max-wait", type=int, help="seconds (spot: time waiting for capacity + running)")
    s.add_argument("--train-path", default=TRAIN_CHANNEL_PATH, help="COCO directory on EFS (train channel, read-only)")
    s.add_argument("--fsx", action="store_true",
                   help="train channel from the stack's FSx for Lustre file system (fsx_lustre_storage_gib), "
                        f"read-only; --train-path is then on Lustre (default {LUSTRE_TRAIN_PATH}); the log "
                        "channel stays on EFS")
    s.add_argument("--log-path", default=LOG_CHANNEL_PATH, help="log directory on EFS (log channel, read-write)")
    s.add_argument("--run-name", help="log subdirectory on EFS (default: <job name>-<UTC time>-<4 hex>, "
                                         "a new run)")
    s.add_argument("--resume", action="store_true",
                   help="continue the run named by --run-name from its latest checkpoint")
    s.add_argument("-H", "--hyperparameter", action="append", metavar="NAME=VALUE",
                   help="the hyperparameter names of the SageMaker Mask R-CNN EFS example "
                        "(mode_mask, batch_size_per_gpu, ...) or config:KEY")
    s.add_argument("--hyperparameters-json", help="JSON object of hyperparameters")
    s.add_argument("--wait", action="store_true", help="wait for the job and print its logs")
    s.add_argument("--dry-run", action="store_true", help="print the CreateTrainingJob request; send nothing")
    for name, text in (("describe", "status, failure reason, final metrics"), ("stop", "stop a running job"),
                       ("logs", "follow a job's logs until it ends")):
        c = sub.add_parser(name, help=text)
        c.add_argument("job")
    a = p.parse_args(argv)
    try:
        if a.command == "start":
            spec = JobSpec(stack=deployment.stack_name(outputs.SAGEMAKER_STACK, stack=a.stack),
                           base_job_name=a.job_name, instance_type=a.instance_type,
                           instance_count=a.instance_count, volume_size_gb=a.volume_size, max_run_seconds=a.max_run,
                           hyperparameters=_hyperparameters(a.hyperparameter, a.hyperparameters_json),
                           train_path=a.train_path, log_path=a.log_path, run_name=a.run_name, resume=a.resume,
                           spot=a.spot, max_wait_seconds=a.max_wait, fsx=a.fsx)
            check_offline(spec)
        session = make_session(a.region)
        if a.command == "start":
            request = start_job(spec, session=session, dry_run=a.dry_run, wait=a.wait)
            if a.dry_run:
                print(json.dumps(request, indent=2, default=str))
            else:
                run = request["Environment"][RUN_NAME_ENV]
                print(f"started {request['TrainingJobName']}, run {run} (checkpoints in <log channel>/{run} on EFS)\n"
                      f"  follow:   maskrcnn sagemaker logs {request['TrainingJobName']}\n"
                      f"  continue: maskrcnn sagemaker start --run-name {run} --resume ...")
            if a.wait and not a.dry_run:   # the job has ended: its status and cost
                described = describe_job(request["TrainingJobName"], session)
                status = described.get("TrainingJobStatus")
                print(f"{request['TrainingJobName']}: {status}")
                if described.get("FailureReason"):
                    print(f"failure reason: {described['FailureReason']}")
                if "EstimatedCost" in described:
                    print(described["EstimatedCost"])
                return 0 if status == "Completed" else 1
        elif a.command == "describe":
            print(json.dumps(describe_job(a.job, session), indent=2, default=str))
        elif a.command == "stop":
            stop_job(a.job, session)
            print(f"stopping {a.job}")
        else:
            status = follow_logs(a.job, session)
            print(f"{a.job}: {status}")
            described = describe_job(a.job, session)
            if "EstimatedCost" in described:
                print(described["EstimatedCost"])
            return 0 if status == "Completed" else 1
    except LaunchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
