"""When cluster nodes fail to boot, and where their boot logs go.

A group whose replacement nodes keep failing their boot would launch and terminate paid GPU
instances forever, and the alerts topic (launch and terminate *errors* only) would hear nothing.
Each group counts its consecutive failed boots in an SSM parameter; at `boot_failure_limit` the
failing node suspends its group's Launch process and tells the alerts topic. Checked here:

- against moto, with the real user data and boot steps (sandboxed as in test_infra_boot_script.py):
  failures are counted, a boot that succeeds resets the count, at the limit the group's Launch
  process is suspended and the alert (read from an SQS queue subscribed to the topic) names the
  group, the instance, the failing step, the end of its boot log and the command that resumes
  launching; a boot-steps object that is not the synthesized one is not run; a CloudWatch agent
  package that AWS's key did not sign is not installed;
- on the synthesized templates: the node roles' statements for all this, the log group (retention,
  retained), the settings' wiring, and the size of the user data against EC2's 16 KB limit.
"""
from __future__ import annotations

import hashlib
import json
import re
import subprocess

import boto3
import pytest

from infra import outputs
from infra.userdata import CLUSTER_NODE_BOOTSTRAP, CLUSTER_NODE_SCRIPT, script_body

from cdk_synth import synthesize
from machine import require
from test_infra_boot_script import (CLUSTER, GPUS_OF_TYPE, _imds, _instance,
                                    _sandbox_unavailable, _start_node, deploy_cluster,
                                    make_stubs, node_user_data, subscribe_alerts_queue)

SHARED = outputs.NETWORK_STORAGE_STACK
# ParallelCluster's protected mode stops a queue after 10 consecutive bootstrap failures; the app
# takes the same default.
DEFAULT_LIMIT = 10
# EC2 refuses user data over 16 KB (16384 bytes, before base64 encoding). What is measured below
# must leave a quarter of that for what is added later.
EC2_USER_DATA_LIMIT = 16384
USER_DATA_BUDGET = 12 * 1024


def env_of(user_data: str) -> dict[str, str]:
    block = user_data.split("cat > /etc/maskrcnn/cluster.env <<'EOF'\n", 1)[1].split("\nEOF\n")[0]
    return dict(line.split("=", 1) for line in block.splitlines())


def statements_of(synth, role_prefix: str) -> list[dict]:
    found = []
    for logical_id, policy in synth.resources(CLUSTER, "AWS::IAM::Policy").items():
        if logical_id.startswith(role_prefix):
            found += policy["Properties"]["PolicyDocument"]["Statement"]
    return found


def actions(statement: dict) -> list[str]:
    value = statement["Action"]
    return [value] if isinstance(value, str) else value


def arn_text(resource) -> str:
    """An ARN built with Fn::Join, its pseudo parameters written as <...>."""
    if isinstance(resource, str):
        return resource
    parts = resource["Fn::Join"][1]
    return "".join(p if isinstance(p, str) else f"<{p['Ref']}>" if "Ref" in p else json.dumps(p)
                   for p in parts)


# --- against moto: the real user data and boot steps ---------------------------------------------

@pytest.fixture
def cluster(aws_env, default_synth, tmp_path):
    """Both stacks in moto, the assets published, an SQS queue on the alerts topic, and what a
    node needs to boot in the sandbox."""
    require(_sandbox_unavailable())
    stack_outputs = deploy_cluster(default_synth)
    topic_arn, queue_url = subscribe_alerts_queue()
    efs = tmp_path / "efs"
    efs.mkdir()
    worker_group = stack_outputs[outputs.WORKER_ASG_NAME]
    instance_id, ip = _instance(worker_group)
    user_data = node_user_data("ClusterWorker", efs)
    assert env_of(user_data)["ALERTS_TOPIC_ARN"] == topic_arn
    return {"tmp": tmp_path, "stubs": make_stubs(tmp_path / "stubs"),
            "queue_url": queue_url, "worker_group": worker_group,
            "master_group": stack_outputs[outputs.MASTER_ASG_NAME],
            "worker_id": instance_id, "user_data": user_data,
            "imds": _imds(instance_id, ip, default_synth.context["instance_type"]),
            "runs": 0}


def boot_worker(cluster, *, gpus: int,
                extra_env: dict[str, str] | None = None) -> tuple[int, str]:
    """Boots (a replacement of) the worker in the sandbox, in boot<N>/ for the N-th boot of the
    test: (exit status, its boot log)."""
    cluster["runs"] += 1
    root = cluster["tmp"] / f"boot{cluster['runs']}"
    process = _start_node(root, cluster["user_data"], cluster["imds"], cluster["stubs"],
                          gpus=gpus, extra_env=extra_env)
    status = process.wait(timeout=240)
    return status, (root / "log" / "maskrcnn-boot.log").read_text()


def failure_count(group: str) -> str:
    return boto3.client("ssm").get_parameter(
        Name=f"/maskrcnn/{CLUSTER}/boot-failures/{group}")["Parameter"]["Value"]


def suspended(group_name: str) -> list[str]:
    (group,) = boto3.client("autoscaling").describe_auto_scaling_groups(
        AutoScalingGroupNames=[group_name])["AutoScalingGroups"]
    return sorted(p["ProcessName"] for p in group["SuspendedProcesses"])


def alerts(cluster) -> list[dict]:
    messages = boto3.client("sqs").receive_message(
        QueueUrl=cluster["queue_url"], MaxNumberOfMessages=10, WaitTimeSeconds=1).get("Messages", [])
    return [json.loads(m["Body"]) for m in messages]


@pytest.mark.slow
def test_failed_boots_are_counted_and_a_boot_that_succeeds_resets_the_count(cluster):
    assert (failure_count("worker"), failure_count("master")) == ("0", "0")
    # Replacement workers on an AMI whose driver sees none of the GPUs: each boot fails.
    for expected in ("1", "2"):
        status, log = boot_worker(cluster, gpus=0)
        assert status != 0 and "ready:" not in log
        assert failure_count("worker") == expected
        assert f"{expected} of {DEFAULT_LIMIT} consecutive failed boots in {cluster['worker_group']}" in log
    (instance,) = boto3.client("autoscaling").describe_auto_scaling_instances(
        InstanceIds=[cluster["worker_id"]])["AutoScalingInstances"]
    assert instance["HealthStatus"].upper() == "UNHEALTHY"
    # Below the limit the group keeps replacing the node, and nobody is told yet.
    assert suspended(cluster["worker_group"]) == [] and alerts(cluster) == []
    assert failure_count("master") == "0"   # each group has its own count

    status, log = boot_worker(cluster, gpus=GPUS_OF_TYPE)
    assert status == 0, log
    assert "ready: 8 GPUs" in log
    assert failure_count("worker") == "0"


@pytest.mark.slow
def test_at_the_limit_the_group_stops_launching_and_the_alert_says_why(cluster):
    env = env_of(cluster["user_data"])
    assert env["BOOT_FAILURE_LIMIT"] == str(DEFAULT_LIMIT)
    boto3.client("ssm").put_parameter(Name=env["BOOT_FAILURES_PARAMETER"],
                                      Value=str(DEFAULT_LIMIT - 1), Overwrite=True)
    status, log = boot_worker(cluster, gpus=0)
    assert status != 0

    assert suspended(cluster["worker_group"]) == ["Launch"]
    assert suspended(cluster["master_group"]) == []
    # After a resume the group has the whole limit again.
    assert failure_count("worker") == "0"
    (alert,) = alerts(cluster)
    group, instance = cluster["worker_group"], cluster["worker_id"]
    assert alert["Subject"] == f"{group} stopped launching after {DEFAULT_LIMIT} failed boots"
    body = alert["Message"]
    assert body.startswith(f"The auto-scaling group {group} has stopped launching nodes: "
                           f"{DEFAULT_LIMIT} node boots in a row failed (boot_failure_limit is "
                           f"{DEFAULT_LIMIT}).")
    assert f"\nLast failed node: {instance} (worker, g5.48xlarge, " in body
    # The step that failed: check_gpus, called from the boot steps' main sequence.
    assert re.search(r"\nFailed step: cluster_node\.sh line \d+: check_gpus\n", body), body
    assert (f"\nBoot logs: CloudWatch Logs group {env['LOG_GROUP']}, streams "
            f"{instance}/maskrcnn-boot.log and {instance}/cloud-init-output.log\n") in body
    tail = body.split("\nLast lines of its boot log:\n", 1)[1]
    assert "nvidia-smi sees 0 of the 8 GPUs of g5.48xlarge" in tail
    resume = (f"aws autoscaling resume-processes --auto-scaling-group-name {group} "
              "--scaling-processes Launch --region us-east-1")
    assert body.endswith(f"\n  {resume}")

    # The command the alert gives does resume launching.
    subprocess.run(resume.split(), check=True)
    assert suspended(group) == []


@pytest.mark.slow
def test_boot_steps_that_are_not_the_synthesized_ones_are_not_run(cluster):
    """Whoever may write to the CDK assets bucket cannot change what the nodes run as root."""
    url = env_of(cluster["user_data"])["BOOT_SCRIPT_URL"]
    bucket, key = url.removeprefix("s3://").split("/", 1)
    tampered = CLUSTER_NODE_SCRIPT.read_text() + "\ntouch /etc/maskrcnn/tampered\n"
    boto3.client("s3").put_object(Bucket=bucket, Key=key, Body=tampered.encode())

    status, log = boot_worker(cluster, gpus=GPUS_OF_TYPE)
    assert status != 0
    root = cluster["tmp"] / "boot1"
    assert not (root / "etc" / "maskrcnn" / "cluster_node.sh").exists()
    assert not (root / "etc" / "maskrcnn" / "tampered").exists()
    assert not (root / "calls.log").exists()     # no step ran: no agent, docker or mount
    assert re.search(r"boot failed at user-data line \d+: fetch_boot_steps\n", log), log
    # Counted like any other failed boot, and the group replaces the node.
    assert failure_count("worker") == "1"


@pytest.mark.slow
def test_a_cloudwatch_agent_package_not_signed_by_aws_is_not_installed(cluster):
    """On an AMI without the agent the boot installs AWS's package only if the signature is by
    the key AWS publishes; a package signed by any other key is refused, and the boot goes on
    (the log then stays on the node)."""
    work = cluster["tmp"] / "package"
    gnupg = work / "gnupg"
    gnupg.mkdir(parents=True, mode=0o700)
    gpg = ["gpg", "--homedir", str(gnupg), "--batch", "--quiet", "--pinentry-mode", "loopback",
           "--passphrase", ""]
    subprocess.run([*gpg, "--quick-gen-key", "Not AWS <agent@example.com>", "ed25519", "sign",
                    "never"], check=True)
    (work / "agent.deb").write_bytes(b"not the agent")
    subprocess.run([*gpg, "--detach-sign", "--output", str(work / "agent.deb.sig"),
                    str(work / "agent.deb")], check=True)
    subprocess.run([*gpg, "--export", "--output", str(work / "key.gpg")], check=True)
    # A temporary directory deep enough that a gpg-agent socket in it would pass the 108 bytes a
    # Unix socket path may have (as under pytest-xdist's own temporary directories): the check
    # must not depend on an agent.
    deep = work / ("d" * 60) / ("t" * 60)
    deep.mkdir(parents=True)

    status, log = boot_worker(cluster, gpus=GPUS_OF_TYPE, extra_env={
        "TMPDIR": str(deep),
        "CLOUDWATCH_AGENT_CTL": str(work / "no-agent-here"),
        "CLOUDWATCH_AGENT_URL": (work / "agent.deb").as_uri(),
        "CLOUDWATCH_AGENT_KEY_URL": (work / "key.gpg").as_uri()})
    assert status == 0, log
    assert (f"{(work / 'agent.deb').as_uri()} is not signed by the key "
            "937616F3450B7D806CBD9725D58167303B789C72: not installed") in log
    assert "warning: no CloudWatch agent; the boot log is in /var/log/maskrcnn-boot.log" in log
    calls = (cluster["tmp"] / "boot1" / "calls.log").read_text().splitlines()
    assert not [c for c in calls if c.startswith(("dpkg", "amazon-cloudwatch-agent-ctl"))]
    assert "ready: 8 GPUs" in log
    assert failure_count("worker") == "0"


# --- the synthesized templates -------------------------------------------------------------------

@pytest.fixture(scope="module")
def configured_synth(tmp_path_factory):
    """The app with both settings changed from their defaults."""
    return synthesize(tmp_path_factory.mktemp("cdk-boot-settings"),
                      {"boot_failure_limit": 3, "log_retention_days": 7})


def launch_template_user_data(synth, prefix: str) -> dict:
    (template,) = [r for lid, r in synth.resources(CLUSTER, "AWS::EC2::LaunchTemplate").items()
                   if lid.startswith(prefix)]
    return template["Properties"]["LaunchTemplateData"]["UserData"]


def rendered(value) -> str:
    """User data text with each CloudFormation expression as its placeholder <...>."""
    parts = value["Fn::Base64"]["Fn::Join"][1]
    return "".join(p if isinstance(p, str) else f"<{json.dumps(p)}>" for p in parts)


@pytest.mark.parametrize("prefix, role", [("ClusterMaster", "master"), ("ClusterWorker", "worker")])
def test_node_roles_may_count_stop_alert_and_ship_logs_for_their_own_group_only(
        default_synth, prefix, role):
    other = "worker" if role == "master" else "master"
    resources = default_synth.templates[CLUSTER]["Resources"]
    statements = statements_of(default_synth, f"{prefix}Role")

    def granting(action: str) -> list[dict]:
        return [s for s in statements if action in actions(s) or "*" in actions(s)
                or f"{action.split(':')[0]}:*" in actions(s)]

    # The group's count: read and written, nothing else, on its own parameter only.
    (count,) = granting("ssm:PutParameter")
    assert actions(count) == ["ssm:GetParameter", "ssm:PutParameter"]
    assert arn_text(count["Resource"]) == (
        f"arn:<AWS::Partition>:ssm:<AWS::Region>:<AWS::AccountId>:parameter/maskrcnn/{CLUSTER}/"
        f"boot-failures/{role}")
    (parameter,) = [r for r in resources.values() if r["Type"] == "AWS::SSM::Parameter"
                    and r["Properties"]["Name"] == f"/maskrcnn/{CLUSTER}/boot-failures/{role}"]
    assert (parameter["Properties"]["Type"], parameter["Properties"]["Value"]) == ("String", "0")
    assert granting("ssm:GetParameter") == [count]

    # Its own group's processes may be suspended, never resumed (that is the user's decision).
    (suspend,) = granting("autoscaling:SuspendProcesses")
    assert actions(suspend) == ["autoscaling:SuspendProcesses"]
    assert arn_text(suspend["Resource"]) == (
        "arn:<AWS::Partition>:autoscaling:<AWS::Region>:<AWS::AccountId>:autoScalingGroup:*:"
        f"autoScalingGroupName/{CLUSTER}-{role}")
    assert granting("autoscaling:ResumeProcesses") == []
    assert other not in json.dumps([count, suspend])

    # The alerts topic: the one the groups' launch and terminate errors go to.
    (publish,) = granting("sns:Publish")
    assert actions(publish) == ["sns:Publish"]
    group = next(r for lid, r in resources.items() if lid.startswith(f"{prefix}Group")
                 and r["Type"] == "AWS::AutoScaling::AutoScalingGroup")
    assert publish["Resource"] == group["Properties"]["NotificationConfigurations"][0]["TopicARN"]

    # The deployment's log group: create a stream, find it, put events; nothing on other groups
    # and no AWS-managed CloudWatchAgentServerPolicy (it allows these on every group).
    (log_group_id,) = default_synth.resources(CLUSTER, "AWS::Logs::LogGroup")
    (ship,) = granting("logs:PutLogEvents")
    assert actions(ship) == ["logs:CreateLogStream", "logs:DescribeLogStreams",
                             "logs:PutLogEvents"]
    assert ship["Resource"] == {"Fn::GetAtt": [log_group_id, "Arn"]}
    assert [s for s in statements if any(a.startswith("logs:") for a in actions(s))] == [ship]
    (role_resource,) = [r for lid, r in resources.items() if lid.startswith(f"{prefix}Role")
                        and r["Type"] == "AWS::IAM::Role"]
    assert "CloudWatchAgentServerPolicy" not in json.dumps(role_resource)

    # The boot steps: this one object of the assets bucket, read only.
    manifest = json.loads((default_synth.outdir / f"{CLUSTER}.assets.json").read_text())
    (object_key,) = [d["objectKey"] for a in manifest["files"].values()
                     for d in a["destinations"].values() if a["source"]["path"].endswith(".sh")]
    (fetch,) = [s for s in statements if "s3:GetObject" in actions(s)
                and object_key in json.dumps(s["Resource"])]
    assert actions(fetch) == ["s3:GetObject"]
    assert json.dumps(fetch["Resource"]).endswith(f'"/{object_key}"]]}}')


def test_boot_logs_go_to_one_retained_log_group_per_deployment(default_synth, configured_synth):
    for synth, days in ((default_synth, 30), (configured_synth, 7)):
        (log_group,) = synth.resources(CLUSTER, "AWS::Logs::LogGroup").values()
        assert log_group["Properties"]["RetentionInDays"] == days
        # The logs are what explains a failure: they outlive the stack.
        assert (log_group["DeletionPolicy"], log_group["UpdateReplacePolicy"]) == ("Retain", "Retain")
        # Retained, so unique to the stack's deployment (its id's UUID): a fixed name would make
        # the next deployment of the stack fail to create its group.
        assert log_group["Properties"]["LogGroupName"] == {"Fn::Join": ["", [
            f"/maskrcnn/{CLUSTER}/nodes-",
            {"Fn::Select": [2, {"Fn::Split": ["/", {"Ref": "AWS::StackId"}]}]}]]}
    # The two groups' nodes write to it (the agent's configuration: test_infra_boot_script.py).
    (log_group_id,) = default_synth.resources(CLUSTER, "AWS::Logs::LogGroup")
    for prefix in ("ClusterMaster", "ClusterWorker"):
        env = env_of(rendered(launch_template_user_data(default_synth, prefix)))
        assert env["LOG_GROUP"] == f'<{{"Ref": "{log_group_id}"}}>'


@pytest.mark.parametrize("prefix, role", [("ClusterMaster", "master"), ("ClusterWorker", "worker")])
def test_nodes_are_told_their_group_count_limit_topic_and_boot_steps(
        default_synth, configured_synth, prefix, role):
    env = env_of(rendered(launch_template_user_data(default_synth, prefix)))
    assert env["ASG_NAME"] == f"{CLUSTER}-{role}"
    assert env["BOOT_FAILURES_PARAMETER"] == f"/maskrcnn/{CLUSTER}/boot-failures/{role}"
    assert env["BOOT_FAILURE_LIMIT"] == str(DEFAULT_LIMIT)
    assert env_of(rendered(launch_template_user_data(configured_synth, prefix)))[
        "BOOT_FAILURE_LIMIT"] == "3"
    # The boot steps the node runs are the repository's cluster_node.sh: its SHA-256, computed
    # here from the file.
    assert env["BOOT_SCRIPT_SHA256"] == hashlib.sha256(CLUSTER_NODE_SCRIPT.read_bytes()).hexdigest()
    manifest = json.loads((default_synth.outdir / f"{CLUSTER}.assets.json").read_text())
    (asset,) = [a for a in manifest["files"].values() if a["source"]["path"].endswith(".sh")]
    assert (default_synth.outdir / asset["source"]["path"]).read_bytes() == \
        CLUSTER_NODE_SCRIPT.read_bytes()
    (destination,) = asset["destinations"].values()
    assert env["BOOT_SCRIPT_URL"] == (f'<{{"Fn::Sub": "s3://{destination["bucketName"]}/'
                                      f'{destination["objectKey"]}"}}>')


# The longest value each CloudFormation expression in the user data can take: AWS's limit where
# there is one, else a bound on what this app's values are.
PSEUDO_PARAMETER_LENGTHS = {
    "AWS::AccountId": 12,
    "AWS::Region": 20,       # the longest region codes today have 14 characters (ap-southeast-1)
    "AWS::Partition": 16,    # aws-iso-b (9) is the longest today
    "AWS::URLSuffix": 24,    # amazonaws.com.cn (16) is the longest today
    "AWS::StackName": 128,   # CloudFormation's limit on stack names
}
# Any other Ref, Fn::GetAtt, Fn::ImportValue or Fn::Select: ids, names and ARNs (the secret's, the
# topic's, the log group's with a 40-character stack name) are all shorter than this.
OTHER_EXPRESSION_LENGTH = 256


def longest(value) -> str:
    if isinstance(value, str):
        return value
    ((function, argument),) = value.items()
    if function == "Fn::Base64":
        return longest(argument)
    if function == "Fn::Join":
        separator, parts = argument
        return separator.join(longest(p) for p in parts)
    if function == "Fn::Sub":
        template, variables = (argument, {}) if isinstance(argument, str) else argument
        return re.sub(r"\$\{([^}]+)\}", lambda m: longest(variables[m[1]]) if m[1] in variables
                      else "x" * PSEUDO_PARAMETER_LENGTHS.get(m[1], OTHER_EXPRESSION_LENGTH),
                      template)
    if function == "Ref" and argument in PSEUDO_PARAMETER_LENGTHS:
        return "x" * PSEUDO_PARAMETER_LENGTHS[argument]
    return "x" * OTHER_EXPRESSION_LENGTH


@pytest.mark.parametrize("synth_fixture", ["default_synth", "variant_synth"])
@pytest.mark.parametrize("prefix", ["ClusterMaster", "ClusterWorker"])
def test_user_data_stays_well_inside_ec2s_16_kb(request, synth_fixture, prefix):
    synth = request.getfixturevalue(synth_fixture)
    user_data = launch_template_user_data(synth, prefix)
    text = longest(user_data)
    # What is measured is the whole user data: the environment and the bootstrap.
    assert text.startswith("#!/bin/bash\n") and script_body(CLUSTER_NODE_BOOTSTRAP) in text
    assert len(text.encode()) <= USER_DATA_BUDGET < EC2_USER_DATA_LIMIT
    # The steps are fetched, not carried: the user data does not grow with them.
    assert "install_munge_key" not in text and "start_container" not in text
