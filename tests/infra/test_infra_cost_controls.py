"""Cost controls: the optional monthly budget (shared stack) and the notebook's idle stop.

The budget and the permissions are read from the synthesized templates. The idle check
(infra/userdata/notebook_idle_stop.py) runs against a real Jupyter server on 127.0.0.1, served over
HTTPS with a self-signed certificate and no token as on a notebook instance, with a real kernel and
terminal, and against moto for DescribeNotebookInstance and StopNotebookInstance through the AWS
CLI; its clock is passed in."""
from __future__ import annotations

import ast
import base64
import datetime as dt
import json
import os
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import boto3
import pytest

from infra import outputs
from infra.constructs.notebook import IDLE_STOP_SCRIPT
from infra.userdata import notebook_idle_stop as idle_stop

from aws_fakes import free_port
from cdk_synth import cfn_lint_problems, synthesize
from machine import python_interpreter, require

SHARED = outputs.NETWORK_STORAGE_STACK
SAGEMAKER = outputs.SAGEMAKER_STACK
IDLE = dt.timedelta(minutes=45)


@pytest.fixture(scope="module")
def cost_synth(tmp_path_factory):
    """A budget of 500 USD a month and a 45-minute idle stop, as `-c` passes them."""
    return synthesize(tmp_path_factory.mktemp("cdk-cost"),
                      {"monthly_budget_usd": "500", "notebook_idle_minutes": "45"})


@pytest.fixture(scope="module")
def no_idle_stop_synth(tmp_path_factory):
    return synthesize(tmp_path_factory.mktemp("cdk-no-idle-stop"), {"notebook_idle_minutes": "0"})


def only(synth, stack: str, resource_type: str) -> tuple[str, dict]:
    (item,) = synth.resources(stack, resource_type).items()
    return item


def topic_statements(synth) -> list[dict]:
    _, policy = only(synth, SHARED, "AWS::SNS::TopicPolicy")
    return policy["Properties"]["PolicyDocument"]["Statement"]


def notebook_role_statements(synth) -> list[dict]:
    role_id = next(lid for lid in synth.resources(SAGEMAKER, "AWS::IAM::Role")
                   if lid.startswith("NotebookRole"))
    return [s for p in synth.resources(SAGEMAKER, "AWS::IAM::Policy").values()
            if {"Ref": role_id} in p["Properties"]["Roles"]
            for s in p["Properties"]["PolicyDocument"]["Statement"]]


def as_list(value) -> list:
    return value if isinstance(value, list) else [value]


def lifecycle_script(synth, **values: str) -> str:
    """The on-start script as CloudFormation renders it, references replaced by `values` (by
    logical id or pseudo parameter) or by <value>."""
    _, config = only(synth, SAGEMAKER, "AWS::SageMaker::NotebookInstanceLifecycleConfig")
    parts = config["Properties"]["OnStart"][0]["Content"]["Fn::Base64"]["Fn::Join"][1]

    def render(part) -> str:
        if isinstance(part, str):
            return part
        if "Ref" in part:
            return values.get(part["Ref"].split("::")[-1], "<value>")
        return values.get(next(iter(part)), "<value>")

    return "".join(render(p) for p in parts)


# --- Budget ----------------------------------------------------------------------------------

def test_no_budget_by_default(default_synth, variant_synth):
    for synth in (default_synth, variant_synth):
        for stack in synth.templates:
            assert not synth.resources(stack, "AWS::Budgets::Budget")
        assert not [s for s in topic_statements(synth)
                    if s.get("Principal") == {"Service": "budgets.amazonaws.com"}]


def test_budget_is_a_monthly_cost_budget_of_the_project_tag(cost_synth):
    assert not cost_synth.resources(SAGEMAKER, "AWS::Budgets::Budget")
    _, budget = only(cost_synth, SHARED, "AWS::Budgets::Budget")
    data = budget["Properties"]["Budget"]
    assert data["BudgetType"] == "COST" and data["TimeUnit"] == "MONTHLY"
    assert data["BudgetLimit"] == {"Amount": 500, "Unit": "USD"}
    # Budgets' form for a user-defined cost allocation tag: user:<key>$<value>.
    assert data["CostFilters"] == {"TagKeyValue": ["user:project$maskrcnn-on-aws"]}


def test_budget_tells_the_alerts_topic_at_80_percent_actual_and_100_percent_forecast(cost_synth):
    topic_id, _ = only(cost_synth, SHARED, "AWS::SNS::Topic")
    _, budget = only(cost_synth, SHARED, "AWS::Budgets::Budget")
    subscribers = [{"SubscriptionType": "SNS", "Address": {"Ref": topic_id}}]
    assert budget["Properties"]["NotificationsWithSubscribers"] == [
        {"Notification": {"NotificationType": "ACTUAL", "ComparisonOperator": "GREATER_THAN",
                          "Threshold": 80, "ThresholdType": "PERCENTAGE"},
         "Subscribers": subscribers},
        {"Notification": {"NotificationType": "FORECASTED", "ComparisonOperator": "GREATER_THAN",
                          "Threshold": 100, "ThresholdType": "PERCENTAGE"},
         "Subscribers": subscribers},
    ]


def test_topic_policy_lets_only_this_accounts_budgets_publish(cost_synth):
    topic_id, _ = only(cost_synth, SHARED, "AWS::SNS::Topic")
    policy_id, _ = only(cost_synth, SHARED, "AWS::SNS::TopicPolicy")
    (statement,) = [s for s in topic_statements(cost_synth)
                    if s.get("Principal") == {"Service": "budgets.amazonaws.com"}]
    assert statement["Effect"] == "Allow"
    assert as_list(statement["Action"]) == ["sns:Publish"]
    assert statement["Resource"] == {"Ref": topic_id}
    assert statement["Condition"] == {
        "StringEquals": {"aws:SourceAccount": {"Ref": "AWS::AccountId"}},
        "ArnLike": {"aws:SourceArn": {"Fn::Join": ["", [
            "arn:", {"Ref": "AWS::Partition"}, ":budgets::", {"Ref": "AWS::AccountId"},
            ":*"]]}},
    }
    # CloudWatch alarms still publish, and the budget is created after the policy.
    assert [s for s in topic_statements(cost_synth)
            if s.get("Principal") == {"Service": "cloudwatch.amazonaws.com"}]
    _, budget = only(cost_synth, SHARED, "AWS::Budgets::Budget")
    assert policy_id in budget["DependsOn"]


@pytest.mark.parametrize("synth_fixture", ["cost_synth", "no_idle_stop_synth"])
def test_cost_control_templates_pass_cfn_lint(request, synth_fixture):
    """test_infra_checks.py's cfn-lint check on these configurations (cdk-nag ran in synth)."""
    synth = request.getfixturevalue(synth_fixture)
    for stack, template in synth.templates.items():
        assert cfn_lint_problems(template) == [], stack


# --- Notebook idle stop: template -------------------------------------------------------------

def test_notebook_may_describe_and_stop_only_itself(default_synth):
    notebook_id, _ = only(default_synth, SAGEMAKER, "AWS::SageMaker::NotebookInstance")
    statements = [s for s in notebook_role_statements(default_synth)
                  if any(a.endswith("NotebookInstance") for a in as_list(s["Action"]))]
    # Ref of a notebook instance is its ARN as SageMaker reports it.
    assert statements == [{
        "Sid": "StopThisNotebookWhenIdle", "Effect": "Allow",
        "Action": ["sagemaker:DescribeNotebookInstance", "sagemaker:StopNotebookInstance"],
        "Resource": {"Ref": notebook_id}}]
    # In a policy of its own, so the one the first start downloads with does not wait for the
    # instance.
    (policy,) = [p for p in default_synth.resources(SAGEMAKER, "AWS::IAM::Policy").values()
                 if "StopThisNotebookWhenIdle" in json.dumps(p)]
    assert len(policy["Properties"]["PolicyDocument"]["Statement"]) == 1


def test_no_stop_permission_without_idle_stop(no_idle_stop_synth):
    actions = {a for s in notebook_role_statements(no_idle_stop_synth)
               for a in as_list(s["Action"])}
    assert not actions & {"sagemaker:StopNotebookInstance", "sagemaker:DescribeNotebookInstance"}


@pytest.mark.parametrize("synth_fixture, minutes", [
    ("default_synth", 60), ("cost_synth", 45), ("no_idle_stop_synth", 0)])
def test_lifecycle_script_carries_the_configured_idle_minutes(request, synth_fixture, minutes):
    script = lifecycle_script(request.getfixturevalue(synth_fixture))
    assert f"\nexport NOTEBOOK_IDLE_MINUTES={minutes}\n" in script
    source = IDLE_STOP_SCRIPT.read_text()
    assert (source in script) == bool(minutes)


@pytest.mark.parametrize("synth_fixture", ["default_synth", "cost_synth", "variant_synth"])
def test_lifecycle_script_fits_sagemakers_limit(request, synth_fixture):
    """A lifecycle hook's Content is at most 16384 characters of base64 (SageMaker API
    reference, NotebookInstanceLifecycleHook); values of the longest realistic length."""
    synth = request.getfixturevalue(synth_fixture)
    # the stack's name: the longest name_prefix (24 characters, infra/config.py) and the stack's id
    script = lifecycle_script(synth, Region="ap-southeast-4", StackName="p" * 24 + "-SageMakerStack", **{
        lid: "fs-0123456789abcdef0" for lid in synth.templates[SAGEMAKER].get("Parameters", {})},
        **{"Fn::Sub": "s3://cdk-hnb659fds-assets-123456789012-ap-southeast-4/" + "0" * 64 + ".zip"})
    assert "<value>" not in script
    assert len(base64.b64encode(script.encode())) <= 16384


# --- Notebook idle stop: the check against a real Jupyter server ------------------------------

def _self_signed_certificate(directory: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(days=1)).not_valid_after(now + dt.timedelta(days=1))
            .sign(key, hashes.SHA256()))
    cert_file, key_file = directory / "cert.pem", directory / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_file, key_file


# The test's own client, like the check, trusts the server's self-signed certificate.
_UNVERIFIED = ssl.create_default_context()
_UNVERIFIED.check_hostname = False
_UNVERIFIED.verify_mode = ssl.CERT_NONE


def api(url: str, path: str, method: str = "GET", body: dict | None = None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data, method=method)
    with urllib.request.urlopen(request, context=_UNVERIFIED, timeout=30) as response:
        text = response.read()
    return json.loads(text) if text else None


@pytest.fixture(scope="module")
def jupyter_server(tmp_path_factory):
    """A Jupyter server with kernels and terminals on 127.0.0.1 over HTTPS: (URL, runtime dir)."""
    home = tmp_path_factory.mktemp("jupyter")
    cert_file, key_file = _self_signed_certificate(home)
    runtime = home / "runtime"
    env = {**os.environ, "HOME": str(home), "JUPYTER_RUNTIME_DIR": str(runtime),
           "JUPYTER_CONFIG_DIR": str(home / "config"), "JUPYTER_DATA_DIR": str(home / "data"),
           "IPYTHONDIR": str(home / "ipython"), "JUPYTER_PLATFORM_DIRS": "1"}
    port = free_port()
    log = (home / "server.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyter_server", "--allow-root", "--ServerApp.ip=127.0.0.1",
         f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
         "--ServerApp.open_browser=False", f"--ServerApp.root_dir={home}",
         f"--ServerApp.certfile={cert_file}", f"--ServerApp.keyfile={key_file}",
         # No token, as on a notebook instance; no XSRF check for this test's own POSTs.
         "--IdentityProvider.token=", "--ServerApp.disable_check_xsrf=True"],
        env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"https://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            api(url, "/api/status")
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"Jupyter server did not start:\n{(home / 'server.log').read_text()}")
            time.sleep(0.2)
    yield url, runtime
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


@pytest.fixture
def jupyter(jupyter_server):
    """The server's URL; what a test opened there is shut down after it."""
    url, _ = jupyter_server
    yield url
    for session in api(url, "/api/sessions"):
        api(url, f"/api/sessions/{session['id']}", "DELETE")
    for kernel in api(url, "/api/kernels"):
        api(url, f"/api/kernels/{kernel['id']}", "DELETE")
    for terminal in api(url, "/api/terminals"):
        api(url, f"/api/terminals/{terminal['name']}", "DELETE")


def at(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text)


def decision_at(url: str, now: dt.datetime) -> bool:
    stop, _ = idle_stop.idle_decision(idle_stop.jupyter_state(url), now, IDLE)
    return stop


def test_a_server_with_nothing_open_is_idle_45_minutes_after_its_start(jupyter):
    started = at(api(jupyter, "/api/status")["started"])
    assert not decision_at(jupyter, started + IDLE - dt.timedelta(seconds=1))
    assert decision_at(jupyter, started + IDLE)


def _just_before_it_counts(state: dict, latest: str) -> dt.datetime:
    """A moment 45 minutes after `latest` less half the time since the server started: not idle
    counting `latest`, idle without it."""
    started, latest_time = at(state["status"]["started"]), at(latest)
    assert latest_time > started
    return latest_time + IDLE - (latest_time - started) / 2


def test_a_notebook_kernel_counts_from_its_last_activity(jupyter):
    api(jupyter, "/api/sessions", "POST",
        {"path": "work.ipynb", "type": "notebook", "kernel": {"name": "python3"}})
    state = idle_stop.jupyter_state(jupyter)
    (kernel,) = state["kernels"]
    assert [s["kernel"]["id"] for s in state["sessions"]] == [kernel["id"]]
    assert kernel["execution_state"] != "busy"
    moment = _just_before_it_counts(state, kernel["last_activity"])
    assert idle_stop.idle_decision(state, moment, IDLE)[0] is False
    assert idle_stop.idle_decision(state, at(kernel["last_activity"]) + IDLE, IDLE)[0] is True


def test_a_terminal_counts_from_its_last_activity(jupyter):
    api(jupyter, "/api/terminals", "POST")
    state = idle_stop.jupyter_state(jupyter)
    (terminal,) = state["terminals"]
    moment = _just_before_it_counts(state, terminal["last_activity"])
    assert idle_stop.idle_decision(state, moment, IDLE)[0] is False
    assert idle_stop.idle_decision(state, at(terminal["last_activity"]) + IDLE, IDLE)[0] is True


def test_a_busy_kernel_keeps_the_notebook_running_however_old_its_activity(jupyter_server,
                                                                             jupyter):
    from jupyter_client import BlockingKernelClient

    _, runtime = jupyter_server
    kernel = api(jupyter, "/api/kernels", "POST", {"name": "python3"})
    client = BlockingKernelClient(connection_file=str(runtime / f"kernel-{kernel['id']}.json"))
    client.load_connection_file()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=60)
        client.execute("import time; time.sleep(300)")   # a long cell
        deadline = time.monotonic() + 60
        while api(jupyter, f"/api/kernels/{kernel['id']}")["execution_state"] != "busy":
            assert time.monotonic() < deadline, "the kernel never reported busy"
            time.sleep(0.2)
        state = idle_stop.jupyter_state(jupyter)
        a_day_later = at(state["status"]["started"]) + dt.timedelta(days=1)
        stop, reason = idle_stop.idle_decision(state, a_day_later, IDLE)
        assert stop is False and kernel["id"] in reason
    finally:
        api(jupyter, f"/api/kernels/{kernel['id']}/interrupt", "POST")
        client.stop_channels()


# --- Notebook idle stop: the stop ---------------------------------------------------------------

@pytest.fixture
def notebooks(aws_env, tmp_path, monkeypatch):
    """This notebook and another one, InService in moto; this one's SageMaker metadata file.
    The AWS CLI the check calls is the project's (pyproject.toml, the dev extra)."""
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    sagemaker = boto3.client("sagemaker")
    role = "arn:aws:iam::123456789012:role/NotebookRole"
    arns = {name: sagemaker.create_notebook_instance(
                NotebookInstanceName=name, InstanceType="ml.t3.medium",
                RoleArn=role)["NotebookInstanceArn"]
            for name in ("NotebookInstance-Ab12Cd34Ef56", "another-notebook")}
    metadata = tmp_path / "resource-metadata.json"
    metadata.write_text(json.dumps({"ResourceArn": arns["NotebookInstance-Ab12Cd34Ef56"],
                                    "ResourceName": "NotebookInstance-Ab12Cd34Ef56"}))

    def status(name: str) -> str:
        return sagemaker.describe_notebook_instance(
            NotebookInstanceName=name)["NotebookInstanceStatus"]

    return metadata, status


def test_an_idle_notebook_stops_itself_and_nothing_else(jupyter, notebooks):
    metadata, status = notebooks
    started = at(api(jupyter, "/api/status")["started"])
    argv = ["--idle-minutes", "45", "--jupyter-url", jupyter, "--metadata-file", str(metadata)]
    assert idle_stop.main(argv, now=started + dt.timedelta(minutes=44)) == 0
    assert status("NotebookInstance-Ab12Cd34Ef56") == "InService"
    assert idle_stop.main(argv, now=started + IDLE) == 0
    assert status("NotebookInstance-Ab12Cd34Ef56") == "Stopped"
    assert status("another-notebook") == "InService"
    # A later check finds it no longer in service and leaves it alone.
    assert idle_stop.main(argv, now=started + 2 * IDLE) == 0
    assert status("NotebookInstance-Ab12Cd34Ef56") == "Stopped"


def test_no_answer_from_jupyter_is_no_reason_to_stop(notebooks):
    metadata, status = notebooks
    argv = ["--idle-minutes", "45", "--jupyter-url", f"https://127.0.0.1:{free_port()}",
            "--metadata-file", str(metadata)]
    far_future = dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=365)
    assert idle_stop.main(argv, now=far_future) == 1
    assert status("NotebookInstance-Ab12Cd34Ef56") == "InService"


def test_is_written_for_the_python_of_the_notebook_image():
    """AL2023's python3, which runs the check, is 3.9."""
    ast.parse(IDLE_STOP_SCRIPT.read_text(), feature_version=(3, 9))


def test_runs_on_the_python_of_the_notebook_image(jupyter):
    """The check as installed, on a Python 3.9 (in CI this machine must have one), with the real
    clock (a server started minutes ago is not idle)."""
    python39, missing = python_interpreter("3.9")
    require(missing)
    result = subprocess.run(
        [str(python39), str(IDLE_STOP_SCRIPT), "--idle-minutes", "45", "--jupyter-url", jupyter,
         "--metadata-file", os.devnull], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Not idle: last activity ")
