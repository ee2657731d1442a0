"""The README's deploy block ("Deploy, train, monitor, tear down"), replayed as written, in order.

Real: every `maskrcnn` line runs the installed console script in a subprocess, against a moto
server on 127.0.0.1 with fake credentials; each `npx cdk deploy` synthesizes the real app with the
settings the lines before it set and creates its stacks in moto's CloudFormation, and the
commands after it read those stacks' outputs; `maskrcnn data download` fetches the real URLs of
the COCO site and tensorpack's model site through a local HTTP proxy that serves small synthetic
archives in their place.

What the replay changes, and why (nothing else is touched):
- `maskrcnn settings` and `maskrcnn preflight` get a settings file in a temporary directory
  (`--file`, `--settings-file`), not the repository's settings.json.
- Service Quotas is answered by responses written from its API reference (tests/launch/recorded_aws/,
  not captured from AWS): moto has no EC2 quotas.
- The synthetic archives cannot match COCO's published md5s: the download runs as written first
  and must refuse them on those checksums, then again with `--checksum` for the three archives.
- Each deploy synthesizes offline (no account): the AMI is the Deep Learning AMI's SSM parameter,
  pointed at an image moto holds, as tests/infra/test_infra_moto_deploy.py does; an AMI the
  README pins with `ami_id` is swapped for that image. The lookup a real deploy makes and keeps
  in cdk.context.json: tests/infra/test_infra_ami.py.
- JOB_NAME and ENDPOINT_NAME are the names the commands before them printed.
- The master's `sudo maskrcnn job ...` lines need Slurm and the training container: they run on
  emulated hosts in tests/launch/test_cluster_slurm.py (submit, status, logs, stop, list). Here each
  is given to the tool without a cluster, which must accept its arguments and stop only because
  this is not a cluster node.
- `npx cdk destroy` is CloudFormation's DeleteStack (moto leaves NAT gateways, VPC endpoints and
  route tables behind and then cannot delete their VPC: the replay deletes those first). moto does not model
  updates, so a second deploy of a stack that exists changes nothing here:
  tests/infra/test_infra_redeploy.py checks what the README's second deploy changes.
"""
from __future__ import annotations

import hashlib
import http.server
import io
import json
import os
import re
import shlex
import subprocess
import sys
import zipfile
from contextlib import contextmanager
from pathlib import Path

import boto3
import numpy as np
import pytest

from infra import outputs
from launch.staging import download
from training.data import synthetic

from local_http import serving
from cdk_synth import REPO_ROOT, deploy_to_moto, prepare_moto_account, synthesize
from readme_block import readme_commands

sys.path.insert(0, str(REPO_ROOT / "tests" / "launch"))
from recorded_aws import Replay  # noqa: E402

MASKRCNN = Path(sys.executable).parent / "maskrcnn"
STACKS = [outputs.NETWORK_STORAGE_STACK, outputs.EFS_CLUSTER_STACK, outputs.SAGEMAKER_STACK]
DEPENDENCIES = {outputs.EFS_CLUSTER_STACK: [outputs.NETWORK_STORAGE_STACK],
                outputs.SAGEMAKER_STACK: [outputs.NETWORK_STORAGE_STACK], outputs.NETWORK_STORAGE_STACK: []}
# Service Quotas, shaped as its API reference documents (tests/launch/recorded_aws/
# get_service_quota.json): an account with the P quota at 192 vCPUs, then after the increase the
# pre-flight asks for.
P_QUOTA, EIP_QUOTA = "L-417A185B", "L-0263D0A3"
QUOTAS_BEFORE = {"GetServiceQuota": {P_QUOTA: "p-192", EIP_QUOTA: "elastic-ip-5"}}
QUOTAS_AFTER = {"GetServiceQuota": {P_QUOTA: "p-384", EIP_QUOTA: "elastic-ip-5"}}
COCO_ARCHIVES = ("train2017.zip", "val2017.zip", "annotations_trainval2017.zip")


# --- the internet the download reaches ---------------------------------------------------------

def _zip(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    return buffer.getvalue()


def _npz() -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **{"conv0/W": np.zeros((7, 7, 3, 64), np.float32)})
    return buffer.getvalue()


def synthetic_internet(tmp: Path) -> dict[str, bytes]:
    """The bodies served at the URLs the download fetches (launch/staging/download.py's list):
    COCO's three archives laid out as COCO's are, with a small synthetic dataset inside."""
    data = tmp / "dataset"
    synthetic.main(["--output", str(data), "--train", "4", "--val", "2", "--size", "64"])
    files = lambda folder, under: {f"{under}/{f.name}": f.read_bytes() for f in sorted(folder.iterdir())}
    bodies = {"train2017.zip": _zip(files(data / "train2017", "train2017")),
              "val2017.zip": _zip(files(data / "val2017", "val2017")),
              "annotations_trainval2017.zip": _zip(files(data / "annotations", "annotations")),
              "ImageNet-R50-AlignPadding.npz": _npz(), "COCO-R50FPN-MaskRCNN-Standard.npz": _npz()}
    return {artifact.url: bodies[artifact.name] for artifact in download.COCO_2017}


@contextmanager
def http_proxy(bodies: dict[str, bytes]):
    """An HTTP proxy on 127.0.0.1 that answers the absolute URLs it is asked for from `bodies`."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = bodies.get(self.path)
            self.send_response(200 if body is not None else 404)
            self.send_header("Content-Length", str(len(body or b"")))
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *args):
            pass

    with serving(Handler) as url:
        yield url


# --- the replay --------------------------------------------------------------------------------

class ReadmeReplay:
    """Runs the README's commands in one working directory, keeping what they printed."""

    def __init__(self, tmp: Path, internet: dict[str, bytes]):
        self.tmp, self.internet = tmp, internet
        self.cwd = tmp / "work"
        self.cwd.mkdir()
        self.home = tmp / "home"
        self.home.mkdir()
        self.settings_file = tmp / "settings.json"
        self.image_id = prepare_moto_account()
        self.cloudformation = boto3.client("cloudformation")
        self.created: dict[str, dict] = {}
        self.names: dict[str, str] = {}        # JOB_NAME, ENDPOINT_NAME -> what the commands printed
        self.readme_ami = None
        self.bucket = None
        self.ran: list[list[str]] = []

    def maskrcnn(self, args: list[str], *, env: dict | None = None, ok: bool = True):
        args = [self.names.get(a, a) for a in args]
        proc = subprocess.run([str(MASKRCNN), *args], cwd=self.cwd, capture_output=True, text=True, timeout=300,
                              env={**os.environ, "HOME": str(self.home), "SAGEMAKER_VALIDATE_ROLE": "false",
                                   "PYTHONPATH": str(REPO_ROOT), **(env or {})})
        if ok:
            assert proc.returncode == 0, f"maskrcnn {shlex.join(args)}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        self.ran.append(args)
        return proc

    def run(self, step: str, argv: list[str]) -> None:
        argv = [str(self.home) + a[1:] if a.startswith("~/") else a for a in argv]   # as a shell expands ~
        sudo = argv[0] == "sudo"
        if sudo:
            argv = argv[1:]
        if argv[:3] == ["npx", "cdk", "deploy"]:
            return self.deploy(argv[3:])
        if argv[:3] == ["npx", "cdk", "destroy"]:
            return self.destroy(argv[3:])
        assert argv[0] == "maskrcnn", f"the replay does not know this README command: {argv}"
        command, args = argv[1], argv[2:]
        if command == "settings":
            self.maskrcnn(["settings", "--file", str(self.settings_file), *args])
            self.readme_ami = next((a.partition("=")[2] for a in args if a.startswith("ami_id=")), self.readme_ami)
        elif command == "preflight":
            self.preflight(args)
        elif command == "cost":
            # The README's cluster, a master and 3 workers of p4d.24xlarge at $21.96/h (AWS's EC2
            # pricing page, infra/instance_types.py): 4 x 72 h x $21.96/h = $6,324.48.
            proc = self.maskrcnn(["cost", *args, "--settings-file", str(self.settings_file)])
            assert "estimated cost: $6324.48 = 4 x p4d.24xlarge x 72.00 h x $21.96/h" in proc.stdout, proc.stdout
        elif command == "data" and args[0] == "download":
            self.download(args)
        elif command == "job":
            assert sudo, "the master's commands need root: the wrapper runs them in the training container"
            self.on_master(args)
        else:
            proc = self.maskrcnn([command, *args])
            if command == "sagemaker" and args[0] == "start":
                self.names["JOB_NAME"] = re.match(r"started (\S+),", proc.stdout).group(1)
            if command == "endpoint" and args[0] == "deploy":
                self.names["ENDPOINT_NAME"] = json.loads(proc.stdout)["endpoint"]
                assert f"maskrcnn endpoint delete {self.names['ENDPOINT_NAME']}" in proc.stderr, proc.stderr
            if command == "cluster" and args[0] == "resume":
                # The deploys started no node; resume sets each group to the configured size.
                groups = boto3.client("autoscaling").describe_auto_scaling_groups()["AutoScalingGroups"]
                assert sorted((g["DesiredCapacity"], g["MaxSize"]) for g in groups) == [(1, 1), (3, 3)], groups
            if command == "cluster" and args[0] == "pause":
                groups = boto3.client("autoscaling").describe_auto_scaling_groups()["AutoScalingGroups"]
                assert len(groups) == 2 and all(g["DesiredCapacity"] == 0 for g in groups), groups

    def preflight(self, args: list[str]) -> None:
        args = [*args, "--settings-file", str(self.settings_file)]
        with Replay(QUOTAS_BEFORE).serve() as quotas:
            short = self.maskrcnn(["preflight", *args], env={"AWS_ENDPOINT_URL_SERVICE_QUOTAS": quotas}, ok=False)
        # The README's cluster: a master and 3 workers of 96 vCPUs = 384 vCPUs, against a quota of 192.
        assert short.returncode == 1, short.stdout + short.stderr
        assert re.search(r"FAIL  vcpu-quota: .* 192 available, 384 needed for 4 x p4d.24xlarge", short.stdout), short.stdout
        assert f"--quota-code {P_QUOTA} --desired-value 384" in short.stdout, short.stdout
        with Replay(QUOTAS_AFTER).serve() as quotas:   # once AWS has granted the increase
            self.maskrcnn(["preflight", *args], env={"AWS_ENDPOINT_URL_SERVICE_QUOTAS": quotas})

    def download(self, args: list[str]) -> None:
        with http_proxy(self.internet) as proxy:
            env = {"http_proxy": proxy, "no_proxy": "127.0.0.1"}
            refused = self.maskrcnn(["data", *args], env=env, ok=False)
            assert refused.returncode != 0 and "train2017.zip" in refused.stderr, refused.stderr
            assert "does not match its checksum md5:cced6f7f71b7629ddf16f17bbcfab6b2" in refused.stderr, refused.stderr
            by_name = {a.name: self.internet[a.url] for a in download.COCO_2017}
            pins = [f"--checksum={name}=md5:{hashlib.md5(by_name[name]).hexdigest()}" for name in COCO_ARCHIVES]
            self.maskrcnn(["data", *args, *pins], env=env)

    def on_master(self, args: list[str]) -> None:
        proc = self.maskrcnn(["job", "--cluster-env", str(self.tmp / "no-cluster.env"), *args], ok=False)
        assert proc.returncode == 2 and "not found: run this on a cluster node" in proc.stderr, (
            f"maskrcnn job {shlex.join(args)}: {proc.stderr}")

    def deploy(self, args: list[str]) -> None:
        assert all(not a.startswith("-") for a in args), f"the replay does not know these cdk options: {args}"
        synth = synthesize(self.tmp / f"synth-{len(self.ran)}", settings_file=self.settings_file)
        for stack in dict.fromkeys(dep for name in args for dep in [*DEPENDENCIES[name], name]):
            if stack in self.created:
                continue
            text = json.dumps(synth.templates[stack])
            if self.readme_ami:
                text = text.replace(self.readme_ami, self.image_id)
            made = deploy_to_moto(self.cloudformation, synth.stack_names[stack], json.loads(text))
            assert made["StackStatus"] == "CREATE_COMPLETE", (stack, made.get("StackStatusReason"))
            self.created[stack] = {o["OutputKey"]: o["OutputValue"] for o in made.get("Outputs", [])}
            self.bucket = self.created[stack].get(outputs.BUCKET_NAME, self.bucket)

    def destroy(self, args: list[str]) -> None:
        for stack in args:
            self.without_what_moto_cannot_delete(stack)
            self.cloudformation.delete_stack(StackName=stack)
            self.created.pop(stack)
            with pytest.raises(self.cloudformation.exceptions.ClientError, match="does not exist"):
                self.cloudformation.describe_stacks(StackName=stack)

    def without_what_moto_cannot_delete(self, stack: str) -> None:
        """moto's DeleteStack leaves a template's NAT gateways (with their network interfaces), VPC
        endpoints and route tables, which CloudFormation deletes, and then refuses to delete their
        VPC: they are deleted first."""
        ec2 = boto3.client("ec2")
        resources = self.cloudformation.list_stack_resources(StackName=stack)["StackResourceSummaries"]
        for vpc in [r["PhysicalResourceId"] for r in resources if r.get("ResourceType") == "AWS::EC2::VPC"]:
            where = [{"Name": "vpc-id", "Values": [vpc]}]
            for nat in ec2.describe_nat_gateways(Filters=where)["NatGateways"]:
                ec2.delete_nat_gateway(NatGatewayId=nat["NatGatewayId"])
                for address in nat["NatGatewayAddresses"]:   # AWS deletes a NAT gateway's interface with it
                    ec2.delete_network_interface(NetworkInterfaceId=address["NetworkInterfaceId"])
            endpoints = [e["VpcEndpointId"] for e in ec2.describe_vpc_endpoints(Filters=where)["VpcEndpoints"]]
            if endpoints:
                ec2.delete_vpc_endpoints(VpcEndpointIds=endpoints)
            for table in ec2.describe_route_tables(Filters=where)["RouteTables"]:
                if not any(a.get("Main") for a in table["Associations"]):
                    for association in table["Associations"]:
                        ec2.disassociate_route_table(AssociationId=association["RouteTableAssociationId"])
                    ec2.delete_route_table(RouteTableId=table["RouteTableId"])


@pytest.mark.slow
def test_the_readme_deploy_block_runs_as_written(aws_env, tmp_path):
    commands = readme_commands()
    steps = {step for step, _ in commands}
    assert {"1", "2", "3a", "3b", "4", "5"} <= steps, steps
    replay = ReadmeReplay(tmp_path, synthetic_internet(tmp_path))
    for step, argv in commands:
        replay.run(step, argv)

    # Step 1 deployed the three stacks with the settings it set; the AMI is kept by CDK's context
    # cache, not by a setting.
    assert "ami_id" not in json.loads(replay.settings_file.read_text())
    # Step 2 staged COCO's layout: the images, the annotations and the weights, uploaded to the
    # stack's bucket and copied to the EFS directory the notebook mounts.
    efs_coco = replay.home / "efs" / "data" / "coco"
    for relative in ("annotations/instances_train2017.json", "annotations/instances_val2017.json",
                     "weights/ImageNet-R50-AlignPadding.npz", "weights/COCO-R50FPN-MaskRCNN-Standard.npz"):
        assert (efs_coco / relative).is_file(), relative
    assert len(list((efs_coco / "train2017").iterdir())) == 4 and len(list((efs_coco / "val2017").iterdir())) == 2
    # Step 3b's job asked for what the line says.
    sm = boto3.client("sagemaker")
    job = sm.describe_training_job(TrainingJobName=replay.names["JOB_NAME"])
    assert job["ResourceConfig"]["InstanceType"] == "ml.p4d.24xlarge"
    assert job["ResourceConfig"]["InstanceCount"] == 2
    assert job["EnableManagedSpotTraining"] is True
    assert job["HyperParameters"]["backbone_weights"].strip('"') == "weights/ImageNet-R50-AlignPadding.npz"
    # After the tear-down nothing that is billed by the hour is left: no endpoint, no node group,
    # no notebook. The file system and the bucket with the staged data are kept, as the README says.
    assert sm.list_endpoints()["Endpoints"] == []
    assert boto3.client("autoscaling").describe_auto_scaling_groups()["AutoScalingGroups"] == []
    assert [n for n in sm.list_notebook_instances()["NotebookInstances"]
            if n["NotebookInstanceStatus"] != "Deleted"] == []
    assert boto3.client("efs").describe_file_systems()["FileSystems"]
    staged = boto3.client("s3").list_objects_v2(Bucket=replay.bucket, Prefix="data/coco/")
    assert staged["KeyCount"] > 0
