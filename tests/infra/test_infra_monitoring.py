"""The training stacks' dashboards, alarms and alert rules (infra/constructs/monitoring.py) and the
cluster nodes' CloudWatch agent configuration for training (infra/userdata/cluster_node.sh).

Every metric a dashboard or alarm names is one that something really sends: the trainer's
monitor (the records of a real tensorpack run, tests/cloudwatch_emf.py), the agent configuration
the boot script writes (validated against the agent's own JSON schema), SageMaker's metric
definitions. The alert rules' patterns run in moto's EventBridge against events written from AWS's
documented examples."""
from __future__ import annotations

import fnmatch
import json
import re
import subprocess
import textwrap
from pathlib import Path

import boto3
import jsonschema
import pytest

from cloudwatch_emf import parse_emf_line, toy_run
from cdk_synth import REPO_ROOT, VARIANT_CONTEXT, synthesize
from infra import outputs
from infra.constructs.monitoring import REPLACEMENT_CAUSES
from infra.userdata import CLUSTER_NODE_SCRIPT
from training import cloudwatch_metrics as cwm
from training import metrics as m

CLUSTER = outputs.EFS_CLUSTER_STACK
SAGEMAKER = outputs.SAGEMAKER_STACK
# The agent's JSON schema: aws/amazon-cloudwatch-agent, translator/config/schema.json at commit
# 43f25261d28b044911dddd430e6e692e148ea21d (the version with the EC2 "efa" section).
AGENT_SCHEMA = json.loads((Path(__file__).parent / "data" / "cloudwatch_agent_schema.json").read_text())
# SageMaker's own per-host metrics of a training job (SageMaker developer guide, "Amazon SageMaker
# metrics in Amazon CloudWatch", training job instance metrics).
SAGEMAKER_INSTANCE_METRICS = {"CPUUtilization", "MemoryUtilization", "GPUUtilization", "GPUMemoryUtilization",
                              "DiskUtilization"}


# --- what is emitted ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def emitted(tmp_path_factory) -> set[str]:
    """Every metric name in the records of real tensorpack runs that finished, failed and stopped."""
    root = tmp_path_factory.mktemp("toy")
    names = set()
    for case in ("finished", "failed", "stopped"):
        for line in toy_run(root / case, case, environ={cwm.DEPLOYMENT_ENV: "S"}):
            record = parse_emf_line(line)
            names |= {d["Name"] for d in record["_aws"]["CloudWatchMetrics"][0]["Metrics"]}
    return names


def _telemetry_functions() -> str:
    """The boot script's training-telemetry block: its settings and functions, nothing else."""
    text = CLUSTER_NODE_SCRIPT.read_text()
    start = text.index("TRAINING_AGENT_CONFIG=")
    end = text.index("\n}\n", text.index("ship_training_telemetry() {")) + 3
    return text[start:end]


def run_telemetry(commands: str, *, role: str, tmp_path: Path, stack: str = "team-a-EfsClusterStack",
                  extra: str = "") -> subprocess.CompletedProcess:
    """``commands`` in bash after the boot script's telemetry block, with a node's cluster.env values
    and the boot's ``log`` (to $tmp_path/boot.log); the agent configuration goes to $tmp_path."""
    program = textwrap.dedent(f"""\
        set -euo pipefail
        LOG_GROUP=/maskrcnn/{stack}/nodes-0f1e INSTANCE_ID=i-0123456789abcdef0 ROLE={role}
        EFS_MOUNT=/efs STACK_NAME={stack}
        log() {{ echo "$*" >> {tmp_path}/boot.log; }}
        """) + _telemetry_functions() + f"\nTRAINING_AGENT_CONFIG={tmp_path}/agent.json\n" + extra + commands
    return subprocess.run(["bash", "-c", program], capture_output=True, text=True, timeout=60)


def agent_config(tmp_path: Path, *, role: str, gpu: int, efa: int, stack: str = "team-a-EfsClusterStack") -> dict:
    proc = run_telemetry(f"training_agent_config {gpu} {efa}", role=role, tmp_path=tmp_path, stack=stack)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def agent_metric_names(config: dict) -> set[str]:
    """What the agent publishes: nvidia_gpu's measurements as nvidia_smi_<name>, efa's as named."""
    collected = config["metrics"]["metrics_collected"]
    return ({f"nvidia_smi_{n}" for n in collected.get("nvidia_gpu", {}).get("measurement", [])}
            | set(collected.get("efa", {}).get("measurement", [])))


# --- the agent configuration ----------------------------------------------------------------------

@pytest.mark.parametrize("role, gpu, efa", [("master", 1, 1), ("master", 1, 0), ("worker", 1, 1),
                                            ("worker", 0, 0)])
def test_agent_configuration_is_valid_for_the_agent(tmp_path, role, gpu, efa):
    config = agent_config(tmp_path, role=role, gpu=gpu, efa=efa)
    jsonschema.validate(config, AGENT_SCHEMA)
    # Appended to the boot logs' configuration: the agent merges two files only where their keys
    # agree, so this one leaves the shared settings (agent section, force_flush_interval) to the first.
    assert "agent" not in config and set(config["logs"]) == {"logs_collected"}
    streams = {e["log_stream_name"]: e["file_path"] for e in config["logs"]["logs_collected"]["files"]["collect_list"]}
    assert all(e["log_group_name"] == "/maskrcnn/team-a-EfsClusterStack/nodes-0f1e"
               for e in config["logs"]["logs_collected"]["files"]["collect_list"])
    run_dir = "/efs/logs/coco-r50-20261201"   # a run's log directory (launch/cluster/jobs.py logdir_of)
    expected = {"i-0123456789abcdef0/containers": "/var/lib/docker/containers/*/*-json.log"}
    if role == "master":   # what the runs write on EFS, shipped once: from the master
        expected.update({"i-0123456789abcdef0/training-jobs": "/efs/logs/*/slurm-*.out",
                         "i-0123456789abcdef0/training.log": "/efs/logs/*/log.log",
                         "i-0123456789abcdef0/training-metrics": f"/efs/logs/*/{cwm.EMF_FILE}"})
        assert fnmatch.fnmatch(f"{run_dir}/{cwm.EMF_FILE}", streams["i-0123456789abcdef0/training-metrics"])
        assert fnmatch.fnmatch(f"{run_dir}/slurm-1234.out", streams["i-0123456789abcdef0/training-jobs"])
    assert streams == expected
    if not gpu and not efa:
        assert "metrics" not in config
        return
    metrics_section = config["metrics"]
    assert metrics_section["namespace"] == m.NODE_NAMESPACE_PREFIX + "team-a-EfsClusterStack"
    assert metrics_section["append_dimensions"] == {m.NODE_DIMENSION: "${aws:InstanceId}"}
    assert metrics_section["aggregation_dimensions"] == [[m.NODE_DIMENSION]]
    assert set(metrics_section["metrics_collected"]) == {"nvidia_gpu"} | ({"efa"} if efa else set())
    gpu_section = metrics_section["metrics_collected"]["nvidia_gpu"]
    assert gpu_section["drop_original_metrics"] == gpu_section["measurement"]   # the per-node rollup only
    names = agent_metric_names(config)
    assert {m.GPU_UTILIZATION, m.GPU_MEMORY_UTILIZATION, m.GPU_MEMORY_USED} <= names
    assert ({m.EFA_RX_BYTES, m.EFA_TX_BYTES} <= names) == bool(efa)


def _stub_agent(tmp_path: Path, *, refuse: str) -> Path:
    """The agent's control script as far as the boot uses it: records its calls; `append-config`
    fails (as the real one does when its translator refuses a configuration) when the configuration
    contains ``refuse``."""
    ctl = tmp_path / "amazon-cloudwatch-agent-ctl"
    ctl.write_text(textwrap.dedent(f"""\
        #!/bin/bash
        echo "$*" >> {tmp_path}/calls.log
        config=${{@: -1}}; config=${{config#file:}}
        if [[ "$2" == append-config && -n "{refuse}" ]] && grep -q '{refuse}' "$config"; then exit 1; fi
        """))
    ctl.chmod(0o755)
    return ctl


@pytest.mark.parametrize("refuse, calls, has_efa, message", [
    ("", ["append-config"], True, "training logs and node metrics shipped"),
    # An agent older than the EC2 EFA metrics: again without the section.
    ('"efa"', ["append-config", "append-config"], False, "refused the EFA metrics"),
    # An agent that refuses the configuration: removed again, the boot logs still go.
    ('"logs"', ["append-config", "append-config", "remove-config"], False, "boot logs only"),
])
def test_training_telemetry_falls_back_when_the_agent_refuses(tmp_path, refuse, calls, has_efa, message):
    ctl = _stub_agent(tmp_path, refuse=refuse)
    stubs = tmp_path / "bin"
    stubs.mkdir()
    (stubs / "nvidia-smi").write_text("#!/bin/bash\n")   # present: the node has GPUs
    (stubs / "nvidia-smi").chmod(0o755)
    proc = run_telemetry("ship_training_telemetry", role="master", tmp_path=tmp_path,
                         extra=f"CLOUDWATCH_AGENT_CTL={ctl}\nPATH={stubs}:$PATH\nnode_has_efa() {{ return 0; }}\n")
    assert proc.returncode == 0, proc.stderr
    recorded = (tmp_path / "calls.log").read_text().splitlines()
    assert [c.split()[1] for c in recorded] == calls
    assert all(c.endswith(f"-m ec2 -s -c file:{tmp_path}/agent.json") for c in recorded)
    assert message in (tmp_path / "boot.log").read_text()
    if refuse != '"logs"':
        assert ('"efa"' in (tmp_path / "agent.json").read_text()) == has_efa


# --- dashboards -----------------------------------------------------------------------------------

def _dashboard(synth, stack: str) -> dict:
    (dashboard,) = synth.resources(stack, "AWS::CloudWatch::Dashboard").values()
    body = dashboard["Properties"]["DashboardBody"]
    parts = body["Fn::Join"][1] if isinstance(body, dict) else [body]
    # Tokens (the region, a file system id read at deploy) become placeholders inside their strings.
    return json.loads("".join(p if isinstance(p, str) else f"<{next(iter(p))}>" for p in parts))


_SEARCH = re.compile(r"""SEARCH\('\{"([^"]+)"(?:,([^}]*))?\} MetricName="([^"]+)"', '(\w+)', (\d+)\)""")


def dashboard_metrics(dashboard: dict) -> list[tuple[str, str, tuple[str, ...], dict]]:
    """(namespace, metric name, dimension names, properties) of every metric a dashboard graphs,
    SEARCH expressions included (their schema's dimension names)."""
    found = []
    for widget in dashboard["widgets"]:
        for row in widget["properties"].get("metrics", []):
            *ids, options = row if isinstance(row[-1], dict) else (*row, {})
            if "expression" in options:
                for match in _SEARCH.finditer(options["expression"]):
                    namespace, dims, name = match.group(1), match.group(2) or "", match.group(3)
                    found.append((namespace, name, tuple(d for d in dims.split(",") if d), options))
            elif ids and ids[0] != ".":
                namespace, name, *dims = ids
                found.append((namespace, name, tuple(dims[0::2]), {**options, "dimensions": dict(zip(dims[0::2], dims[1::2]))}))
    return found


def test_cluster_dashboard_graphs_what_the_trainer_and_the_agent_send(default_synth, variant_synth, emitted,
                                                                      tmp_path):
    for synth in (default_synth, variant_synth):
        stack = synth.stack_names[CLUSTER]
        graphed = dashboard_metrics(_dashboard(synth, CLUSTER))
        training = {name for ns, name, _, _ in graphed if ns == m.NAMESPACE}
        assert training <= emitted, training - emitted
        assert all(opts["dimensions"] == {m.DEPLOYMENT_DIMENSION: stack}
                   for ns, _, _, opts in graphed if ns == m.NAMESPACE)
        # What the dashboard is for: progress, throughput per GPU, every loss, the learning rate, mAP.
        assert {m.STEP, m.EPOCH, m.IMAGES_PER_SECOND_PER_GPU, m.LEARNING_RATE, *m.LOSS_METRICS,
                *m.EVALUATION_METRICS} <= training
        nodes = [(name, dims) for ns, name, dims, _ in graphed if ns == m.NODE_NAMESPACE_PREFIX + stack]
        published = agent_metric_names(agent_config(tmp_path, role="worker", gpu=1, efa=1, stack=stack))
        assert {name for name, _ in nodes} <= published
        assert {m.GPU_UTILIZATION, m.EFA_RX_BYTES} <= {name for name, _ in nodes}
        assert all(dims == (m.NODE_DIMENSION,) for _, dims in nodes)   # the agent's per-node rollup
        storage = {(ns, name) for ns, name, _, _ in graphed if ns in ("AWS/EFS", "AWS/FSx")}
        assert {("AWS/EFS", "DataReadIOBytes"), ("AWS/EFS", "DataWriteIOBytes")} <= storage
        assert (("AWS/FSx", "DataReadBytes") in storage) == bool(synth.context["fsx_lustre_storage_gib"])
        parts = synth.templates[CLUSTER]["Outputs"][outputs.DASHBOARD_URL]["Value"]["Fn::Join"][1]
        assert parts[-2] == "#dashboards:name="
        (dashboard,) = synth.resources(CLUSTER, "AWS::CloudWatch::Dashboard")
        assert parts[-1] == {"Ref": dashboard}
        assert synth.resources(CLUSTER, "AWS::CloudWatch::Dashboard")[dashboard]["Properties"][
            "DashboardName"] == f"{stack}-training"


def test_sagemaker_dashboard_graphs_the_metric_definitions(default_synth):
    graphed = dashboard_metrics(_dashboard(default_synth, SAGEMAKER))
    jobs = {name for ns, name, dims, _ in graphed if ns == m.SAGEMAKER_NAMESPACE}
    assert jobs <= set(m.SAGEMAKER_METRIC_NAMES) | SAGEMAKER_INSTANCE_METRICS
    assert {m.IMAGES_PER_SECOND, m.LEARNING_RATE, m.FASTRCNN_BOX_LOSS} <= jobs
    assert all(dims == (m.SAGEMAKER_HOST_DIMENSION,) for ns, _, dims, _ in graphed if ns == m.SAGEMAKER_NAMESPACE)


# --- alarms and rules -----------------------------------------------------------------------------

def _alarms(synth, stack: str) -> dict[str, dict]:
    return {a["Properties"]["AlarmName"]: a["Properties"]
            for a in synth.resources(stack, "AWS::CloudWatch::Alarm").values()}


def _topic_import(synth) -> dict:
    (export,) = [o["Export"]["Name"] for o in synth.templates[outputs.NETWORK_STORAGE_STACK]["Outputs"].values()
                 if "Export" in o and o["Value"] == {"Ref": next(iter(synth.resources(
                     outputs.NETWORK_STORAGE_STACK, "AWS::SNS::Topic")))}]
    return {"Fn::ImportValue": export}


def test_cluster_alarms_notify_the_alerts_topic(default_synth, emitted):
    stack = default_synth.stack_names[CLUSTER]
    names = ("run-finished", "run-failed", "loss-not-finite", "run-active", "no-heartbeat")
    alarms = {name: a for name, a in _alarms(default_synth, CLUSTER).items()
              if name in {f"{stack}-{n}" for n in names}}
    assert len(alarms) == len(names)
    topic = _topic_import(default_synth)
    for alarm in alarms.values():   # every alarm watches a metric the trainer writes, per deployment
        assert (alarm["Namespace"], alarm["MetricName"] in emitted) == (m.NAMESPACE, True)
        assert alarm["Dimensions"] == [{"Name": m.DEPLOYMENT_DIMENSION, "Value": stack}]
        assert alarm["Period"] == 60
    for name, metric in (("run-finished", m.RUN_FINISHED), ("run-failed", m.RUN_FAILED),
                         ("loss-not-finite", m.LOSS_NOT_FINITE)):
        alarm = alarms[f"{stack}-{name}"]
        assert (alarm["MetricName"], alarm["Statistic"], alarm["Threshold"], alarm["EvaluationPeriods"]) == (
            metric, "Sum", 1, 1)
        assert alarm["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
        assert alarm["TreatMissingData"] == "notBreaching"   # no run, nothing to report
        assert alarm["AlarmActions"] == [topic]
    active, silent = alarms[f"{stack}-run-active"], alarms[f"{stack}-no-heartbeat"]
    # In ALARM from a run's first record to its last: missing data keeps the state of the last point.
    assert (active["MetricName"], active["Statistic"], active["TreatMissingData"]) == (m.RUN_ACTIVE, "Minimum", "ignore")
    assert (active["ComparisonOperator"], active["Threshold"]) == ("GreaterThanOrEqualToThreshold", 1)
    # No heartbeat for stall_alarm_minutes consecutive minutes, missing data breaching.
    minutes = default_synth.context["stall_alarm_minutes"]
    assert (silent["MetricName"], silent["Statistic"], silent["TreatMissingData"]) == (m.HEARTBEAT, "Sum", "breaching")
    assert (silent["EvaluationPeriods"], silent["DatapointsToAlarm"], silent["ComparisonOperator"],
            silent["Threshold"]) == (minutes, minutes, "LessThanThreshold", 1)
    for alarm in (active, silent):   # parts of the composite: they notify nobody themselves
        assert alarm["ActionsEnabled"] is False and "AlarmActions" not in alarm
    (composite,) = default_synth.resources(CLUSTER, "AWS::CloudWatch::CompositeAlarm").values()
    rule = composite["Properties"]["AlarmRule"]["Fn::Join"][1]
    ids = {logical for logical, a in default_synth.resources(CLUSTER, "AWS::CloudWatch::Alarm").items()
           if a["Properties"]["AlarmName"] in (active["AlarmName"], silent["AlarmName"])}
    assert rule[0] == '(ALARM("' and rule[2] == '") AND ALARM("' and rule[4] == '"))'
    assert {rule[1]["Fn::GetAtt"][0], rule[3]["Fn::GetAtt"][0]} == ids
    assert composite["Properties"]["AlarmActions"] == [topic]
    assert f"{minutes} minutes" in composite["Properties"]["AlarmDescription"]


def test_stall_minutes_is_a_setting(tmp_path):
    synth = synthesize(tmp_path, {"stall_alarm_minutes": "45"})
    (silent,) = [a for name, a in _alarms(synth, CLUSTER).items() if name.endswith("-no-heartbeat")]
    assert (silent["EvaluationPeriods"], silent["DatapointsToAlarm"]) == (45, 45)


def test_node_roles_may_put_metrics_in_their_namespace_only(default_synth):
    stack = default_synth.stack_names[CLUSTER]
    policies = [p["Properties"] for p in default_synth.resources(CLUSTER, "AWS::IAM::Policy").values()
                if any(s.get("Sid") == "PutNodeMetrics" for s in p["Properties"]["PolicyDocument"]["Statement"])]
    (policy,) = policies
    (statement,) = policy["PolicyDocument"]["Statement"]
    assert statement["Action"] == "cloudwatch:PutMetricData" and statement["Resource"] == "*"
    assert statement["Condition"] == {"StringEquals": {"cloudwatch:namespace": m.NODE_NAMESPACE_PREFIX + stack}}
    roles = {r["Ref"] for r in policy["Roles"]}
    assert {r for r in roles if r.startswith("ClusterMasterRole")} and {r for r in roles if r.startswith("ClusterWorkerRole")}


def _rule(synth, stack: str, description_start: str) -> dict:
    (rule,) = [r["Properties"] for r in synth.resources(stack, "AWS::Events::Rule").values()
               if r["Properties"]["Description"].startswith(description_start)]
    return rule


def _delivered(pattern: dict, events: list[dict]) -> list[dict]:
    """The events moto's EventBridge routes through a rule with ``pattern`` (to a queue)."""
    client, sqs = boto3.client("events"), boto3.client("sqs")
    queue = sqs.create_queue(QueueName="rule-target")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    client.put_rule(Name="under-test", EventPattern=json.dumps(pattern))
    client.put_targets(Rule="under-test", Targets=[{"Id": "queue", "Arn": arn}])
    for event in events:
        assert client.put_events(Entries=[{"Source": event["source"], "DetailType": event["detail-type"],
                                           "Detail": json.dumps(event["detail"])}])["FailedEntryCount"] == 0
    messages = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10, WaitTimeSeconds=1).get("Messages", [])
    return [json.loads(msg["Body"])["detail"] for msg in messages]


def _terminated(group: str, cause: str) -> dict:
    """An "EC2 Instance Terminate Successful" event as AWS documents it (EC2 Auto Scaling user guide,
    "Amazon EC2 Auto Scaling event reference"), with a cause in the activity history's wording."""
    return {"source": "aws.autoscaling", "detail-type": "EC2 Instance Terminate Successful", "detail": {
        "StatusCode": "InProgress", "Description": "Terminating EC2 instance: i-1234567890abcdef0",
        "AutoScalingGroupName": group, "ActivityId": "87654321-4321-4321-4321-210987654321",
        "Details": {"Availability Zone": "us-east-1b", "Subnet ID": "subnet-12345678"},
        "RequestId": "12345678-1234-1234-1234-123456789012", "StatusMessage": "",
        "EndTime": "2026-11-11T21:36:57.498Z", "EC2InstanceId": "i-1234567890abcdef0",
        "StartTime": "2026-11-11T21:36:12.649Z", "Cause": cause}}


def test_node_replaced_rule_matches_health_replacements_only(aws_env, default_synth):
    stack = default_synth.stack_names[CLUSTER]
    rule = _rule(default_synth, CLUSTER, "A cluster node failed")
    pattern = rule["EventPattern"]
    assert [c["wildcard"] for c in pattern["detail"]["Cause"]] == list(REPLACEMENT_CAUSES)
    worker = f"{stack}-worker"
    replaced = [
        "At 2026-11-11T21:36:12Z an instance was taken out of service in response to a user health-check.",
        "At 2026-11-11T21:36:12Z an instance was taken out of service in response to an EC2 health check "
        "indicating it has been terminated or stopped.",
        "At 2026-11-11T21:36:12Z an instance was taken out of service in response to an EC2 instance status "
        "checks failure.",
    ]
    not_replaced = [  # the idle scale-down setting the worker group to 0
        "At 2026-11-11T21:35:40Z a user request update of AutoScalingGroup constraints to min: 0, max: 1, "
        "desired: 0 changing the desired capacity from 1 to 0.  At 2026-11-11T21:36:12Z an instance was taken "
        "out of service in response to a difference between desired and actual capacity, shrinking the "
        "capacity from 1 to 0.",
    ]
    events = ([_terminated(worker, c) for c in replaced + not_replaced]
              + [_terminated("another-deployment-worker", replaced[0])])
    assert [d["Cause"] for d in _delivered(pattern, events)] == replaced
    (target,) = rule["Targets"]
    assert target["Arn"] == _topic_import(default_synth) and "RoleArn" in target
    assert "<detail-Cause>" in target["InputTransformer"]["InputTemplate"]


def test_training_job_rule_matches_the_stacks_finished_jobs(aws_env, default_synth):
    rule = _rule(default_synth, SAGEMAKER, "A SageMaker training job")
    pattern = json.loads(json.dumps(rule["EventPattern"]))
    (role_token,) = pattern["detail"]["RoleArn"]
    assert next(iter(role_token["Fn::GetAtt"])).startswith("TrainingJobRole")
    ours = "arn:aws:iam::123456789012:role/SageMakerStack-TrainingJobRole"
    pattern["detail"]["RoleArn"] = [ours]

    def job(status: str, role: str) -> dict:   # SageMaker's event: the DescribeTrainingJob shape
        return {"source": "aws.sagemaker", "detail-type": "SageMaker Training Job State Change", "detail": {
            "TrainingJobName": f"maskrcnn-{status.lower()}", "TrainingJobStatus": status,
            "SecondaryStatus": status, "RoleArn": role, "FailureReason": "AlgorithmError: see the log"}}
    events = [job(s, ours) for s in ("InProgress", "Completed", "Failed", "Stopping", "Stopped")] + [
        job("Failed", "arn:aws:iam::123456789012:role/someone-else")]
    assert [d["TrainingJobStatus"] for d in _delivered(pattern, events)] == ["Completed", "Failed", "Stopped"]


# --- EventBridge input templates and failed deliveries ----------------------------------------------

# EventBridge user guide, "Amazon EventBridge input transformation": "you can use those variables in
# the Input Template as <variable-name>" (the characters < and > cannot be escaped), and the
# predefined variables, reserved: aws.events.rule-arn, aws.events.rule-name, aws.events.event,
# aws.events.event.ingestion-time, aws.events.event.json. Any other <name> fails PutTargets
# ("contains invalid placeholder"), and with it the rule's stack.
RESERVED_PLACEHOLDERS = {"aws.events.rule-arn", "aws.events.rule-name", "aws.events.event",
                         "aws.events.event.ingestion-time", "aws.events.event.json"}
PLACEHOLDER = re.compile(r"<([^<>]*)>")


def _text(value) -> str:
    """A template value as text; CloudFormation functions inside it (none is expected) as {...}."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and "Fn::Join" in value:
        separator, parts = value["Fn::Join"]
        return separator.join(_text(p) for p in parts)
    return "{" + json.dumps(value).replace("<", "(").replace(">", ")") + "}"


def _input_transformers(synth) -> list[tuple[str, str, dict]]:
    found = []
    for stack, template in synth.templates.items():
        for logical_id, resource in template["Resources"].items():
            if resource["Type"] == "AWS::Events::Rule":
                found += [(stack, logical_id, t["InputTransformer"])
                          for t in resource["Properties"].get("Targets", []) if "InputTransformer" in t]
    return found


@pytest.mark.parametrize("synth_fixture", ["default_synth", "variant_synth"])
def test_every_input_template_uses_only_its_variables_and_the_reserved_ones(request, synth_fixture):
    synth = request.getfixturevalue(synth_fixture)
    transformers = _input_transformers(synth)
    assert {stack for stack, _, _ in transformers} == {CLUSTER, SAGEMAKER}
    for stack, rule, transformer in transformers:
        declared = set(transformer.get("InputPathsMap", {}))
        assert not declared & RESERVED_PLACEHOLDERS
        used = set(PLACEHOLDER.findall(_text(transformer["InputTemplate"])))
        assert used, (stack, rule)   # every alert names what it is about
        assert used <= declared | RESERVED_PLACEHOLDERS, (stack, rule, sorted(used - declared))


def test_the_training_job_alert_names_the_job_in_the_command_it_suggests(default_synth):
    (transformer,) = [t for stack, _, t in _input_transformers(default_synth) if stack == SAGEMAKER]
    template = _text(transformer["InputTemplate"])
    (variable,) = [k for k, path in transformer["InputPathsMap"].items() if path == "$.detail.TrainingJobName"]
    assert f"`maskrcnn sagemaker describe <{variable}>`" in template
    assert "--run-name RUN --resume" in template


@pytest.mark.parametrize("stack", [CLUSTER, SAGEMAKER])
def test_every_alert_rule_has_an_alarm_on_its_failed_deliveries(default_synth, stack):
    """EventBridge reports a target it could not invoke as FailedInvocations (namespace AWS/Events,
    dimension RuleName: EventBridge user guide, "Monitoring Amazon EventBridge"); the alarm tells
    the alerts topic at the first one."""
    rules = default_synth.resources(stack, "AWS::Events::Rule")
    assert rules
    watched = {}
    for alarm in _alarms(default_synth, stack).values():
        if alarm.get("Namespace") == "AWS/Events":
            (dimension,) = alarm["Dimensions"]
            assert dimension["Name"] == "RuleName"
            watched[dimension["Value"]["Ref"]] = alarm
    assert set(watched) == set(rules)
    topic = _topic_import(default_synth)
    for alarm in watched.values():
        assert (alarm["MetricName"], alarm["Statistic"], alarm["Threshold"], alarm["EvaluationPeriods"],
                alarm["ComparisonOperator"]) == (
            "FailedInvocations", "Sum", 1, 1, "GreaterThanOrEqualToThreshold")
        assert alarm["TreatMissingData"] == "notBreaching"   # no event, nothing failed
        assert alarm["AlarmActions"] == [topic]
