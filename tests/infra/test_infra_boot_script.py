"""The cluster nodes' boot, run for real: the master's and a worker's user data, as CloudFormation
(moto) rendered them into the launch templates, executed side by side with the real AWS CLI
against moto, and curl against a local IMDSv2 endpoint. The boot steps the user
data fetches are the stack's file asset, published into moto's CDK assets bucket as `cdk deploy`
would publish it.

Only what cannot exist here is stood in for: docker, nvidia-smi (as many GPUs as the instance
type has, or fewer: an AMI whose driver cannot drive them), mount/mountpoint (EFS becomes a local
directory), systemctl, apt-get, dpkg and the CloudWatch agent's control script. Each node runs in
a private mount namespace whose /etc, /usr/local/bin and /var/log are copies (and TMPDIR its own),
so nothing on this machine is touched.
"""
from __future__ import annotations

import base64
import http.server
import json
import os
import shutil
import subprocess
import textwrap
import threading
from pathlib import Path

import boto3
import pytest

from infra import outputs
from infra.userdata import CLUSTER_NODE_SCRIPT

from cdk_synth import deploy_to_moto, prepare_moto_account
from machine import require

CLUSTER = outputs.EFS_CLUSTER_STACK
GPUS_OF_TYPE = 8
# The boot script's poll period while the master waits for every node to register (15 s on an
# instance): the same wait, without 15 s of idle time each.
POLL_SECONDS = "1"
STUBS = {
    "nvidia-smi": 'for ((i = 0; i < NODE_GPUS; i++)); do echo "GPU $i: NVIDIA A10G (UUID: GPU-$i)"; done',
    "docker": 'echo "docker $*" >> "$NODE_CALLS"; [ "$1" != login ] || cat > "$NODE_CALLS.password"',
    "mount": 'echo "mount $*" >> "$NODE_CALLS"; echo "${*: -1}" >> "$NODE_CALLS.mounted"',
    # The instance-store NVMe is mounted where NODE_NVME says (the master here); EFS (and /fsx)
    # once `mount` was called for it.
    "mountpoint": 'p="${*: -1}"; [ "$p" = "$NODE_NVME" ] && exit 0; '
                  'grep -qxF -- "$p" "$NODE_CALLS.mounted" 2>/dev/null',
    "apt-get": 'echo "apt-get $*" >> "$NODE_CALLS"',
    "mount.nfs4": "exit 0",
    "systemctl": 'echo "systemctl $*" >> "$NODE_CALLS"',
    "dpkg": '[ "$1" = --print-architecture ] && echo amd64 || echo "dpkg $*" >> "$NODE_CALLS"',
    # As if the AMI had the CloudWatch agent (the Deep Learning AMIs do): the boot starts it.
    "amazon-cloudwatch-agent-ctl": 'echo "amazon-cloudwatch-agent-ctl $*" >> "$NODE_CALLS"',
}


def _sandbox_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "needs root for a private mount namespace (unshare -m)"
    if not shutil.which("unshare") or subprocess.run(
            ["unshare", "--mount", "true"], capture_output=True).returncode != 0:
        return "unshare --mount is not permitted here"
    if not shutil.which("aws"):
        return "the AWS CLI (aws) is not installed"
    return None


pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _needs_a_sandbox():
    require(_sandbox_unavailable())


class _Imds(http.server.BaseHTTPRequestHandler):
    """IMDSv2 as EC2 serves it: a token from PUT, required on every GET."""
    metadata: dict[str, str] = {}
    TOKEN = "imds-token"

    def do_PUT(self):
        ok = self.path == "/latest/api/token"
        self.send_response(200 if ok else 404)
        self.end_headers()
        self.wfile.write(self.TOKEN.encode() if ok else b"")

    def do_GET(self):
        value = self.metadata.get(self.path.removeprefix("/latest/meta-data/"))
        if self.headers.get("X-aws-ec2-metadata-token") != self.TOKEN:
            self.send_response(401)
        else:
            self.send_response(200 if value else 404)
        self.end_headers()
        self.wfile.write((value or "").encode())

    def log_message(self, *args):
        pass


def _imds(instance_id: str, private_ip: str, instance_type: str, ami_id: str = "") -> str:
    metadata = {"instance-id": instance_id, "local-ipv4": private_ip, "instance-type": instance_type}
    if ami_id:
        metadata["ami-id"] = ami_id
    handler = type("Imds", (_Imds,), {"metadata": metadata})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}"


def _launch_template_user_data(logical_prefix: str) -> str:
    resources = boto3.client("cloudformation").list_stack_resources(
        StackName=CLUSTER)["StackResourceSummaries"]
    (template_id,) = [r["PhysicalResourceId"] for r in resources
                      if r["ResourceType"] == "AWS::EC2::LaunchTemplate"
                      and r["LogicalResourceId"].startswith(logical_prefix)]
    (version,) = boto3.client("ec2").describe_launch_template_versions(
        LaunchTemplateId=template_id)["LaunchTemplateVersions"]
    return base64.b64decode(version["LaunchTemplateData"]["UserData"]).decode()


def _node_log_group() -> str:
    """The name CloudFormation gave the cluster stack's log group: under /maskrcnn/<stack>/,
    unique to this deployment of the stack (its id's UUID), so a retained group never clashes
    with the next deployment's."""
    (stack,) = boto3.client("cloudformation").describe_stacks(StackName=CLUSTER)["Stacks"]
    (name,) = [r["PhysicalResourceId"] for r in boto3.client("cloudformation").list_stack_resources(
        StackName=CLUSTER)["StackResourceSummaries"] if r["ResourceType"] == "AWS::Logs::LogGroup"]
    assert name == f"/maskrcnn/{CLUSTER}/nodes-{stack['StackId'].split('/')[2]}"
    return name


def _instance(group_name: str) -> tuple[str, str]:
    """An instance of the group, which the deploy creates at 0 nodes: started as `maskrcnn cluster
    resume` starts it (desired capacity to MaxSize)."""
    asg = boto3.client("autoscaling")
    (group,) = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[group_name])["AutoScalingGroups"]
    if not group["Instances"]:
        asg.set_desired_capacity(AutoScalingGroupName=group_name, DesiredCapacity=group["MaxSize"])
        (group,) = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[group_name])["AutoScalingGroups"]
    instance_id = group["Instances"][0]["InstanceId"]
    (reservation,) = boto3.client("ec2").describe_instances(
        InstanceIds=[instance_id])["Reservations"]
    return instance_id, reservation["Instances"][0]["PrivateIpAddress"]


def publish_file_assets(synth, stack: str) -> None:
    """What `cdk deploy` does before it deploys `stack`: its file assets (the cluster's boot
    steps) put into the CDK assets bucket, as the stack's assets manifest places them."""
    manifest = json.loads((synth.outdir / f"{stack}.assets.json").read_text())
    account = boto3.client("sts").get_caller_identity()["Account"]
    s3 = boto3.client("s3")
    region = s3.meta.region_name
    for asset in manifest["files"].values():
        for destination in asset["destinations"].values():
            bucket = (destination["bucketName"].replace("${AWS::AccountId}", account)
                      .replace("${AWS::Region}", region))
            s3.create_bucket(Bucket=bucket)   # us-east-1: no location constraint
            s3.upload_file(str(synth.outdir / asset["source"]["path"]), bucket,
                           destination["objectKey"])


MUNGE_KEY = "generated-munge-key"


def deploy_cluster(synth) -> dict[str, str]:
    """Both stacks in moto, the assets published and the munge key's secret created (moto's
    CloudFormation has no AWS::SecretsManager::Secret; the value stands in for the one
    CloudFormation generates): the cluster stack's outputs."""
    prepare_moto_account()
    cloudformation = boto3.client("cloudformation")
    publish_file_assets(synth, CLUSTER)
    for name in (outputs.NETWORK_STORAGE_STACK, CLUSTER):
        stack = deploy_to_moto(cloudformation, name, synth.templates[name])
        assert stack["StackStatus"] == "CREATE_COMPLETE"
    boto3.client("secretsmanager").create_secret(Name=f"{CLUSTER}-munge-key", SecretString=MUNGE_KEY)
    return {o["OutputKey"]: o["OutputValue"] for o in stack["Outputs"]}


def subscribe_alerts_queue() -> tuple[str, str]:
    """An SQS queue subscribed to the deployed alerts topic, to read what the topic was told: the
    topic's ARN and the queue's URL."""
    (topic_arn,) = [r["PhysicalResourceId"] for r in boto3.client("cloudformation")
                    .list_stack_resources(StackName=outputs.NETWORK_STORAGE_STACK)["StackResourceSummaries"]
                    if r["ResourceType"] == "AWS::SNS::Topic"]
    sqs = boto3.client("sqs")
    queue_url = sqs.create_queue(QueueName="alerts")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])[
        "Attributes"]["QueueArn"]
    boto3.client("sns").subscribe(TopicArn=topic_arn, Protocol="sqs", Endpoint=queue_arn)
    return topic_arn, queue_url


def make_stubs(directory: Path) -> Path:
    directory.mkdir()
    for name, body in STUBS.items():
        (directory / name).write_text("#!/bin/bash\n" + textwrap.dedent(body) + "\n")
        (directory / name).chmod(0o755)
    return directory


def node_user_data(logical_prefix: str, efs: Path, nvme: Path | None = None) -> str:
    """A launch template's user data as moto rendered it, with the mount points moved under the
    test's directory."""
    user_data = _launch_template_user_data(logical_prefix)
    assert "\nEFS_MOUNT=/efs\n" in user_data and "\nNVME_MOUNT=/opt/dlami/nvme\n" in user_data
    user_data = user_data.replace("\nEFS_MOUNT=/efs\n", f"\nEFS_MOUNT={efs}\n")
    if nvme is not None:
        user_data = user_data.replace("\nNVME_MOUNT=/opt/dlami/nvme\n", f"\nNVME_MOUNT={nvme}\n")
    return user_data


def _start_node(root: Path, user_data: str, imds: str, stubs: Path,
                gpus: int, nvme: str = "", extra_env: dict[str, str] | None = None) -> subprocess.Popen:
    (root / "log").mkdir(parents=True)
    (root / "bin").mkdir()
    (root / "etc").mkdir()
    (root / "tmp").mkdir()
    subprocess.run(["cp", "-a", "/etc/.", str(root / "etc")], check=True)
    (root / "etc" / "MASKRCNN_SANDBOX").touch()
    (root / "user-data").write_text(user_data)
    # Absolute paths: the stubs directory leads PATH and has its own `mount`. The marker check
    # stops everything if /etc is not the copy.
    setup = (f"/usr/bin/mount --bind {root / 'etc'} /etc"
             f" && /usr/bin/mount --bind {root / 'bin'} /usr/local/bin"
             f" && /usr/bin/mount --bind {root / 'log'} /var/log"
             f" && test -e /etc/MASKRCNN_SANDBOX && exec bash {root / 'user-data'}")
    env = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}",
           "NODE_CALLS": str(root / "calls.log"), "AWS_EC2_METADATA_SERVICE_ENDPOINT": imds,
           "NODE_GPUS": str(gpus), "NODE_NVME": nvme, "MASKRCNN_BOOT_POLL_SECONDS": POLL_SECONDS,
           "CLOUDWATCH_AGENT_CTL": str(stubs / "amazon-cloudwatch-agent-ctl"),
           # No agent really ships the log here: a failing node need not wait for it.
           "MASKRCNN_BOOT_LOG_FLUSH_SECONDS": "0", "TMPDIR": str(root / "tmp"),
           **(extra_env or {})}
    return subprocess.Popen(["unshare", "--mount", "--propagation", "private", "bash", "-c", setup],
                            env=env, stdout=(root / "console.log").open("w"),
                            stderr=subprocess.STDOUT)


def test_master_and_worker_boot_into_the_node_contract(aws_env, default_synth, tmp_path):
    stack_outputs = deploy_cluster(default_synth)
    instance_type = default_synth.context["instance_type"]
    assert instance_type == "g5.48xlarge"   # GPUS_OF_TYPE: what DescribeInstanceTypes says

    efs = tmp_path / "efs"
    efs.mkdir()
    nvme = tmp_path / "nvme"
    nvme.mkdir()
    stubs = make_stubs(tmp_path / "stubs")

    nodes = {}
    for role, prefix, group in (("master", "ClusterMaster", stack_outputs[outputs.MASTER_ASG_NAME]),
                                ("worker", "ClusterWorker", stack_outputs[outputs.WORKER_ASG_NAME])):
        user_data = node_user_data(prefix, efs, nvme)
        instance_id, ip = _instance(group)
        nodes[role] = {"id": instance_id, "ip": ip, "root": tmp_path / role,
                       "user_data": user_data, "imds": _imds(instance_id, ip, instance_type)}
        # The worker starts first; the master waits for it to register.
        # The master's type has instance-store NVMe, the worker's not (as if another type).
        nodes[role]["process"] = _start_node(tmp_path / role, user_data, nodes[role]["imds"],
                                             stubs, gpus=GPUS_OF_TYPE,
                                             nvme=str(nvme) if role == "master" else "")
    for role, node in nodes.items():
        returncode = node["process"].wait(timeout=240)
        console = (node["root"] / "console.log").read_text()
        assert returncode == 0, f"{role} boot failed:\n{console}"

    master, worker = nodes["master"], nodes["worker"]
    log_group = _node_log_group()
    for node in (master, worker):
        etc = node["root"] / "etc" / "maskrcnn"
        # The steps that ran are the repository's cluster_node.sh, fetched from the assets bucket.
        assert (etc / "cluster_node.sh").read_bytes() == CLUSTER_NODE_SCRIPT.read_bytes()
        # First of all the CloudWatch agent starts on the boot's log and cloud-init's output: to
        # the deployment's log group, streams named by the instance.
        agent_config = json.loads((etc / "cloudwatch-agent.json").read_text())
        assert agent_config["agent"] == {"run_as_user": "root"}
        assert agent_config["logs"]["logs_collected"]["files"]["collect_list"] == [
            {"file_path": "/var/log/cloud-init-output.log", "log_group_name": log_group,
             "log_stream_name": f"{node['id']}/cloud-init-output.log"},
            {"file_path": "/var/log/maskrcnn-boot.log", "log_group_name": log_group,
             "log_stream_name": f"{node['id']}/maskrcnn-boot.log"}]
        assert (node["root"] / "calls.log").read_text().splitlines()[0] == (
            "amazon-cloudwatch-agent-ctl -a fetch-config -m ec2 -s "
            "-c file:/etc/maskrcnn/cloudwatch-agent.json")
        env = dict(line.split("=", 1) for line in (etc / "cluster.env").read_text().splitlines())
        assert env["FILE_SYSTEM_ID"] == stack_outputs[outputs.FILE_SYSTEM_ID]
        assert env["BUCKET_NAME"] == stack_outputs[outputs.BUCKET_NAME]
        # The container's sshd listens on the private address only.
        assert env["PRIVATE_IP"] == node["ip"]
        # Master first, then workers; GPU counts from nvidia-smi -L.
        assert (etc / "hostfile").read_text() == (f"{master['ip']} slots=8\n"
                                                  f"{worker['ip']} slots=8\n")
        assert (efs / ".maskrcnn" / CLUSTER / "nodes" / node["ip"]).read_text() == \
            f"{node['ip']} slots=8\n"
        # After a reboot Docker starts only once EFS is mounted again (systemd orders it after
        # the mount unit of the fstab line), and the bind mount follows later mounts.
        drop_in = node["root"] / "etc" / "systemd" / "system" / "docker.service.d"
        local = f" {nvme}" if node is master else ""
        assert (drop_in / "maskrcnn-efs.conf").read_text() == (
            f"[Unit]\nRequiresMountsFor={efs}{local}\n")
        # The instance-store NVMe, when there is one, is the dataset's staging target.
        assert env["LOCAL_NVME"] == (str(nvme) if node is master else "")
        fstab = (node["root"] / "etc" / "fstab").read_text()
        assert (f"{env['FILE_SYSTEM_ID']}.efs.us-east-1.amazonaws.com:/ {efs} nfs4 nfsvers=4.1,"
                "rsize=1048576,wsize=1048576,hard,timeo=600,retrans=2,noresvport,_netdev 0 0"
                in fstab)
        # Slurm's munge key, from the stack's secret, readable by root only.
        assert (etc / "munge.key").read_text() == MUNGE_KEY
        assert (etc / "munge.key").stat().st_mode & 0o777 == 0o400
        calls = (node["root"] / "calls.log").read_text().splitlines()
        image = stack_outputs[outputs.TRAINING_IMAGE_URI]
        assert f"docker login --username AWS --password-stdin {image.split('/')[0]}" in calls
        assert f"docker pull --quiet {image}" in calls
        assert calls.index("systemctl daemon-reload") < calls.index(
            f"docker pull --quiet {image}")
        nvme_volume = f"-v {nvme}:{nvme} " if node is master else ""
        assert [c for c in calls if c.startswith("docker run ")] == [
            f"docker run -d --name maskrcnn --restart unless-stopped --gpus all {nvme_volume}"
            f"--network host --ipc host --cap-add SYSLOG -v {efs}:{efs}:rslave -v /etc/maskrcnn:/etc/maskrcnn:ro "
            f"{image} cluster-node"]
        assert 'exec docker exec -i maskrcnn maskrcnn-entrypoint maskrcnn "$@"' in (
            node["root"] / "bin" / "maskrcnn").read_text()
        # The idle check (idle_scaledown_minutes, 30 by default): a timer on the master only.
        timer = node["root"] / "etc" / "systemd" / "system" / "maskrcnn-idle.timer"
        assert timer.exists() == (node is master)
        assert ("systemctl enable --now maskrcnn-idle.timer" in calls) == (node is master)
        if node is master:
            assert "OnCalendar=minutely" in timer.read_text()
            assert "docker exec maskrcnn python -m launch.cluster.idle" in (
                node["root"] / "bin" / "maskrcnn-idle-check").read_text()
        assert "ready: 8 GPUs" in (node["root"] / "log" / "maskrcnn-boot.log").read_text()

    # The master attached the Elastic IP that MasterAddress names.
    (address,) = boto3.client("ec2").describe_addresses(
        PublicIps=[stack_outputs[outputs.MASTER_ADDRESS]])["Addresses"]
    assert address["InstanceId"] == master["id"]
    # Nothing escaped the sandbox.
    # (Only the files: other tests may leave an empty /etc/maskrcnn as a mount point.)
    assert not Path("/etc/maskrcnn/cluster.env").exists()
    assert str(efs) not in Path("/etc/fstab").read_text()
    assert not Path("/etc/systemd/system/docker.service.d/maskrcnn-efs.conf").exists()
    assert not Path("/etc/systemd/system/maskrcnn-idle.timer").exists()

    # A replacement worker of a cluster with FSx for Lustre (fsx_lustre_storage_gib): the cluster.env
    # lines the variant template renders (test_infra_stacks.py checks them there; moto has no FSx).
    # The AMI has no Lustre client: the node adds the FSx apt repository (its key served from a
    # local file here), installs the client modules of its kernel, mounts /fsx, and the container
    # gets it; Docker waits for it after a reboot.
    fsx = tmp_path / "fsx"
    fsx_dns = "fs-0fedcba9876543210.fsx.us-east-1.amazonaws.com"
    apt_key = tmp_path / "fsx-ubuntu-public-key.asc"
    apt_key.write_text("-----BEGIN PGP PUBLIC KEY BLOCK-----\nstand-in\n")
    fsx_user_data = worker["user_data"].replace(
        "\nEFS_MOUNT=", f"\nFSX_MOUNT={fsx}\nFSX_DNS_NAME={fsx_dns}\nFSX_MOUNT_NAME=abcdefgh\nEFS_MOUNT=", 1)
    with_fsx = tmp_path / "worker-with-fsx"
    process = _start_node(with_fsx, fsx_user_data, worker["imds"], stubs, gpus=GPUS_OF_TYPE,
                          extra_env={"FSX_APT_KEY_URL": apt_key.as_uri()})
    assert process.wait(timeout=240) == 0, (with_fsx / "console.log").read_text()
    calls = (with_fsx / "calls.log").read_text().splitlines()
    kernel = os.uname().release
    assert calls.index(f"apt-get -qq install -y lustre-client-modules-{kernel}") < calls.index(
        f"mount {fsx}")
    etc = with_fsx / "etc"
    assert (etc / "apt" / "keyrings" / "fsx-ubuntu-public-key.asc").read_text() == apt_key.read_text()
    codename = subprocess.run(["bash", "-c", ". /etc/os-release && echo $VERSION_CODENAME"],
                              capture_output=True, text=True, check=True).stdout.strip()
    assert (etc / "apt" / "sources.list.d" / "fsxlustreclientrepo.list").read_text() == (
        "deb [signed-by=/etc/apt/keyrings/fsx-ubuntu-public-key.asc] "
        f"https://fsx-lustre-client-repo.s3.amazonaws.com/ubuntu {codename} main\n")
    assert (f"{fsx_dns}@tcp:/abcdefgh {fsx} lustre defaults,relatime,flock,_netdev,"
            "x-systemd.requires=network-online.target 0 0") in (etc / "fstab").read_text().splitlines()
    assert (etc / "systemd" / "system" / "docker.service.d" / "maskrcnn-efs.conf").read_text() == (
        f"[Unit]\nRequiresMountsFor={efs} {fsx}\n")
    (docker_run,) = [c for c in calls if c.startswith("docker run ")]
    assert f" -v {fsx}:{fsx}:rslave " in docker_run
    assert not Path("/etc/apt/sources.list.d/fsxlustreclientrepo.list").exists()
    # Without the option nothing of this happened (the nodes above).
    for node in (master, worker):
        node_calls = (node["root"] / "calls.log").read_text()
        assert "lustre" not in node_calls and "fsx" not in node_calls

    # A replacement worker on an AMI whose driver cannot drive its GPUs: nvidia-smi sees none of
    # the 8. The boot fails, and the node marks itself unhealthy so that its group replaces it
    # (after creation CloudFormation ignores the FAILURE signal).
    failing = tmp_path / "worker-without-driver"
    process = _start_node(failing, worker["user_data"], worker["imds"], stubs, gpus=0)
    assert process.wait(timeout=120) != 0
    log = (failing / "log" / "maskrcnn-boot.log").read_text()
    assert f"nvidia-smi sees 0 of the {GPUS_OF_TYPE} GPUs of g5.48xlarge" in log
    assert "boot failed" in log and "ready:" not in log
    (instance,) = boto3.client("autoscaling").describe_auto_scaling_instances(
        InstanceIds=[worker["id"]])["AutoScalingInstances"]
    assert instance["HealthStatus"].upper() == "UNHEALTHY"
    assert not (failing / "calls.log").exists() or "docker run" not in (
        failing / "calls.log").read_text()


def test_a_node_that_mounts_efs_without_tls_says_so_and_the_alerts_topic_hears_it_once(
        aws_env, default_synth, tmp_path):
    """The AMI has no amazon-efs-utils (no mount.efs): the node mounts EFS with plain NFS 4.1, its
    boot log says the traffic is not encrypted in transit, and the first node of that AMI tells
    the alerts topic (read from an SQS queue subscribed to it); a replacement on the same AMI
    logs it again but does not repeat the alert. A node whose AMI has mount.efs mounts with TLS
    and says nothing of the kind."""
    stack_outputs = deploy_cluster(default_synth)
    _, queue_url = subscribe_alerts_queue()
    sqs = boto3.client("sqs")

    efs = tmp_path / "efs"
    efs.mkdir()
    stubs = make_stubs(tmp_path / "stubs")
    instance_id, ip = _instance(stack_outputs[outputs.WORKER_ASG_NAME])
    (reservation,) = boto3.client("ec2").describe_instances(InstanceIds=[instance_id])["Reservations"]
    ami = reservation["Instances"][0]["ImageId"]
    imds = _imds(instance_id, ip, default_synth.context["instance_type"], ami)
    user_data = node_user_data("ClusterWorker", efs)
    file_system = stack_outputs[outputs.FILE_SYSTEM_ID]

    def boot(name: str) -> str:
        process = _start_node(tmp_path / name, user_data, imds, stubs, gpus=GPUS_OF_TYPE)
        assert process.wait(timeout=240) == 0, (tmp_path / name / "console.log").read_text()
        return (tmp_path / name / "log" / "maskrcnn-boot.log").read_text()

    def alerts() -> list[dict]:   # read and deleted (else SQS shows them again after 30 s)
        messages = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10,
                                       WaitTimeSeconds=1).get("Messages", [])
        for message in messages:
            sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])
        return [json.loads(m["Body"]) for m in messages]

    warning = (f"warning: EFS {file_system} is mounted with plain NFS 4.1, without encryption in "
               "transit: this AMI has no amazon-efs-utils (mount.efs)")
    for name in ("worker", "replacement"):
        log = boot(name)
        assert warning in log
        fstab = (tmp_path / name / "etc" / "fstab").read_text()
        assert f"{file_system}.efs.us-east-1.amazonaws.com:/ {efs} nfs4 " in fstab
    (alert,) = alerts()   # the replacement, on the same AMI, did not repeat it
    assert alert["Subject"] == f"{CLUSTER}: EFS mounted without TLS (no amazon-efs-utils on the AMI)"
    assert f"mount EFS {file_system} with plain NFS 4.1" in alert["Message"]
    assert f"Their AMI ({ami}) has no amazon-efs-utils" in alert["Message"]
    assert f"first node: {instance_id} (worker, {ip})" in alert["Message"]
    assert "pin ami_id to an AMI with amazon-efs-utils" in alert["Message"]

    # An AMI with amazon-efs-utils: the mount helper mounts with TLS, and nothing is reported.
    (stubs / "mount.efs").write_text("#!/bin/bash\nexit 0\n")
    (stubs / "mount.efs").chmod(0o755)
    log = boot("with-efs-utils")
    assert "without encryption in transit" not in log
    assert f"{file_system}:/ {efs} efs _netdev,tls 0 0" in (
        tmp_path / "with-efs-utils" / "etc" / "fstab").read_text().splitlines()
    assert alerts() == []
