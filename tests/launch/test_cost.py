"""The estimated cost at the end of a training run: the cluster's (nodes x wall hours x the EC2
price) and a finished SageMaker job's (BillableTimeInSeconds x InstanceCount x the ml.* price;
AWS's DescribeTrainingJob reference: "Multiply BillableTimeInSeconds by the number of instances
(InstanceCount) ... to get the total compute time SageMaker bills you"). Every expected dollar
figure is worked out by hand below from the prices infra/instance_types.py records (written out
here: c5.xlarge $0.17/h, p4d.24xlarge $21.96/h, ml.g5.12xlarge $7.09/h). A type without a price
there is priced from AWS's Price List (GetProducts, which moto does not implement): answered by
tests/launch/recorded_aws/get_products.json, written from the API reference, whose prices are chosen
for the tests (ml.p4d.24xlarge $12.5/h, ml.p5.48xlarge $40/h, p5en.48xlarge $60/h), not AWS's."""
import json
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import boto3
import pytest

from launch import cost
from launch.cluster import jobs
from launch.sagemaker import launcher
from recorded_aws import Replay, linux_hour_query, training_hour_query


def _no_credentials(monkeypatch, tmp_path):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def test_cluster_cost_is_nodes_times_hours_times_price():
    # 4 nodes x 2.5 h x $21.96/h = $219.60
    estimate = cost.estimate("p4d.24xlarge", 4, 2.5 * 3600)
    assert estimate.usd == pytest.approx(219.60)
    assert estimate.line().startswith("estimated cost: $219.60 = 4 x p4d.24xlarge x 2.50 h x $21.96/h "
                                      "(on-demand list price in us-east-1")


def test_an_unknown_price_is_said_not_guessed():
    line = cost.estimate("p5e.48xlarge", 2, 3600).line()
    assert line.startswith("estimated cost: no price recorded for p5e.48xlarge in infra/instance_types.py; "
                           "its on-demand price: https://aws.amazon.com/ec2/pricing/on-demand/ ")
    assert line.endswith("(2 x p5e.48xlarge x 1.00 h)")
    assert "$" not in line
    assert cost.price_per_hour("ml.p4d.24xlarge") is None
    assert cost.price_per_hour("x9.nothing") is None


# Slurm 22.05's job-completion log (jobcomp/filetxt) as the emulated cluster wrote it: a run's first
# attempt (requeued after a node was lost, so logged as PENDING), its second, and a run cancelled
# before it started. The start and end times are moved to give whole hours.
JOB_LOG = """\
JobId=1 UserId=root(0) GroupId=root(0) Name=coco-24ep JobState=PENDING Partition=train TimeLimit=UNLIMITED StartTime=2026-11-24T08:00:00 EndTime=2026-11-24T09:00:00 NodeList=master,worker-[1-2] NodeCnt=3 ProcCnt=6 WorkDir=/work/main ReservationName= Tres=cpu=3,mem=3M,node=3,billing=3 Account= QOS= WcKey= Cluster=unknown SubmitTime=2026-11-24T07:59:59 EligibleTime=2026-11-24T07:59:59 DerivedExitCode=0:0 ExitCode=0:0
JobId=1 UserId=root(0) GroupId=root(0) Name=coco-24ep JobState=COMPLETED Partition=train TimeLimit=525600 StartTime=2026-11-24T09:10:00 EndTime=2026-11-24T09:40:00 NodeList=master,worker-[1-2] NodeCnt=3 ProcCnt=6 WorkDir=/work/main ReservationName= Tres=cpu=3,mem=3M,node=3,billing=3 Account= QOS= WcKey= Cluster=unknown SubmitTime=2026-11-24T07:59:59 EligibleTime=2026-11-24T09:02:00 DerivedExitCode=0:0 ExitCode=0:0
JobId=2 UserId=root(0) GroupId=root(0) Name=other JobState=CANCELLED Partition=train TimeLimit=UNLIMITED StartTime=2026-11-24T12:31:25 EndTime=2026-11-24T12:31:25 NodeList=(null) NodeCnt=0 ProcCnt=6 WorkDir=/work/main ReservationName= Tres=cpu=3,mem=3M,node=3,billing=3 Account= QOS= WcKey= Cluster=unknown SubmitTime=2026-11-24T12:31:24 EligibleTime=2026-11-24T12:31:24 DerivedExitCode=0:0 ExitCode=0:0
"""


def test_a_cluster_run_costs_its_nodes_for_every_attempt(tmp_path):
    env = {"EFS_MOUNT": str(tmp_path), "STACK_NAME": "c", "INSTANCE_TYPE": "p4d.24xlarge"}
    log = jobs.slurm.layout(env).job_log
    log.parent.mkdir(parents=True)
    log.write_text(JOB_LOG)
    # 3 nodes x (1 h + 0.5 h) x $21.96/h = $98.82; the nodes' time between the attempts is not the run's.
    assert jobs.run_cost(env, "coco-24ep") == cost.estimate("p4d.24xlarge", 3, 1.5 * 3600).line()
    assert jobs.run_cost(env, "coco-24ep").startswith("estimated cost: $98.82 = 3 x p4d.24xlarge x 1.50 h")
    assert jobs.run_cost(env, "other") is None           # cancelled before it had nodes
    assert jobs.run_cost(env, "never-submitted") is None


def test_a_cluster_run_of_a_type_without_a_recorded_price_is_priced_from_the_price_list(
        aws_env, tmp_path, monkeypatch):
    """p5en.48xlarge in us-west-2 (the master's AWS_REGION): 3 nodes x 1.5 h x $60/h = $270."""
    env = {"EFS_MOUNT": str(tmp_path), "STACK_NAME": "c", "INSTANCE_TYPE": "p5en.48xlarge",
           "AWS_REGION": "us-west-2"}
    log = jobs.slurm.layout(env).job_log
    log.parent.mkdir(parents=True)
    log.write_text(JOB_LOG)
    query = linux_hour_query("p5en.48xlarge", "us-west-2")
    with Replay({"GetProducts": {query: "p5en.48xlarge-us-west-2"}}).serve() as url:
        monkeypatch.setenv("AWS_ENDPOINT_URL_PRICING", url)
        assert jobs.run_cost(env, "coco-24ep").startswith(
            "estimated cost: $270.00 = 3 x p5en.48xlarge x 1.50 h x $60/h (on-demand price in us-west-2 "
            "from AWS's Price List, effective 2025-07-01, read ")


def _job(**fields):
    return {"TrainingJobStatus": "Completed",
            "ResourceConfig": {"InstanceType": "ml.g5.12xlarge", "InstanceCount": 2}, **fields}


def test_sagemaker_cost_uses_the_billable_seconds_per_instance():
    # Managed spot: 5400 s trained, 1800 s billable per instance. 2 x 0.5 h x $7.09/h = $7.09
    estimate = launcher.job_cost(_job(BillableTimeInSeconds=1800, TrainingTimeInSeconds=5400))
    assert estimate.usd == pytest.approx(7.09)
    # Without a billable time: the training time. 2 x 1.5 h x $7.09/h = $21.27
    assert launcher.job_cost(_job(TrainingTimeInSeconds=5400)).usd == pytest.approx(21.27)
    # Without either: the interval SageMaker bills, TrainingStartTime to TrainingEndTime (45 min).
    start = datetime(2025, 3, 1, 8, tzinfo=timezone.utc)
    # 2 x 0.75 h x $7.09/h = $10.635
    assert launcher.job_cost(_job(TrainingStartTime=start, TrainingEndTime=start + timedelta(minutes=45))
                             ).usd == pytest.approx(10.635)
    assert launcher.job_cost(_job(TrainingJobStatus="InProgress", BillableTimeInSeconds=60)) is None
    assert launcher.job_cost(_job(TrainingJobStatus="Stopped", BillableTimeInSeconds=3600)).usd == pytest.approx(14.18)


def _finished_job(name: str, instance_type: str, count: int, billable_seconds: int):
    """A training job in moto, finished, as DescribeTrainingJob answers for it; returns the session."""
    session = boto3.session.Session()
    session.client("sagemaker").create_training_job(
        TrainingJobName=name, RoleArn="arn:aws:iam::123456789012:role/SageMakerTrainingRole",
        AlgorithmSpecification={"TrainingImage": "123456789012.dkr.ecr.us-east-1.amazonaws.com/x:y",
                                "TrainingInputMode": "File"},
        OutputDataConfig={"S3OutputPath": "s3://bucket/out"},
        ResourceConfig={"InstanceType": instance_type, "InstanceCount": count, "VolumeSizeInGB": 50},
        StoppingCondition={"MaxRuntimeInSeconds": 86400})

    # moto completes a job at once and reports no billed time: add SageMaker's figure to its answer.
    def billed(parsed, **kwargs):
        parsed["BillableTimeInSeconds"] = billable_seconds

    session.events.register("after-call.sagemaker.DescribeTrainingJob", billed)
    return session


def test_describe_of_a_finished_job_states_its_cost(sagemaker_env, capsys):
    session = _finished_job("maskrcnn-2025", "ml.g5.12xlarge", 2, 5400)
    described = launcher.describe_job("maskrcnn-2025", session)
    # 2 x 1.5 h x $7.09/h = $21.27
    assert described["EstimatedCostUSD"] == 21.27
    assert described["EstimatedCost"].startswith("estimated cost: $21.27 = 2 x ml.g5.12xlarge x 1.50 h x $7.09/h")
    json.dumps(described, default=str)   # describe prints it as JSON


def test_the_cost_command_prices_the_deployment_s_cluster_or_a_sagemaker_job(tmp_path, capsys, monkeypatch):
    """`maskrcnn cost`: p4d.24xlarge at its us-east-1 on-demand list price, $21.96/h (AWS's EC2
    pricing page), for a master and 3 workers, 2 hours: 4 x 2 x 21.96 = $175.68; 2 ml.m5.xlarge
    at $0.23/h for 10 hours: $4.60."""
    settings = tmp_path / "settings.json"
    settings.write_text(json.dumps({"instance_type": "p4d.24xlarge", "worker_count": 3}))
    assert cost.main(["--settings-file", str(settings), "--hours", "2", "--json"]) == 0
    line = json.loads(capsys.readouterr().out)
    assert (line["instances"], line["usd"]) == (4, pytest.approx(175.68))
    assert cost.main(["--instance-type", "ml.m5.xlarge", "--instances", "2", "--hours", "10"]) == 0
    assert "$4.60 = 2 x ml.m5.xlarge x 10.00 h" in capsys.readouterr().out
    # The README's SageMaker types have no price in the table; without AWS credentials the Price
    # List cannot be asked: said, with AWS's page, never a guessed figure or a zero.
    _no_credentials(monkeypatch, tmp_path)
    for recommended in ("ml.p4d.24xlarge", "ml.p5.48xlarge"):
        assert cost.main(["--instance-type", recommended, "--json"]) == 2
        captured = capsys.readouterr()
        assert captured.out == ""
        assert captured.err == (f"error: no price recorded for {recommended} in infra/instance_types.py; its "
                                "on-demand price: https://aws.amazon.com/sagemaker/pricing/ (add it to the "
                                "table, with the date it was read, for an estimate); AWS's Price List API "
                                "needs AWS credentials (`aws configure` or `aws sso login`)\n")
    settings.write_text(json.dumps({"instance_type": "p9.huge"}))
    assert cost.main(["--settings-file", str(settings)]) == 2
    assert capsys.readouterr().err.startswith("error: ")


def test_the_image_holds_every_infra_module_the_master_commands_import():
    """maskrcnn job (with its cost line), the job body and the idle check run in the training image,
    which holds only what docker/Dockerfile copies: every infra module they import must be among it."""
    import subprocess
    from infra.constructs.training_image import dockerfile_copy_sources

    repo = Path(__file__).resolve().parents[2]
    code = ("import sys, launch.cluster.jobs, launch.cluster.job, launch.cluster.idle, launch.cluster.slurm\n"
            "for name, module in sorted(sys.modules.items()):\n"
            "    if name.split('.')[0] == 'infra' and getattr(module, '__file__', None):\n"
            "        print(module.__file__)\n")
    files = subprocess.run([sys.executable, "-c", code], cwd=repo, capture_output=True, text=True,
                           check=True).stdout.split()
    needed = sorted(Path(f).resolve().relative_to(repo).as_posix() for f in files)
    copied = dockerfile_copy_sources(repo / "docker" / "Dockerfile")
    assert "infra/instance_types.py" in needed           # the prices of the cost line
    assert [f for f in needed if not any(f == c or f.startswith(f"{c}/") for c in copied)] == []


def test_a_settings_file_that_does_not_exist_is_an_error_not_the_default_cluster(tmp_path, capsys):
    missing = tmp_path / "nope.json"
    assert cost.main(["--settings-file", str(missing)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"error: settings file {missing} (named by --settings-file) "
                                   "does not exist; check the path"), captured.err


def test_the_readme_s_sagemaker_types_are_priced_from_aws_s_price_list_dated(aws_env, monkeypatch, capsys):
    """ml.p4d.24xlarge and ml.p5.48xlarge: the Price List's on-demand training hour in the asked
    region, with its effective date. 2 x 3 h x $12.5/h = $75; 4 x 0.5 h x $40/h = $80."""
    replay = Replay({"GetProducts": {training_hour_query("ml.p4d.24xlarge"): "ml.p4d.24xlarge-training",
                                     training_hour_query("ml.p5.48xlarge", "eu-west-1"): "ml.p5.48xlarge-training"}})
    with replay.serve() as url:
        monkeypatch.setenv("AWS_ENDPOINT_URL_PRICING", url)
        assert cost.main(["--instance-type", "ml.p4d.24xlarge", "--instances", "2", "--hours", "3", "--json"]) == 0
        line = json.loads(capsys.readouterr().out)
        assert (line["usd"], line["usd_per_hour"]) == (pytest.approx(75.0), pytest.approx(25.0))
        assert line["basis"] == (f"on-demand price in us-east-1 from AWS's Price List, effective 2025-06-01, "
                                 f"read {datetime.now().date().isoformat()}")
        assert cost.main(["--instance-type", "ml.p5.48xlarge", "--instances", "4", "--hours", "0.5",
                          "--region", "eu-west-1"]) == 0
        out = capsys.readouterr().out
        assert out.startswith("SageMaker job: estimated cost: $80.00 = 4 x ml.p5.48xlarge x 0.50 h x $40/h "
                              "(on-demand price in eu-west-1 from AWS's Price List, effective 2025-06-01, read ")
        # a recorded price is used as it is, without asking AWS
        assert cost.main(["--instance-type", "ml.m5.xlarge"]) == 0
    assert [key for _, key in replay.answered] == [training_hour_query("ml.p4d.24xlarge"),
                                                   training_hour_query("ml.p5.48xlarge", "eu-west-1")]


def test_a_cluster_type_without_a_recorded_price_is_read_as_a_linux_on_demand_hour(aws_env, tmp_path,
                                                                                   monkeypatch, capsys):
    """p5en.48xlarge (no price in the table) in us-west-2: EC2's BoxUsage hour of Linux, shared
    tenancy, no preinstalled software, capacity used. Master + 1 worker, 2 h: 2 x 2 x $60/h = $240."""
    settings = tmp_path / "settings.json"
    settings.write_text(json.dumps({"instance_type": "p5en.48xlarge", "worker_count": 1}))
    query = linux_hour_query("p5en.48xlarge", "us-west-2")
    with Replay({"GetProducts": {query: "p5en.48xlarge-us-west-2"}}).serve() as url:
        monkeypatch.setenv("AWS_ENDPOINT_URL_PRICING", url)
        monkeypatch.setenv("AWS_REGION", "us-west-2")
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-west-2")
        assert cost.main(["--settings-file", str(settings), "--hours", "2"]) == 0
    assert capsys.readouterr().out.startswith(
        "cluster (master and workers, while they run): estimated cost: $240.00 = 2 x p5en.48xlarge x 2.00 h "
        "x $60/h (on-demand price in us-west-2 from AWS's Price List, effective 2025-07-01, read ")


@pytest.mark.parametrize("answer, said", [
    ("none", "AWS's Price List has no on-demand hourly price of ml.p5.48xlarge in us-east-1 "
             "(AmazonSageMaker, usage type *-Train:ml.p5.48xlarge); the type may not be offered there"),
    ("two-prices", "AWS's Price List gives 2 on-demand hourly prices of ml.p5.48xlarge in us-east-1 "
                   "($40, $44), not one"),
    ("access-denied", "these credentials may not read AWS's Price List: allow pricing:GetProducts"),
    ("internal-error", "AWS's Price List API failed (HTTP 500); try again later"),
])
def test_a_price_list_without_one_price_is_an_error_naming_aws_s_page(aws_env, monkeypatch, capsys, answer, said):
    with Replay({"GetProducts": {training_hour_query("ml.p5.48xlarge"): answer}}).serve() as url:
        monkeypatch.setenv("AWS_ENDPOINT_URL_PRICING", url)
        assert cost.main(["--instance-type", "ml.p5.48xlarge", "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == ("error: no price recorded for ml.p5.48xlarge in infra/instance_types.py; its "
                            "on-demand price: https://aws.amazon.com/sagemaker/pricing/ (add it to the table, "
                            f"with the date it was read, for an estimate); {said}\n")


def test_describe_of_a_finished_p4d_job_states_its_cost_from_the_price_list(sagemaker_env, monkeypatch):
    session = _finished_job("maskrcnn-p4d", "ml.p4d.24xlarge", 4, 7200)
    with Replay({"GetProducts": {training_hour_query("ml.p4d.24xlarge"): "ml.p4d.24xlarge-training"}}).serve() as url:
        monkeypatch.setenv("AWS_ENDPOINT_URL_PRICING", url)
        described = launcher.describe_job("maskrcnn-p4d", session)
    # 4 x 2 h x $12.5/h = $100
    assert described["EstimatedCostUSD"] == 100.0
    assert described["EstimatedCost"].startswith(
        "estimated cost: $100.00 = 4 x ml.p4d.24xlarge x 2.00 h x $12.5/h (on-demand price in us-east-1 "
        "from AWS's Price List, effective 2025-06-01")
