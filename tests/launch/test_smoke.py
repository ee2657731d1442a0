"""The account smoke test (launch/smoke.py) against moto: the plan and its cost, no resources
without confirmation, the teardown after a failed step, and a whole run in which the CDK CLI is
replaced at its command-line boundary by the real app synthesized and created in moto.

moto runs no SSM agent and no training: the full-run test plays both at the AWS API (the output of
the `cat` of a run's eval_results.json, the metrics SageMaker scrapes) and asserts on the requests
the smoke test sends, as moto receives them."""
from __future__ import annotations

import importlib.util
import io
import json
import shlex
import sys
from pathlib import Path

import boto3
import pytest

from aws_fakes import capture_requests
from launch import smoke
from recorded_aws import Replay
from training.configs import cpu_synthetic
from training.metrics import EVALUATION_METRICS

INFRA_TESTS = Path(__file__).resolve().parents[1] / "infra"


@pytest.fixture(autouse=True)
def recorded_quotas(monkeypatch):
    """The pre-flight's EC2 quotas (moto has none): the Standard vCPU quota 64, Elastic IPs 5,
    Service Quotas responses written from its API reference (tests/launch/recorded_aws/), served on 127.0.0.1."""
    with Replay({"GetServiceQuota": {"L-1216C47A": "standard-64", "L-0263D0A3": "elastic-ip-5"}}).serve() as url:
        monkeypatch.setenv("AWS_ENDPOINT_URL_SERVICE_QUOTAS", url)
        yield


def _cdk_synth():
    """tests/infra/cdk_synth.py (synthesis of the real app, CloudFormation in moto)."""
    if "cdk_synth" not in sys.modules:   # already imported when tests/infra ran first
        spec = importlib.util.spec_from_file_location("cdk_synth", INFRA_TESTS / "cdk_synth.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["cdk_synth"] = module   # its dataclasses look the module up while being built
        spec.loader.exec_module(module)
    return sys.modules["cdk_synth"]


class Recorder:
    """Stands in for the CDK CLI and Docker at the command-line boundary; ``on`` maps the first
    argument after the program (``deploy``, ``destroy``, ``info``) to what that command does."""

    def __init__(self, **on):
        self.calls: list[list[str]] = []
        self.on = on

    def __call__(self, argv, env):
        self.calls.append(list(argv))
        action = self.on.get(argv[1])
        return action(argv, env) if action else 0

    def verbs(self):
        return [(Path(c[0]).name, c[1]) for c in self.calls]


def _context(argv) -> dict[str, str]:
    return dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "-c")


def test_plan_states_cost_and_time_and_refusal_creates_nothing(aws_env, monkeypatch, capsys):
    boto3.client("ssm").put_parameter(Name=smoke.CDK_BOOTSTRAP_PARAMETER, Value="30", Type="String")
    monkeypatch.setattr("sys.stdin", io.StringIO("n\n"))
    runner = Recorder()

    assert smoke.main(["--region", "us-east-1"], runner=runner) == 1

    out = capsys.readouterr().out
    settings = smoke.Settings(region="us-east-1")
    items = smoke.cost_items(settings)
    assert f"${sum(i.usd for i in items):6.2f}  total" in out
    assert "EC2 cluster: 2 x m5.xlarge" in out and "SageMaker training: 2 x ml.m5.xlarge" in out
    total_minutes = sum(s.minutes for s in smoke.steps(settings))
    assert f"total      {total_minutes:.0f}" in out
    for step in ("deploy", "dataset", "stage", "train", "results", "teardown"):
        assert f"  {step} " in out
    assert "account 123456789012" in out and out.rstrip().endswith("nothing created")
    # The deployment pre-flight ran first: 2 x m5.xlarge = 8 vCPUs of the Standard quota.
    assert out.index("PASS  vcpu-quota: Running On-Demand Standard") < out.index("checked: account")
    # No command ran (Docker is not needed: without it the image is built in the account); nothing
    # was deployed or uploaded.
    assert runner.verbs() == []
    assert boto3.client("cloudformation").list_stacks()["StackSummaries"] == []
    assert boto3.client("s3").list_buckets()["Buckets"] == []


def test_cost_follows_the_instance_types_and_counts():
    def ec2(settings):
        return next(i.usd for i in smoke.cost_items(settings) if i.what.startswith("EC2"))

    base = smoke.Settings()
    assert ec2(smoke.Settings(worker_count=3)) == pytest.approx(2 * ec2(base))
    assert ec2(smoke.Settings(cluster_instance_type="c5.xlarge")) < ec2(base)
    worst = smoke.cost_items(base, train_minutes=base.job_timeout_s / 60)
    assert sum(i.usd for i in worst) > sum(i.usd for i in smoke.cost_items(base))
    # infra/instance_types.py records no price for p5e.48xlarge: the plan refuses to guess one.
    with pytest.raises(smoke.LaunchError, match="no price recorded for 'p5e.48xlarge'"):
        smoke.cost_items(smoke.Settings(cluster_instance_type="p5e.48xlarge"))


def test_smoke_context_is_accepted_by_the_app_config():
    from infra import settings
    context = _context(smoke.Settings().cdk_context())
    assert context["settings_file"] == "none"   # never the user's own deployment's settings
    config = settings.resolve(context).config
    assert config.gpus_per_node == 0 and config.worker_count == 1
    assert config.stack_name("EfsClusterStack") == smoke.Settings().stack_name("EfsClusterStack")


def test_a_prefix_the_app_refuses_stops_before_anything(aws_env, capsys):
    runner = Recorder()
    assert smoke.main(["--yes", "--name-prefix", "smoke_1"], runner=runner) == 2
    assert runner.calls == []
    assert "infra/config.py refuses the smoke configuration: context key 'name_prefix'" in capsys.readouterr().out


def test_a_failed_preflight_check_stops_before_the_smoke_checks_and_anything(aws_env, capsys):
    ec2 = boto3.client("ec2")
    for _ in range(4):   # of the 5 Elastic IPs: 1 left, the NAT gateway and the master need 2
        ec2.allocate_address(Domain="vpc")
    runner = Recorder()

    assert smoke.main(["--yes"], runner=runner) == 2

    out = capsys.readouterr().out
    assert "the pre-flight found what would stop the deploy (nothing was created)" in out
    assert ("elastic-ip-quota: EC2-VPC Elastic IPs (L-0263D0A3) is 5 addresses, 4 allocated: "
            "1 available, 2 needed") in out
    # Before the smoke's own checks: no Docker check, and no word of the missing CDK bootstrap.
    assert runner.calls == [] and "not CDK-bootstrapped" not in out


def test_a_failed_deploy_is_still_torn_down(aws_env, capsys):
    boto3.client("ssm").put_parameter(Name=smoke.CDK_BOOTSTRAP_PARAMETER, Value="30", Type="String")
    runner = Recorder(deploy=lambda argv, env: 1)

    assert smoke.main(["--yes"], runner=runner) == 1

    assert runner.verbs() == [("cdk", "deploy"), ("cdk", "destroy")]
    deploy, destroy = runner.calls
    assert _context(destroy) == _context(deploy) == _context(smoke.Settings().cdk_context())
    assert set(smoke.STACK_IDS) <= set(destroy) and "--force" in destroy
    out = capsys.readouterr().out
    assert "step deploy failed: cdk deploy failed" in out and "SMOKE TEST FAILED" in out


EVAL = {"epoch": 8, "global_step": 2000,
        **{name: 0.9 if "IoU=0.5" in name else 0.7 for name in EVALUATION_METRICS}}


def _emulate_agent_and_scraping(session):
    """What moto does not do: run the SSM command on the master (only the `cat` of a finished
    run's eval_results.json has an output worth emulating) and scrape the job's metrics."""
    scripts = {}
    session.events.register("after-call.ssm.SendCommand", lambda parsed, **kw: scripts.__setitem__(
        parsed["Command"]["CommandId"], parsed["Command"]["Parameters"]["commands"][0]))

    def invocation(parsed, **kw):
        script = scripts[parsed["CommandId"]]
        if script.startswith("cat ") and script.endswith("/eval_results.json"):
            parsed["StandardOutputContent"] = json.dumps([EVAL])

    def job(parsed, **kw):
        parsed["FinalMetricDataList"] = [{"MetricName": k, "Value": v} for k, v in EVAL.items()
                                         if k.startswith("mAP")]
    session.events.register("after-call.ssm.GetCommandInvocation", invocation)
    session.events.register("after-call.sagemaker.DescribeTrainingJob", job)
    return scripts


@pytest.mark.slow
def test_whole_run_in_moto(sagemaker_env, tmp_path, capsys):
    cdk_synth = _cdk_synth()
    cdk_synth.prepare_moto_account()
    cloudformation = boto3.client("cloudformation")
    deployed, master_groups, masters, started = [], [], set(), []
    network = smoke.Settings().stack_name("NetworkStorageStack")

    def deploy(argv, env):
        synth = cdk_synth.synthesize(tmp_path / "cdk.out", _context(argv))
        for stack_id in smoke.STACK_IDS:   # in the order `cdk deploy` creates them
            stack = cdk_synth.deploy_to_moto(cloudformation, synth.stack_names[stack_id], synth.templates[stack_id])
            assert stack["StackStatus"] == "CREATE_COMPLETE", stack.get("StackStatusReason")
            deployed.append(synth.stack_names[stack_id])
            if stack_id == "EfsClusterStack":
                master_groups.append(next(o["OutputValue"] for o in stack["Outputs"]
                                          if o["OutputKey"] == "MasterAutoScalingGroupName"))
        return 0

    def destroy(argv, env):
        # moto deletes the training stacks, but refuses the network stack: CloudFormation in moto
        # leaves the cluster's instances and network interfaces in the VPC ("DependencyViolation").
        for name in reversed(deployed):
            try:
                cloudformation.delete_stack(StackName=name)
            except cloudformation.exceptions.ClientError as err:
                assert name == network and "DependencyViolation" in str(err)
                return 1
        return 0

    runner = Recorder(deploy=deploy, destroy=destroy)
    session = boto3.session.Session()
    sent_commands = []
    session.events.register("before-send.ssm.SendCommand",
                            lambda request, **kw: sent_commands.append(json.loads(request.body)))
    training_jobs = capture_requests(session)
    _emulate_agent_and_scraping(session)
    # A deploy starts no node: the smoke starts both groups, then sends its commands to the master.
    session.events.register("provide-client-params.autoscaling.SetDesiredCapacity",
                            lambda params, **kw: started.append((params["AutoScalingGroupName"],
                                                                 params["DesiredCapacity"])))
    session.events.register("after-call.autoscaling.DescribeAutoScalingGroups", lambda parsed, **kw: masters.update(
        i["InstanceId"] for g in parsed["AutoScalingGroups"] if g["AutoScalingGroupName"] in master_groups
        for i in g["Instances"] if i["LifecycleState"] == "InService"))
    settings = smoke.Settings(region="us-east-1", dataset={"train": 6, "val": 3, "size": 64},
                              delete_data=True, poll_seconds=0)

    # Every step passes; the teardown reports what moto could not delete, with the command to rerun.
    assert smoke.run(settings, session=session, runner=runner, assume_yes=True) == 1

    out = capsys.readouterr().out
    assert runner.verbs() == [("cdk", "deploy"), ("cdk", "destroy")]
    assert sum(line.startswith("bbox ") for line in out.splitlines()) == 2, out   # both tables printed
    assert " failed: " not in out and "SMOKE TEST FAILED" in out
    assert "TEARDOWN FAILED" in out and "cdk destroy --force" in out and "teardown incomplete" in out
    statuses = {s["StackName"]: s["StackStatus"] for s in cloudformation.list_stacks()["StackSummaries"]}
    assert all(statuses[name] == "DELETE_COMPLETE" for name in deployed if name != network)
    # Nothing retained is deleted while a stack still uses it.
    assert not any(line.startswith("deleted ") for line in out.splitlines())

    # The dataset went to the deployment's bucket.
    uploaded = [line for line in out.splitlines() if line.startswith("uploaded ")]
    assert uploaded and "/data/maskrcnn-smoke/" in uploaded[0] and "uploaded 11 file(s)" in uploaded[0]
    bucket = uploaded[0].split("s3://")[1].split("/")[0]
    keys = {o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket=bucket)["Contents"]}
    assert "data/maskrcnn-smoke/annotations/instances_train2017.json" in keys and len(keys) == 11

    # Every SSM command goes to the master, as a shell script with its execution timeout.
    assert {c["DocumentName"] for c in sent_commands} == {"AWS-RunShellScript"}
    assert (master_groups[0], 1) in started
    assert [d for g, d in started if g != master_groups[0]] == [settings.worker_count]
    assert len(masters) == 1 and all(c["InstanceIds"] == list(masters) for c in sent_commands)
    stage, train, *reads = [c["Parameters"]["commands"][0] for c in sent_commands]
    to_efs = shlex.split(stage.splitlines()[1])
    assert to_efs[:7] == ["docker", "exec", "maskrcnn", "python", "-m", "launch.staging", "to-efs"]
    assert to_efs[to_efs.index("--prefix") + 1] == "data/maskrcnn-smoke"
    assert to_efs[to_efs.index("--efs-dir") + 1] == "/efs/data/maskrcnn-smoke"
    assert "mkdir -p /efs/logs" in stage
    command = shlex.split(train.splitlines()[0])
    command = command[:command.index(">")]
    assert command[:4] == ["/usr/local/bin/maskrcnn", "job", "submit", "--wait"]
    assert command[command.index("--data-dir") + 1] == "/efs/data/maskrcnn-smoke"
    assert command[-len(cpu_synthetic.OVERRIDES):] == cpu_synthetic.OVERRIDES
    assert sent_commands[1]["Parameters"]["executionTimeout"] == [str(settings.job_timeout_s)]
    assert len(reads) == 2 and all(r.startswith("cat /efs/logs/") for r in reads)

    # The SageMaker job: 2 CPU instances, the dataset's EFS directory, the preset by config:KEY.
    (job,) = training_jobs
    assert job["ResourceConfig"]["InstanceCount"] == 2
    assert job["ResourceConfig"]["InstanceType"] == "ml.m5.xlarge"
    assert job["HyperParameters"] == smoke.preset_hyperparameters()
    channels = {c["ChannelName"]: c["DataSource"]["FileSystemDataSource"] for c in job["InputDataConfig"]}
    assert channels["train"]["DirectoryPath"] == "/data/maskrcnn-smoke"
    assert channels["log"]["DirectoryPath"] == "/logs"
    run_name = job["Environment"]["MASKRCNN_RUN_NAME"]
    assert f"cat /efs/logs/{run_name}/eval_results.json" in reads


def test_delete_data_removes_the_retained_file_system_and_buckets(aws_env):
    efs, s3 = boto3.client("efs"), boto3.client("s3")
    fs_id = efs.create_file_system(CreationToken="smoke")["FileSystemId"]
    for bucket in ("smoke-data", "smoke-logs"):
        s3.create_bucket(Bucket=bucket)
        s3.put_object(Bucket=bucket, Key="data/x/a.json", Body=b"{}")
    runner = Recorder()
    run = smoke.Smoke(smoke.Settings(poll_seconds=0), session=boto3.session.Session(), runner=runner,
                      out=lambda text: None)
    run.retained = {"buckets": ["smoke-data", "smoke-logs"], "file_systems": [fs_id]}

    run.delete_data()

    assert efs.describe_file_systems()["FileSystems"] == []
    assert s3.list_buckets()["Buckets"] == []


def test_tables_below_target_or_misscraped_fail_the_check():
    table = {k: v for k, v in EVAL.items() if k.startswith("mAP")}
    scraped = dict(table)
    assert smoke.check_tables({"cluster": table, "sm": table}, scraped, "sm") == []
    low = {**table, "mAP(segm)/IoU=0.5": 0.2}
    assert smoke.check_tables({"cluster": low, "sm": table}, scraped, "sm") == [
        "cluster: mAP(segm)/IoU=0.5 is 0.2, below the target 0.5"]
    # A metric regex capturing another line's number (e.g. the 0.95 of "IoU=0.5:0.95"), or none.
    wrong = {**scraped, "mAP(bbox)/IoU=0.5": 0.95}
    del wrong["mAP(segm)/IoU=0.5"]
    problems = smoke.check_tables({"cluster": table, "sm": table}, wrong, "sm")
    assert len(problems) == 2 and all("SageMaker's metric" in p for p in problems)
