"""A smoke test of the whole project on your own AWS account, end to end, on small CPU instances.

    maskrcnn smoke-aws [--region us-east-1] [--yes] [--delete-data]      (or: make smoke-aws)

It prints its plan with the expected cost and time, checks the account (read-only), asks before it
creates anything, then runs these steps, and ALWAYS tears down what it deployed:

  deploy    cdk deploy of the three stacks with the CPU configuration (m5.xlarge nodes, 1 worker,
            100 GiB volumes) under the name prefix ``maskrcnn-smoke``: a deployment of its own,
            next to any real one
  dataset   the synthetic shapes dataset of the CPU preset, generated here and uploaded to the
            deployment's bucket
  stage     S3 -> EFS on the master (SSM Run Command: ``python -m launch.staging to-efs`` in its container)
  train     a 2-instance SageMaker job (launcher, ml.m5.xlarge) and a 2-node cluster job
            (``maskrcnn job submit --wait`` on the master over SSM: a Slurm job), both with the cpu_synthetic preset, at once
  results   both runs' final COCO tables from EFS; bbox and segm mAP@0.5 must reach the CPU demo's
            target, and SageMaker's scraped metrics must agree with the table
  teardown  stop what still runs, ``cdk destroy`` of the three stacks; the retained EFS file system
            and buckets are deleted with --delete-data, otherwise named with the commands to delete them

Every AWS call goes through boto3 (so AWS_ENDPOINT_URL reaches a local emulator), the CDK through the
pinned CLI in node_modules. What only a real account proves is listed in docs/launch.md.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

import boto3
from botocore.exceptions import ClientError

from infra import outputs
from infra.config import EBS_VOLUME_GIB
from infra.node_contract import EFS_MOUNT
from launch import cost
from launch.aws import LaunchError, make_session, require_output, stack_outputs
from launch.cluster import capacity

REPO_ROOT = Path(__file__).resolve().parent.parent
CDK_CLI = REPO_ROOT / "node_modules" / ".bin" / "cdk"
STACK_IDS = (outputs.NETWORK_STORAGE_STACK, outputs.EFS_CLUSTER_STACK, outputs.SAGEMAKER_STACK)
PRESET = "cpu_synthetic"
CDK_BOOTSTRAP_PARAMETER = "/cdk-bootstrap/hnb659fds/version"
CONTAINER = "maskrcnn"              # the training container on every node
JOB_COMMAND = ("/usr/local/bin/maskrcnn", "job")

# A runner executes one command line (argv, environment) and returns its exit status: the one
# boundary to the CDK CLI and Docker, replaceable by tests.
Runner = Callable[[Sequence[str], dict], int]

# List prices, USD per hour, us-east-1 on-demand (2025); other regions differ by up to ~30%. The
# instances' prices (EC2 and SageMaker ml.* types) are infra/instance_types.py's, through
# launch/cost.py; these are the rest.
PRICE_PER_HOUR = {"nat_gateway": 0.045, "public_ipv4": 0.005}
PRICE_PER_GB = {"nat_processing": 0.045}
PRICE_PER_GB_MONTH = {"gp3": 0.08, "ecr": 0.10}
HOURS_PER_MONTH = 730
IMAGE_GB = 3.0          # the training image, compressed in ECR (docs/launch.md "The training image")
# EFS, S3 requests, KMS, Secrets Manager, CloudWatch and flow logs of a deployment that lives ~2 h.
SMALL_ITEMS_USD = 0.10
# The image build (docs/launch.md: 20-40 min the first time) runs before anything exists on AWS.
IMAGE_BUILD_MINUTES = 30
# The nodes' start after the deploy: a boot, the image pull and the master waiting for its workers.
NODES_START_S = 45 * 60


@dataclasses.dataclass(frozen=True)
class Step:
    name: str
    what: str
    minutes: float        # expected wall time


def steps(settings: "Settings") -> tuple[Step, ...]:
    return (
        Step("deploy", "cdk deploy: build the training image (Docker here if it runs, else CodeBuild "
             "in the account), then the stacks; start the nodes, which boot and pull the image",
             IMAGE_BUILD_MINUTES + 25),
        Step("dataset", f"generate the synthetic dataset here, upload it to the bucket "
             f"({settings.dataset['train']} + {settings.dataset['val']} images)", 2),
        Step("stage", "S3 -> EFS on the master (SSM Run Command)", 3),
        Step("train", f"SageMaker {settings.sagemaker_instance_count} x "
             f"{settings.sagemaker_instance_type} and cluster {settings.cluster_nodes} x "
             f"{settings.cluster_instance_type}, both at once", 20),
        Step("results", "read both mAP tables from EFS, check them", 1),
        Step("teardown", "cdk destroy of the three stacks (and the data with --delete-data)", 20),
    )


@dataclasses.dataclass(frozen=True)
class Settings:
    region: str | None = None
    name_prefix: str = "maskrcnn-smoke"
    cluster_instance_type: str = "m5.xlarge"     # CPU: infra/instance_types.py accepts it for wiring tests
    worker_count: int = 1                        # + the master: a 2-node cluster
    ebs_volume_size_gib: int = EBS_VOLUME_GIB[0]  # the smallest infra/config.py allows (the AMI's ~100 GiB)
    sagemaker_instance_type: str = "ml.m5.xlarge"
    sagemaker_instance_count: int = 2
    sagemaker_volume_gb: int = 30
    job_timeout_s: int = 3600                    # each training job (SageMaker max run, SSM execution timeout)
    dataset: dict = dataclasses.field(default_factory=lambda: dict(_preset().DATASET))
    data_prefix: str = "data/maskrcnn-smoke"     # in the bucket, and under EFS's root
    delete_data: bool = False
    poll_seconds: float = 30.0

    @property
    def cluster_nodes(self) -> int:
        return self.worker_count + 1

    def stack_name(self, stack_id: str) -> str:
        return f"{self.name_prefix}-{stack_id}"

    def cdk_context(self) -> list[str]:
        """``-c key=value`` for every setting the deployment differs from the defaults in. It
        reads no settings file: the user's settings.json describes their own deployment."""
        pairs = {"settings_file": "none",
                 "instance_type": self.cluster_instance_type, "worker_count": self.worker_count,
                 "ebs_volume_size_gib": self.ebs_volume_size_gib, "efa": "false",
                 "name_prefix": self.name_prefix}
        return [arg for key, value in pairs.items() for arg in ("-c", f"{key}={value}")]


def _preset():
    import importlib
    return importlib.import_module(f"training.configs.{PRESET}")


def _app_config(context: list[str]):
    """The app's configuration for `-c key=value` flags (raises ConfigError as synth would)."""
    from infra import settings
    return settings.resolve(dict(a.split("=", 1) for a in context[1::2])).config


# --- plan: expected cost and time --------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class CostItem:
    what: str
    usd: float


def cost_items(settings: Settings, *, train_minutes: float | None = None) -> list[CostItem]:
    """What the run costs, from the instance types and the steps' durations (``train_minutes``
    replaces the train step's, e.g. with the jobs' timeouts for the worst case)."""
    plan = steps(settings)
    train = next(s for s in plan if s.name == "train")
    train_minutes = train.minutes if train_minutes is None else train_minutes
    # Everything deployed exists from the stacks' creation to the end of the teardown (the image
    # build runs before anything exists on AWS).
    alive_h = (sum(s.minutes for s in plan) - IMAGE_BUILD_MINUTES
               - train.minutes + train_minutes) / 60
    from infra.config import SETTINGS   # the smoke deployment keeps the notebook's defaults
    notebook = SETTINGS["notebook_instance_type"].default
    notebook_gib = SETTINGS["notebook_volume_size_gib"].default
    n = settings.cluster_nodes
    return [
        CostItem(f"EC2 cluster: {n} x {settings.cluster_instance_type}, {alive_h:.1f} h",
                 n * _price(settings.cluster_instance_type) * alive_h),
        CostItem(f"EBS gp3: {n} x {settings.ebs_volume_size_gib} GiB + notebook {notebook_gib} GiB",
                 (n * settings.ebs_volume_size_gib + notebook_gib) * PRICE_PER_GB_MONTH["gp3"]
                 / HOURS_PER_MONTH * alive_h),
        CostItem(f"SageMaker training: {settings.sagemaker_instance_count} x "
                 f"{settings.sagemaker_instance_type}, {train_minutes:.0f} min",
                 settings.sagemaker_instance_count * _price(settings.sagemaker_instance_type)
                 * train_minutes / 60),
        CostItem(f"SageMaker notebook: {notebook}", _price(notebook) * alive_h),
        CostItem(f"NAT gateway, and the workers pulling the {IMAGE_GB:.0f} GB image through it",
                 PRICE_PER_HOUR["nat_gateway"] * alive_h
                 + settings.worker_count * IMAGE_GB * PRICE_PER_GB["nat_processing"]),
        CostItem("public IPv4 addresses (NAT gateway, master)", 2 * PRICE_PER_HOUR["public_ipv4"] * alive_h),
        CostItem("EFS, S3, KMS, Secrets Manager, CloudWatch, flow logs", SMALL_ITEMS_USD),
    ]


def _price(instance_type: str) -> float:
    price = cost.price_per_hour(instance_type)
    if price is None:
        raise LaunchError(f"no price recorded for {instance_type!r} in infra/instance_types.py: add its "
                          f"on-demand price there, so the plan can state the cost")
    return price


def plan_text(settings: Settings, *, account: str | None = None) -> str:
    plan = steps(settings)
    items = cost_items(settings)
    worst = cost_items(settings, train_minutes=settings.job_timeout_s / 60)
    total_minutes = sum(s.minutes for s in plan)
    where = f"account {account}, " if account else ""
    lines = [f"Smoke test of maskrcnn-on-aws: {where}region {settings.region}, stacks "
             f"{', '.join(settings.stack_name(s) for s in STACK_IDS)}", "", "Steps (expected minutes):"]
    lines += [f"  {s.name:<9} {s.minutes:>4.0f}  {s.what}" for s in plan]
    lines += [f"  {'total':<9} {total_minutes:>4.0f}  (about {total_minutes / 60:.1f} h; the image build "
              f"({IMAGE_BUILD_MINUTES} min) is faster when Docker has it cached)", "",
              "Expected cost (us-east-1 on-demand list prices; other regions differ by up to ~30%):"]
    lines += [f"  ${i.usd:6.2f}  {i.what}" for i in items]
    lines += [f"  ${sum(i.usd for i in items):6.2f}  total",
              f"  at most ${sum(i.usd for i in worst):.2f} if both jobs run to their "
              f"{settings.job_timeout_s // 60}-minute timeout",
              "", "Left behind after the teardown:",
              f"  the training image in CDK's asset repository (ECR, ~{IMAGE_GB:.0f} GB: "
              f"${IMAGE_GB * PRICE_PER_GB_MONTH['ecr']:.2f}/month, shared with any other deployment)"]
    if settings.delete_data:
        lines.append("  nothing else: --delete-data deletes the retained EFS file system and buckets")
    else:
        lines.append("  the retained EFS file system and the two buckets (a few MB: cents a month); "
                     "--delete-data deletes them")
    return "\n".join(lines)


# --- the run -----------------------------------------------------------------------------------

class SmokeError(RuntimeError):
    """A step failed; the message says which and why."""


def run_subprocess(argv: Sequence[str], env: dict) -> int:
    return subprocess.call(list(argv), env=env, cwd=REPO_ROOT)


@dataclasses.dataclass
class JobResult:
    name: str
    run_name: str
    table: dict[str, float] | None = None


class Smoke:
    def __init__(self, settings: Settings, *, session: boto3.session.Session, runner: Runner,
                 out: Callable[[str], None] = print) -> None:
        self.settings = settings
        self.session = session
        self.runner = runner
        self.out = out
        self.deploy_started = False
        self.master_id: str | None = None
        self.sagemaker_job: str | None = None
        self.cluster_command: str | None = None
        self.retained: dict[str, list[str]] = {"buckets": [], "file_systems": []}
        self.env = dict(os.environ, AWS_REGION=session.region_name, AWS_DEFAULT_REGION=session.region_name)
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        self.cluster_run = f"smoke-cluster-{stamp}"

    # -- helpers --

    def _cdk(self, *args: str) -> int:
        if not CDK_CLI.exists():
            raise SmokeError(f"the pinned CDK CLI is not installed ({CDK_CLI}): run `make install`")
        return self.runner([str(CDK_CLI), *args, *self.settings.cdk_context()], self.env)

    def _outputs(self, stack_id: str) -> dict[str, str]:
        return stack_outputs(self.session, self.settings.stack_name(stack_id))

    def _wait(self, describe: Callable[[], str | None], what: str, timeout_s: float) -> str:
        """Polls ``describe`` (returns a final status, or None while running) until it finishes."""
        deadline = time.monotonic() + timeout_s
        while True:
            status = describe()
            if status is not None:
                return status
            if time.monotonic() > deadline:
                raise SmokeError(f"{what} did not finish within {timeout_s / 60:.0f} minutes")
            time.sleep(self.settings.poll_seconds)

    def send_command(self, script: str, *, comment: str, timeout_s: int) -> str:
        """Runs ``script`` as root on the master (SSM Run Command); returns the command id."""
        ssm = self.session.client("ssm")
        deadline = time.monotonic() + 600
        while True:
            try:
                return ssm.send_command(
                    InstanceIds=[self.master_id], DocumentName="AWS-RunShellScript",
                    Comment=comment[:100], TimeoutSeconds=600,
                    Parameters={"commands": [script], "executionTimeout": [str(timeout_s)]},
                )["Command"]["CommandId"]
            except ClientError as err:
                # The instance's SSM agent registers a little after the node signalled its boot.
                if err.response["Error"]["Code"] != "InvalidInstanceId" or time.monotonic() > deadline:
                    raise
                time.sleep(self.settings.poll_seconds)

    def command_result(self, command_id: str) -> dict | None:
        """The command's invocation once it has finished, None while it runs."""
        try:
            inv = self.session.client("ssm").get_command_invocation(CommandId=command_id,
                                                                   InstanceId=self.master_id)
        except ClientError as err:
            if err.response["Error"]["Code"] == "InvocationDoesNotExist":
                return None   # not yet visible right after SendCommand
            raise
        return None if inv["Status"] in ("Pending", "InProgress", "Delayed", "Cancelling") else inv

    def run_on_master(self, script: str, *, comment: str, timeout_s: int) -> str:
        """Runs ``script`` on the master and waits; its standard output, or SmokeError on failure."""
        command_id = self.send_command(script, comment=comment, timeout_s=timeout_s)
        inv = self._wait(lambda: self.command_result(command_id), comment, timeout_s + 600)
        if inv["Status"] != "Success":
            raise SmokeError(f"{comment} on the master ended {inv['Status']} (exit {inv.get('ResponseCode')}):\n"
                             f"{inv.get('StandardOutputContent', '')}{inv.get('StandardErrorContent', '')}")
        return inv.get("StandardOutputContent", "")

    # -- steps --

    def preflight(self) -> str:
        """Read-only checks before anything is created; returns the account id."""
        from infra.config import ConfigError
        context = self.settings.cdk_context()
        try:   # the app's own validation of what `cdk deploy -c ...` will pass (e.g. --name-prefix)
            config = _app_config(context)
        except ConfigError as err:
            raise SmokeError(f"infra/config.py refuses the smoke configuration: {err}") from None
        # The deployment pre-flight of any deploy (launch/preflight.py) for this configuration:
        # instance type in the zone, vCPU and Elastic IP quotas, stacks CloudFormation can deploy.
        from launch.preflight import format_results, run_checks
        results = run_checks(config, self.session)
        failed = [r for r in results if not r.ok]
        if failed:
            raise SmokeError("the pre-flight found what would stop the deploy (nothing was created):\n"
                             + "\n".join(f"  {r.name}: {r.message}" for r in failed))
        self.out("\npre-flight:\n" + format_results(results))
        account = self.session.client("sts").get_caller_identity()["Account"]
        try:
            self.session.client("ssm").get_parameter(Name=CDK_BOOTSTRAP_PARAMETER)
        except ClientError as err:
            if err.response["Error"]["Code"] != "ParameterNotFound":
                raise
            raise SmokeError(f"account {account} is not CDK-bootstrapped in {self.session.region_name}: run "
                             f"`npx cdk bootstrap aws://{account}/{self.session.region_name}` once") from None
        cfn = self.session.client("cloudformation")
        for stack_id in STACK_IDS:
            name = self.settings.stack_name(stack_id)
            try:
                status = cfn.describe_stacks(StackName=name)["Stacks"][0]["StackStatus"]
            except ClientError as err:
                if "does not exist" in str(err):
                    continue
                raise
            if status != "DELETE_COMPLETE":
                raise SmokeError(f"stack {name} already exists ({status}), probably from an earlier smoke run: "
                                 f"destroy it with `{CDK_CLI.relative_to(REPO_ROOT)} destroy --force "
                                 f"{' '.join(STACK_IDS)} {' '.join(self.settings.cdk_context())}`, "
                                 f"or pass another --name-prefix")
        return account

    def deploy(self) -> None:
        self.deploy_started = True
        if self._cdk("deploy", *STACK_IDS, "--require-approval", "never") != 0:
            raise SmokeError("cdk deploy failed (its output is above)")
        # A deploy sets no group's size (docs/infra.md): the nodes start as `maskrcnn cluster resume
        # --wait` starts them.
        names = capacity.group_names(self.session, self.settings.stack_name(outputs.EFS_CLUSTER_STACK))
        capacity.resume(self.session, capacity.describe_groups(self.session, names))
        try:
            groups = capacity.wait_in_service(self.session, names, timeout_s=NODES_START_S,
                                              poll_s=self.settings.poll_seconds)
        except LaunchError as err:
            raise SmokeError(str(err)) from None
        self.master_id = next(g for g in groups if g.role == "master").in_service[0]
        self.out(f"master node: {self.master_id}")

    def upload_dataset(self) -> str:
        from launch.staging import s3sync
        from training.data.synthetic import SyntheticSpec, generate

        bucket = require_output(self._outputs(outputs.EFS_CLUSTER_STACK), outputs.BUCKET_NAME,
                                self.settings.stack_name(outputs.EFS_CLUSTER_STACK))
        with tempfile.TemporaryDirectory(prefix="maskrcnn-smoke-") as tmp:
            generate(tmp, SyntheticSpec(**self.settings.dataset))
            report = s3sync.upload_tree(self.session, tmp, bucket, self.settings.data_prefix, concurrency=16)
        self.out(f"uploaded {len(report.transferred)} file(s) to s3://{bucket}/{self.settings.data_prefix}/")
        return bucket

    @property
    def efs_data_dir(self) -> str:
        return f"{EFS_MOUNT}/{self.settings.data_prefix}"

    def stage(self, bucket: str) -> None:
        to_efs = ["docker", "exec", CONTAINER, "python", "-m", "launch.staging", "to-efs",
                  "--region", self.session.region_name, "--bucket", bucket,
                  "--prefix", self.settings.data_prefix, "--efs-dir", self.efs_data_dir]
        # The SageMaker jobs' log channel is EFS /logs: it must exist before a job mounts it.
        script = f"set -e\n{shlex.join(to_efs)}\nmkdir -p {EFS_MOUNT}/logs/smoke\n"
        self.out(self.run_on_master(script, comment="stage the dataset to EFS", timeout_s=1800).strip())

    def start_sagemaker(self) -> JobResult:
        from launch.sagemaker.launcher import RUN_NAME_ENV, JobSpec, start_job
        s = self.settings
        spec = JobSpec(
            stack=s.stack_name(outputs.SAGEMAKER_STACK), base_job_name="maskrcnn-smoke",
            instance_type=s.sagemaker_instance_type, instance_count=s.sagemaker_instance_count,
            volume_size_gb=s.sagemaker_volume_gb, max_run_seconds=s.job_timeout_s,
            hyperparameters=preset_hyperparameters(), train_path=f"/{s.data_prefix}")
        request = start_job(spec, session=self.session)
        self.sagemaker_job = request["TrainingJobName"]
        self.out(f"SageMaker job {self.sagemaker_job} started")
        return JobResult(self.sagemaker_job, request["Environment"][RUN_NAME_ENV])

    def cluster_script(self) -> str:
        log = f"{EFS_MOUNT}/logs/smoke/{self.cluster_run}.log"
        train = [*JOB_COMMAND, "submit", "--wait", "--run-name", self.cluster_run, "--data-dir",
                 self.efs_data_dir, "--max-attempts", "1", *_preset().OVERRIDES]
        # The whole log stays on EFS; SSM keeps only the first 24,000 characters of the output.
        return (f"{shlex.join(train)} > {log} 2>&1\nrc=$?\ntail -n 30 {log}\n"
                f"echo \"full log: {log} on the master\"\nexit $rc\n")

    def start_cluster(self) -> JobResult:
        self.cluster_command = self.send_command(self.cluster_script(), comment="cluster training job",
                                                 timeout_s=self.settings.job_timeout_s)
        self.out(f"cluster job {self.cluster_run} started (SSM command {self.cluster_command})")
        return JobResult(self.cluster_command, self.cluster_run)

    def sagemaker_status(self) -> str | None:
        d = self.session.client("sagemaker").describe_training_job(TrainingJobName=self.sagemaker_job)
        status = d["TrainingJobStatus"]
        return None if status in ("InProgress", "Stopping") else status

    def wait_for_jobs(self) -> None:
        """Waits for the cluster job, then the SageMaker job; a failure of either ends the step
        (the teardown stops the other)."""
        timeout = self.settings.job_timeout_s + 900
        inv = self._wait(lambda: self.command_result(self.cluster_command), "the cluster job", timeout)
        self.out(f"cluster job: {inv['Status']}\n{inv.get('StandardOutputContent', '')}")
        if inv["Status"] != "Success":
            raise SmokeError(f"the cluster job ended {inv['Status']} (exit {inv.get('ResponseCode')}): "
                             f"{inv.get('StandardErrorContent', '')}")
        status = self._wait(self.sagemaker_status, f"SageMaker job {self.sagemaker_job}", timeout)
        self.out(f"SageMaker job {self.sagemaker_job}: {status}")
        if status != "Completed":
            reason = self.session.client("sagemaker").describe_training_job(
                TrainingJobName=self.sagemaker_job).get("FailureReason", "")
            raise SmokeError(f"SageMaker job {self.sagemaker_job} ended {status}: {reason}")

    def read_results(self, job: JobResult, what: str) -> dict[str, float]:
        from training.callbacks import EVAL_RESULTS_FILE
        from training.evaluation import format_table

        path = f"{EFS_MOUNT}/logs/{job.run_name}/{EVAL_RESULTS_FILE}"
        text = self.run_on_master(f"cat {shlex.quote(path)}", comment=f"read the {what} results", timeout_s=120)
        try:
            final = json.loads(text)[-1]
        except (ValueError, IndexError, KeyError):
            raise SmokeError(f"no evaluation results in {path} ({what}): the job did not reach its evaluation; "
                             f"the output was {text[:200]!r}") from None
        job.table = {k: v for k, v in final.items() if k.startswith("mAP")}
        self.out(f"\n{what} (run {job.run_name}), epoch {final.get('epoch')}, step {final.get('global_step')}:\n"
                 f"{format_table(job.table)}")
        return job.table

    def sagemaker_metrics(self) -> dict[str, float]:
        d = self.session.client("sagemaker").describe_training_job(TrainingJobName=self.sagemaker_job)
        return {m["MetricName"]: m["Value"] for m in d.get("FinalMetricDataList", [])}

    # -- teardown --

    def collect_retained(self) -> None:
        """The resources the network stack retains on delete (file system, buckets), named now:
        after the destroy they belong to no stack."""
        name = self.settings.stack_name(outputs.NETWORK_STORAGE_STACK)
        cfn = self.session.client("cloudformation")
        try:
            resources = cfn.describe_stack_resources(StackName=name)["StackResources"]
            body = cfn.get_template(StackName=name)["TemplateBody"]
        except ClientError:
            return   # never created
        template = json.loads(body) if isinstance(body, str) else body
        types = {lid: r.get("Type") for lid, r in template.get("Resources", {}).items()}
        for r in resources:
            kind = r.get("ResourceType") or types.get(r.get("LogicalResourceId"))
            if kind == "AWS::S3::Bucket" and r.get("PhysicalResourceId"):
                self.retained["buckets"].append(r["PhysicalResourceId"])
            elif kind == "AWS::EFS::FileSystem" and r.get("PhysicalResourceId"):
                self.retained["file_systems"].append(r["PhysicalResourceId"])

    def stop_jobs(self) -> None:
        if self.sagemaker_job and self.sagemaker_status() is None:
            self.out(f"stopping SageMaker job {self.sagemaker_job}")
            self.session.client("sagemaker").stop_training_job(TrainingJobName=self.sagemaker_job)
            # Its network interfaces in the VPC go away only when it has stopped; until then the
            # subnets and security groups cannot be deleted.
            self._wait(self.sagemaker_status, "stopping the SageMaker job", 1800)
        if self.cluster_command and self.command_result(self.cluster_command) is None:
            self.out(f"cancelling the cluster job (SSM command {self.cluster_command})")
            self.session.client("ssm").cancel_command(CommandId=self.cluster_command)

    def destroy(self) -> bool:
        if self._cdk("destroy", "--force", *STACK_IDS) != 0:
            return False
        cfn = self.session.client("cloudformation")
        for stack_id in STACK_IDS:
            try:
                status = cfn.describe_stacks(StackName=self.settings.stack_name(stack_id))["Stacks"][0]["StackStatus"]
            except ClientError:
                continue
            if status != "DELETE_COMPLETE":
                return False
        return True

    def delete_data(self) -> None:
        efs, s3 = self.session.client("efs"), self.session.client("s3")
        for fs_id in self.retained["file_systems"]:
            # Its mount targets belonged to the destroyed stack; the file system goes once they are gone.
            self._wait(lambda: "gone" if not efs.describe_mount_targets(FileSystemId=fs_id)["MountTargets"] else None,
                       f"the mount targets of {fs_id}", 900)
            efs.delete_file_system(FileSystemId=fs_id)
            self.out(f"deleted EFS file system {fs_id}")
        for bucket in self.retained["buckets"]:
            paginator = s3.get_paginator("list_object_versions")
            for page in paginator.paginate(Bucket=bucket):
                objects = [{"Key": o["Key"], "VersionId": o["VersionId"]}
                           for o in page.get("Versions", []) + page.get("DeleteMarkers", [])]
                if objects:
                    s3.delete_objects(Bucket=bucket, Delete={"Objects": objects, "Quiet": True})
            s3.delete_bucket(Bucket=bucket)
            self.out(f"deleted bucket {bucket}")

    def teardown(self) -> bool:
        """Stops what runs and destroys the stacks; True when nothing deployed is left running."""
        ok = True
        try:
            self.stop_jobs()
        except Exception as err:  # the destroy must still run
            self.out(f"teardown: could not stop the jobs ({err}); destroying anyway")
            ok = False
        try:
            self.collect_retained()
        except Exception as err:
            self.out(f"teardown: could not list the retained resources ({err}); destroying anyway")
        destroy_cmd = (f"{CDK_CLI.relative_to(REPO_ROOT)} destroy --force {' '.join(STACK_IDS)} "
                       f"{' '.join(self.settings.cdk_context())}")
        if not self.destroy():
            self.out(f"TEARDOWN FAILED: stacks of the smoke run may still exist and cost money. Rerun\n"
                     f"  {destroy_cmd}\nand check the CloudFormation console in {self.session.region_name}")
            return False
        self.out("stacks destroyed")
        if self.settings.delete_data:
            self.delete_data()
        elif any(self.retained.values()):
            self.out("retained (delete them when you no longer need the logs):\n" + "\n".join(
                [f"  aws efs delete-file-system --file-system-id {f}" for f in self.retained["file_systems"]]
                + [f"  aws s3 rb --force s3://{b}" for b in self.retained["buckets"]]))
        return ok


def preset_hyperparameters() -> dict[str, str]:
    """The CPU preset as SageMaker hyperparameters (``config:KEY``)."""
    return {f"config:{key}": value for key, _, value in (o.partition("=") for o in _preset().OVERRIDES)}


def check_tables(results: dict[str, dict[str, float]], sagemaker_metrics: dict[str, float],
                 sagemaker_label: str) -> list[str]:
    """Problems with the final tables: mAP@0.5 below the CPU demo's target, or SageMaker's scraped
    metrics disagreeing with the table its job wrote."""
    from training.local_job import TARGET_AP50
    from training.metrics import map_metric_name

    problems = []
    for label, table in results.items():
        for iou_type in ("bbox", "segm"):
            name = map_metric_name(iou_type, "IoU=0.5")
            value = table.get(name)
            if value is None or value < TARGET_AP50:
                problems.append(f"{label}: {name} is {value}, below the target {TARGET_AP50}")
    table = results.get(sagemaker_label, {})
    for name, value in table.items():
        scraped = sagemaker_metrics.get(name)
        # 6 significant digits in the log line (training.metrics.format_metric); -1 (no such
        # objects) is a value too.
        if name.endswith("IoU=0.5") and (scraped is None or abs(scraped - value) > 1e-4):
            problems.append(f"{sagemaker_label}: SageMaker's metric {name} is {scraped}, the table says {value}")
    return problems


def run(settings: Settings, *, session: boto3.session.Session, runner: Runner, assume_yes: bool,
        out: Callable[[str], None] = print) -> int:
    smoke = Smoke(settings, session=session, runner=runner, out=out)
    out(plan_text(settings))
    try:
        account = smoke.preflight()
    except (SmokeError, ClientError) as err:
        out(f"\nerror: {err}")
        return 2
    out(f"\nchecked: account {account}, region {session.region_name}, CDK bootstrapped, "
        f"no smoke stacks present")
    if not assume_yes:
        try:
            answer = input(f"Create these resources in account {account}, {session.region_name}? [y/N] ")
        except EOFError:
            answer = ""
        if answer.strip().lower() not in ("y", "yes"):
            out("nothing created")
            return 1

    started = time.monotonic()
    current = "deploy"
    failure = None
    try:
        def step(name: str) -> None:
            nonlocal current
            current = name
            out(f"\n== {name} ({(time.monotonic() - started) / 60:.1f} min)")

        step("deploy")
        smoke.deploy()
        step("dataset")
        bucket = smoke.upload_dataset()
        step("stage")
        smoke.stage(bucket)
        step("train")
        sagemaker = smoke.start_sagemaker()
        cluster = smoke.start_cluster()
        smoke.wait_for_jobs()
        step("results")
        labels = (f"cluster {settings.cluster_nodes} x {settings.cluster_instance_type}",
                  f"SageMaker {settings.sagemaker_instance_count} x {settings.sagemaker_instance_type}")
        tables = {labels[0]: smoke.read_results(cluster, labels[0]),
                  labels[1]: smoke.read_results(sagemaker, labels[1])}
        problems = check_tables(tables, smoke.sagemaker_metrics(), labels[1])
        if problems:
            raise SmokeError("\n".join(problems))
    except (SmokeError, LaunchError) as err:
        failure = f"step {current} failed: {err}"
        out(f"\n{failure}")
    except Exception as err:  # an AWS error or a bug: report it, and still tear down
        failure = f"step {current} failed: {type(err).__name__}: {err}"
        traceback.print_exc()
        out(f"\n{failure}")
    except KeyboardInterrupt:
        failure = f"interrupted during step {current}"
        out(f"\n{failure}")
    finally:
        torn_down = True
        if smoke.deploy_started:
            out(f"\n== teardown ({(time.monotonic() - started) / 60:.1f} min)")
            torn_down = smoke.teardown()
    minutes = (time.monotonic() - started) / 60
    if failure or not torn_down:
        out(f"\nSMOKE TEST FAILED after {minutes:.0f} min: {failure or 'teardown incomplete'}")
        return 1
    out(f"\nSMOKE TEST PASSED in {minutes:.0f} min: both jobs reached the mAP target; stacks destroyed")
    return 0


def main(argv: list[str] | None = None, *, runner: Runner = run_subprocess,
         session: boto3.session.Session | None = None) -> int:
    p = argparse.ArgumentParser(prog="maskrcnn smoke-aws", description=__doc__.splitlines()[0])
    p.add_argument("--region")
    p.add_argument("--yes", action="store_true", help="do not ask before creating resources")
    p.add_argument("--delete-data", action="store_true",
                   help="also delete the EFS file system and buckets the stacks retain")
    p.add_argument("--name-prefix", default=Settings.name_prefix,
                   help="prefix of the smoke deployment's stack names (separate from any real deployment)")
    a = p.parse_args(argv)
    try:
        session = session or make_session(a.region)
        settings = Settings(region=session.region_name, name_prefix=a.name_prefix, delete_data=a.delete_data)
        return run(settings, session=session, runner=runner, assume_yes=a.yes)
    except LaunchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
