"""Start the script-mode example (script_mode/train.py) on SageMaker CPU instances, with an
asynchronous parameter server or with Horovod all-reduce, as in AWS's SageMaker lab "Distributed
training with SageMaker's script mode using Parameter Server and Horovod".

    PYTHONPATH=examples python -m script_mode.sagemaker_launch --strategy ps --instance-count 3 [--dry-run]
    PYTHONPATH=examples python -m script_mode.sagemaker_launch --strategy horovod --instance-count 2 --processes-per-host 4
    PYTHONPATH=examples python -m script_mode.sagemaker_launch --strategy ps -H epochs=6 -H batch_size=128 --wait

Both strategies use ``sagemaker.train.ModelTrainer`` with ``SourceCode``: only the script_mode
package is uploaded, hyperparameters reach the script as ``--name value`` and the generated
digits are the ``training`` channel (SM_CHANNEL_TRAINING).

- ``ps``: every instance runs ``script_mode/sagemaker_ps.py``, which starts one parameter server
  there plus the chief (first instance) or a worker (the others), each with its own TF_CONFIG.
  Needs at least 2 instances.
- ``horovod``: ModelTrainer's MPI driver runs ``mpirun`` over all instances,
  ``--processes-per-host`` ranks each. Every instance first runs ``script_mode/sagemaker_mpi.py``,
  which installs the job's SSH keys (made here, staged with the code) and then starts that driver.

The image is the project's training image (the stack's TrainingImageUri: the same TensorFlow,
tf-keras and Horovod-with-MPI versions as constraints.txt, and the role may pull it).
``--aws-tf-image`` uses AWS's TensorFlow 2.18 CPU training container instead (ps only: it has no
Horovod; the role must be allowed to pull from AWS's repository); ``--image-uri`` any other.

Networking comes from SageMakerStack's outputs (the private subnets and the training security
group, so instances talk to each other inside one VPC, as that lab recommends); the role and the
bucket for data, code and model artifacts too. Everything is validated before anything is sent.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import boto3

from infra import outputs
from launch.aws import (LaunchError, make_session, require_output, stack_outputs, stack_role_trusted,
                        training_networking)
from launch.cluster.launch_command import mca_flags
from script_mode import sagemaker_mpi

STRATEGIES = ("ps", "horovod")
# CPU instance families this example is meant for (the lab trains on CPU instances).
CPU_INSTANCE = re.compile(r"^ml\.(c5|c5n|c6i|m5|m6i)\.[0-9]*x?large$")
DEFAULT_INSTANCE_TYPE = "ml.c5.xlarge"
TF_VERSION = "2.18"                      # constraints.txt's tensorflow major.minor
PY_VERSION = "py310"
ENTRY_SCRIPTS = {"ps": "script_mode/sagemaker_ps.py", "horovod": "script_mode/train.py"}
MPI_ENTRY = "script_mode/sagemaker_mpi.py"  # horovod: every instance's command, before the SDK's MPI driver
PACKAGE_DIR = Path(__file__).resolve().parent
OUTPUT_PREFIX = "script-mode"


@dataclasses.dataclass
class ScriptModeJob:
    strategy: str
    instance_type: str = DEFAULT_INSTANCE_TYPE
    instance_count: int = 2
    processes_per_host: int = 1          # horovod: ranks per instance (e.g. one per core pair)
    hyperparameters: dict[str, Any] = dataclasses.field(default_factory=dict)
    image_uri: str | None = None         # default: the stack's TrainingImageUri
    aws_tf_image: bool = False           # AWS's TensorFlow CPU container (ps only)
    data: str = "data/script_mode"       # local folder (digits generated if missing) or s3:// URI
    stack: str = outputs.SAGEMAKER_STACK
    base_job_name: str | None = None     # default: script-mode-<strategy>
    volume_size_gb: int = 30
    max_run_seconds: int = 3600


def validate(job: ScriptModeJob) -> None:
    """Every check that needs no AWS call; LaunchError names the problem and the fix."""
    from script_mode import hyperparameters as hps

    if job.strategy not in STRATEGIES:
        raise LaunchError(f"unknown strategy {job.strategy!r}: choose one of {', '.join(STRATEGIES)}")
    if not CPU_INSTANCE.match(job.instance_type):
        raise LaunchError(f"instance type {job.instance_type!r} is not a CPU training type this "
                          f"example supports: use ml.c5.*, ml.c5n.*, ml.c6i.*, ml.m5.* or ml.m6i.*, "
                          f"e.g. {DEFAULT_INSTANCE_TYPE}")
    if job.instance_count < 1:
        raise LaunchError(f"instance count must be at least 1, got {job.instance_count}")
    if job.strategy == "ps" and job.instance_count < 2:
        raise LaunchError(
            f"the ps strategy needs at least 2 instances (the first coordinates, the others "
            f"compute; every one holds a parameter server), got {job.instance_count}: "
            f"use --instance-count 2 or more, or --strategy horovod")
    if job.processes_per_host < 1:
        raise LaunchError(f"--processes-per-host must be at least 1, got {job.processes_per_host}")
    if job.strategy == "ps" and job.processes_per_host != 1:
        raise LaunchError("--processes-per-host applies only to --strategy horovod; the ps "
                          "strategy runs one worker per instance")
    if job.volume_size_gb < 1 or job.max_run_seconds < 1:
        raise LaunchError("volume size and max run time must be positive")
    if job.aws_tf_image and job.image_uri:
        raise LaunchError("pass either --aws-tf-image or --image-uri, not both")
    if job.aws_tf_image and job.strategy == "horovod":
        raise LaunchError("AWS's TensorFlow 2.18 training container has no Horovod: drop "
                          "--aws-tf-image (the project's image has it) or use --strategy ps")
    if "strategy" in job.hyperparameters:
        raise LaunchError("set the strategy with --strategy, not as a hyperparameter")
    try:
        hps.validate(job.hyperparameters)
    except ValueError as e:
        raise LaunchError(str(e)) from None
    if not job.data.startswith("s3://") and Path(job.data).exists() and not Path(job.data).is_dir():
        raise LaunchError(f"--data {job.data!r} must be a folder (it holds digits.npz) or an s3:// URI")


def training_image(job: ScriptModeJob, session: boto3.session.Session, stack: dict[str, str]) -> str:
    if job.image_uri:
        return job.image_uri
    if not job.aws_tf_image:
        return require_output(stack, outputs.TRAINING_IMAGE_URI, job.stack)
    from sagemaker.core import image_uris
    return image_uris.retrieve(framework="tensorflow", region=session.region_name,
                               version=TF_VERSION, py_version=PY_VERSION,
                               instance_type=job.instance_type, image_scope="training")


def stage_code(into: Path) -> Path:
    """Copy only the script_mode package: the job needs nothing else from this repository."""
    shutil.copytree(PACKAGE_DIR, into / "script_mode",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return into


def _data_source(job: ScriptModeJob) -> str:
    if job.data.startswith("s3://"):
        return job.data
    from script_mode import data as digits_data
    digits_data.ensure(Path(job.data) / digits_data.DATA_FILE)
    return str(Path(job.data).resolve())


def build_trainer(session: boto3.session.Session, job: ScriptModeJob, code_dir: Path):
    """The ModelTrainer for ``job``; ``code_dir`` must live until the job is created."""
    from sagemaker.core.helper.session_helper import Session
    from sagemaker.core.training.configs import (Compute, InputData, Networking, OutputDataConfig,
                                                 SourceCode, StoppingCondition)
    from sagemaker.train import ModelTrainer
    from sagemaker.train.distributed import MPI

    validate(job)
    stack = stack_outputs(session, job.stack)
    role = require_output(stack, outputs.TRAINING_ROLE_ARN, job.stack)
    bucket = require_output(stack, outputs.BUCKET_NAME, job.stack)
    subnets, security_group = training_networking(stack, job.stack)
    image = training_image(job, session, stack)

    distributed, command = None, None
    stage_code(code_dir)
    if job.strategy == "horovod":
        distributed = MPI(process_count_per_node=job.processes_per_host, mpi_additional_options=[
            # mpirun forwards only the variables named with -x; the script needs Keras 2.
            "-x", "TF_USE_LEGACY_KERAS",
            # every MPI job's Open MPI parameters (waiting ranks yield their core; launch_command.py)
            *mca_flags(),
            # The SDK's driver passes the per-instance count as mpirun's -np, which would start
            # that many ranks in all (on the first instance); the last -np wins.
            "-np", str(job.instance_count * job.processes_per_host)])
        # The driver needs SSH between the instances and the image has no keys: this command
        # installs the job's own (staged with the code) and then runs the driver.
        sagemaker_mpi.write_job_keys(code_dir)
        command = f"python {MPI_ENTRY}"
    name = job.base_job_name or f"script-mode-{job.strategy}"
    with stack_role_trusted():
        trainer = ModelTrainer(
            # The stack's bucket holds the uploaded code and data, as well as the model output.
            sagemaker_session=Session(boto_session=session, default_bucket=bucket,
                                      default_bucket_prefix=OUTPUT_PREFIX),
            role=role,
            training_image=image,
            base_job_name=name,
            source_code=SourceCode(source_dir=str(code_dir), entry_script=ENTRY_SCRIPTS[job.strategy],
                                   command=command),
            distributed=distributed,
            compute=Compute(instance_type=job.instance_type, instance_count=job.instance_count,
                            volume_size_in_gb=job.volume_size_gb),
            networking=Networking(subnets=subnets, security_group_ids=[security_group]),
            stopping_condition=StoppingCondition(max_runtime_in_seconds=job.max_run_seconds),
            output_data_config=OutputDataConfig(s3_output_path=f"s3://{bucket}/{OUTPUT_PREFIX}/output"),
            hyperparameters={"strategy": job.strategy,
                             **{k: str(v) for k, v in job.hyperparameters.items()}},
            environment={"TF_USE_LEGACY_KERAS": "1"},
            input_data_config=[InputData(channel_name="training", data_source=_data_source(job))],
        )
    return trainer


def start(job: ScriptModeJob, *, session: boto3.session.Session | None = None,
          dry_run: bool = False, wait: bool = False) -> dict[str, Any]:
    """Create the training job (``dry_run``: only build the request; the code and data are still
    staged to S3, which the request refers to). Returns the CreateTrainingJob request."""
    session = session or make_session()
    with tempfile.TemporaryDirectory(prefix="script-mode-code-") as code_dir:
        trainer = build_trainer(session, job, Path(code_dir))
        if dry_run:
            return trainer._create_training_job_args(boto3=True)
        trainer.train(wait=wait, logs=wait)
        latest = trainer._latest_training_job
        return {"TrainingJobName": latest.training_job_name if latest is not None else None}


def _hyperparameters(pairs: list[str] | None) -> dict[str, str]:
    out = {}
    for pair in pairs or []:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise LaunchError(f"hyperparameter {pair!r} must be NAME=VALUE, e.g. -H epochs=6")
        out[name] = value
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m script_mode.sagemaker_launch",
                                description=__doc__.splitlines()[0])
    p.add_argument("--strategy", required=True, help="ps or horovod")
    p.add_argument("--instance-type", default=DEFAULT_INSTANCE_TYPE)
    p.add_argument("--instance-count", type=int, default=2)
    p.add_argument("--processes-per-host", type=int, default=1, help="horovod ranks per instance")
    p.add_argument("-H", "--hyperparameter", action="append", metavar="NAME=VALUE",
                   help="the script's hyperparameters: epochs, batch_size, learning_rate, ...")
    p.add_argument("--image-uri", help="training image (default: the stack's TrainingImageUri)")
    p.add_argument("--aws-tf-image", action="store_true",
                   help="ps only: AWS's TensorFlow 2.18 CPU training container")
    p.add_argument("--data", default="data/script_mode",
                   help="local folder with digits.npz (generated if missing) or an s3:// prefix")
    p.add_argument("--stack", default=outputs.SAGEMAKER_STACK)
    p.add_argument("--job-name", help="base job name (default script-mode-<strategy>)")
    p.add_argument("--volume-size", type=int, default=30, help="GB per instance")
    p.add_argument("--max-run", type=int, default=3600, help="seconds")
    p.add_argument("--region")
    p.add_argument("--wait", action="store_true", help="wait for the job and print its logs")
    p.add_argument("--dry-run", action="store_true",
                   help="print the CreateTrainingJob request; create no job")
    a = p.parse_args(argv)
    try:
        job = ScriptModeJob(strategy=a.strategy, instance_type=a.instance_type,
                            instance_count=a.instance_count, processes_per_host=a.processes_per_host,
                            hyperparameters=_hyperparameters(a.hyperparameter),
                            image_uri=a.image_uri, aws_tf_image=a.aws_tf_image, data=a.data,
                            stack=a.stack,
                            base_job_name=a.job_name, volume_size_gb=a.volume_size,
                            max_run_seconds=a.max_run)
        validate(job)  # before credentials are even looked for
        result = start(job, session=make_session(a.region), dry_run=a.dry_run, wait=a.wait)
    except LaunchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if a.dry_run:
        print(json.dumps(result, indent=2, default=str))
    else:
        print(f"started {result['TrainingJobName']}\n  follow: maskrcnn sagemaker "
              f"logs {result['TrainingJobName']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
