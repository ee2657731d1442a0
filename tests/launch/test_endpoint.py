"""launch.sagemaker.endpoint against a moto server: the CreateModel, CreateEndpointConfig,
CreateEndpoint, CreateTransformJob and Delete* requests as they leave botocore, checked against
the fields AWS documents for them; `list`; what `invoke` refuses before sending (invoking a real
model server: tests/launch/test_serve.py)."""
import datetime
import http.server
import json
import sys

import boto3
import botocore.session
import pytest

from aws_fakes import BUCKET, STACK_OUTPUTS, capture_requests, deploy_stack
from infra import outputs
from launch.aws import LaunchError
from launch.sagemaker import endpoint, launcher
from launch.sagemaker.launcher import JobSpec

IMAGE, ROLE = STACK_OUTPUTS[outputs.TRAINING_IMAGE_URI], STACK_OUTPUTS[outputs.TRAINING_ROLE_ARN]


def _finished_job(session) -> tuple[str, str]:
    """A training job started by the launcher; moto completes it at once with its model at
    <S3OutputPath>/<job>/output/model.tar.gz (SageMaker's layout)."""
    name = launcher.start_job(JobSpec(), session=session)["TrainingJobName"]
    return name, f"s3://{BUCKET}/maskrcnn/output/{name}/output/model.tar.gz"


def test_deploy_a_training_jobs_model_sends_the_three_requests(sagemaker_env):
    session = boto3.session.Session()
    deploy_stack(session)
    job, model_data = _finished_job(session)
    sent = {op: capture_requests(session, op) for op in ("CreateModel", "CreateEndpointConfig", "CreateEndpoint")}
    result = endpoint.deploy(session, training_job=job, instance_type="ml.g4dn.2xlarge", instance_count=2)
    name = result["endpoint"]
    assert name.startswith("maskrcnn-") and result == {"endpoint": name, "endpoint_config": name, "model": name,
                                                       "model_data": model_data}
    (model,), (config,), (created,) = sent["CreateModel"], sent["CreateEndpointConfig"], sent["CreateEndpoint"]
    assert model == {"ModelName": name, "ExecutionRoleArn": ROLE,
                     "PrimaryContainer": {"Image": IMAGE, "ModelDataUrl": model_data}}
    assert config == {"EndpointConfigName": name, "ProductionVariants": [{
        "VariantName": "AllTraffic", "ModelName": name, "InstanceType": "ml.g4dn.2xlarge", "InitialInstanceCount": 2,
        "ContainerStartupHealthCheckTimeoutInSeconds": endpoint.STARTUP_TIMEOUT_SECONDS}]}
    assert created == {"EndpointName": name, "EndpointConfigName": name,
                       "Tags": [{"Key": endpoint.MODEL_TAG, "Value": job}]}
    sm = session.client("sagemaker")
    assert sm.describe_endpoint(EndpointName=name)["EndpointConfigName"] == name
    assert sm.describe_model(ModelName=name)["PrimaryContainer"]["ModelDataUrl"] == model_data


def test_deploy_an_exported_model_from_s3_by_its_uri(sagemaker_env, capsys):
    session = boto3.session.Session()
    deploy_stack(session)
    uri = f"s3://{BUCKET}/models/run1/model.tar.gz"
    # the command line (its own session): what moto recorded
    assert endpoint.main(["deploy", "--model-data", uri, "--name", "shapes-v1"]) == 0
    assert '"endpoint": "shapes-v1"' in capsys.readouterr().out
    sm = session.client("sagemaker")
    model = sm.describe_model(ModelName="shapes-v1")
    assert model["PrimaryContainer"]["ModelDataUrl"] == uri and model["ExecutionRoleArn"] == ROLE
    config = sm.describe_endpoint_config(EndpointConfigName="shapes-v1")
    assert config["ProductionVariants"][0]["InstanceType"] == endpoint.DEFAULT_INSTANCE_TYPE == "ml.g4dn.xlarge"
    assert sm.describe_endpoint(EndpointName="shapes-v1")["EndpointConfigName"] == "shapes-v1"


def test_transform_job_reads_an_s3_prefix_of_images(sagemaker_env):
    session = boto3.session.Session()
    deploy_stack(session)
    job, model_data = _finished_job(session)
    models, jobs = capture_requests(session, "CreateModel"), capture_requests(session, "CreateTransformJob")
    result = endpoint.transform(session, training_job=job, input_uri=f"s3://{BUCKET}/images/",
                                output_uri=f"s3://{BUCKET}/detections/", instance_type="ml.g5.xlarge",
                                instance_count=3)
    name = result["transform_job"]
    assert name.startswith("maskrcnn-transform-") and models[0]["ModelName"] == name
    # images over the real-time limit go this way: the server takes what the job sends
    assert models[0]["PrimaryContainer"] == {"Image": IMAGE, "ModelDataUrl": model_data,
                                             "Environment": {"MASKRCNN_MAX_IMAGE_BYTES": str(25 * 1024 * 1024)}}
    assert jobs == [{
        "TransformJobName": name, "ModelName": name,
        "TransformInput": {"DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": f"s3://{BUCKET}/images/"}},
                           "ContentType": "application/x-image", "SplitType": "None"},
        "TransformOutput": {"S3OutputPath": f"s3://{BUCKET}/detections/", "Accept": "application/json"},
        "TransformResources": {"InstanceType": "ml.g5.xlarge", "InstanceCount": 3},
        "BatchStrategy": "SingleRecord", "MaxPayloadInMB": 25}]
    described = session.client("sagemaker").describe_transform_job(TransformJobName=name)
    assert described["ModelName"] == name


def test_delete_removes_the_endpoint_its_config_and_its_model(sagemaker_env):
    session = boto3.session.Session()
    deploy_stack(session)
    endpoint.deploy(session, model_data=f"s3://{BUCKET}/m/model.tar.gz", name="to-delete")
    endpoint.deploy(session, model_data=f"s3://{BUCKET}/m/model.tar.gz", name="to-keep")
    sent = {op: capture_requests(session, op) for op in ("DeleteEndpoint", "DeleteEndpointConfig", "DeleteModel")}
    assert endpoint.delete(session, "to-delete") == {"endpoint": "to-delete", "endpoint_config": "to-delete",
                                                     "models": ["to-delete"]}
    assert sent == {"DeleteEndpoint": [{"EndpointName": "to-delete"}],
                    "DeleteEndpointConfig": [{"EndpointConfigName": "to-delete"}],
                    "DeleteModel": [{"ModelName": "to-delete"}]}
    sm = session.client("sagemaker")
    assert [e["EndpointName"] for e in sm.list_endpoints()["Endpoints"]] == ["to-keep"]
    assert [c["EndpointConfigName"] for c in sm.list_endpoint_configs()["EndpointConfigs"]] == ["to-keep"]
    assert [m["ModelName"] for m in sm.list_models()["Models"]] == ["to-keep"]


def test_bad_requests_are_refused_before_anything_is_created(sagemaker_env, capsys):
    session = boto3.session.Session()
    deploy_stack(session)
    cases = [
        (["deploy", "--training-job", "no-such-job"], "no training job named 'no-such-job' in us-east-1"),
        (["deploy", "--model-data", "s3://b/model.zip"], "must be the S3 URI of a .tar.gz archive"),
        (["deploy", "--model-data", f"s3://{BUCKET}/m/model.tar.gz", "--instance-type", "g5.xlarge"],
         "instance type 'g5.xlarge' is not a SageMaker type"),
        (["deploy", "--model-data", f"s3://{BUCKET}/m/model.tar.gz", "--stack", "Nope"], "stack 'Nope' does not exist"),
        (["transform", "--model-data", f"s3://{BUCKET}/m/model.tar.gz", "--input", "images/", "--output",
          f"s3://{BUCKET}/out/"], "--input 'images/' must be an S3 prefix"),
        (["delete", "nothing-here"], "no endpoint named 'nothing-here' in us-east-1"),
    ]
    for argv, message in cases:
        assert endpoint.main(argv) == 2, argv
        assert message in capsys.readouterr().err, argv
    sm = session.client("sagemaker")
    assert sm.list_models()["Models"] == [] and sm.list_endpoints()["Endpoints"] == []


def test_a_job_that_did_not_complete_or_has_no_model_is_a_clear_error(moto_in_process):
    session = boto3.session.Session()
    deploy_stack(session)
    job, _ = _finished_job(session)
    fake = moto_in_process.training_jobs[job]
    fake.training_job_status = "InProgress"
    with pytest.raises(LaunchError, match=f"training job {job} is InProgress, not Completed: deploy a job that completed"):
        endpoint.deploy(session, training_job=job)
    fake.training_job_status, fake.model_artifacts = "Completed", {}
    with pytest.raises(LaunchError, match=f"training job {job} completed but has no model"):
        endpoint.transform(session, training_job=job, input_uri="s3://b/in/", output_uri="s3://b/out/")
    assert session.client("sagemaker").list_models()["Models"] == []


def test_a_local_run_or_export_is_packed_uploaded_and_deployed(sagemaker_env, tmp_path):
    """--model-dir: a cluster run's log dir gives its latest checkpoint, the checkpoint file and
    config.json (what the server exports at start), nothing else; an export goes whole."""
    import io
    import tarfile
    session = boto3.session.Session()
    deploy_stack(session)
    s3 = session.client("s3")
    s3.create_bucket(Bucket=BUCKET)
    run = tmp_path / "run"
    run.mkdir()
    for name in ("model-5.index", "model-5.data-00000-of-00001", "model-10.index", "model-10.data-00000-of-00001",
                 "config.json", "events.out.tfevents.1.host", "log.log"):
        (run / name).write_text(name)
    (run / "checkpoint").write_text('model_checkpoint_path: "model-10"\nall_model_checkpoint_paths: "model-5"\n'
                                    'all_model_checkpoint_paths: "model-10"\n')
    sent = capture_requests(session, "CreateModel")
    result = endpoint.deploy(session, model_dir=str(run), name="cluster-run-1")
    uri = f"s3://{BUCKET}/models/cluster-run-1/model.tar.gz"
    assert result["model_data"] == uri and sent[0]["PrimaryContainer"]["ModelDataUrl"] == uri

    def members(key):
        body = s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()
        with tarfile.open(fileobj=io.BytesIO(body)) as tar:
            return sorted(tar.getnames())
    assert members("models/cluster-run-1/model.tar.gz") == [
        "checkpoint", "config.json", "model-10.data-00000-of-00001", "model-10.index"]

    export = tmp_path / "export"
    (export / "variables").mkdir(parents=True)
    for name in ("saved_model.pb", "classes.json", "config.json", "variables/variables.index"):
        (export / name).write_text(name)
    assert endpoint.main(["deploy", "--model-dir", str(export), "--name", "export-1"]) == 0
    assert members("models/export-1/model.tar.gz") == ["classes.json", "config.json", "saved_model.pb",
                                                       "variables/variables.index"]

    published = tmp_path / "weights" / "COCO-R50FPN-MaskRCNN-Standard.npz"
    published.parent.mkdir()
    published.write_bytes(b"weights")
    (published.parent / "ImageNet-R50-AlignPadding.npz").write_bytes(b"backbone")
    assert endpoint.main(["deploy", "--model-dir", str(published), "--name", "published-1"]) == 0
    assert members("models/published-1/model.tar.gz") == ["COCO-R50FPN-MaskRCNN-Standard.npz"]

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(LaunchError, match="holds neither a SavedModel"):
        endpoint.deploy(session, model_dir=str(empty), name="nothing")
    (run / "checkpoint").write_text('model_checkpoint_path: "model-20"\n')
    with pytest.raises(LaunchError, match="names model-20, which is not there"):
        endpoint.deploy(session, model_dir=str(run), name="nothing")
    assert "nothing" not in [m["ModelName"] for m in session.client("sagemaker").list_models()["Models"]]
    assert "Contents" not in s3.list_objects_v2(Bucket=BUCKET, Prefix="models/nothing/")


def test_a_deploy_that_fails_half_way_leaves_nothing_behind(sagemaker_env, capsys):
    """CreateEndpointConfig refused after CreateModel succeeded (moto knows an older list of instance
    types, without ml.g5: a refusal the test can provoke): the model is deleted again, and the error
    is one line naming what failed."""
    session = boto3.session.Session()
    deploy_stack(session)
    sent = capture_requests(session, "CreateModel")
    with pytest.raises(LaunchError, match="creating the endpoint half-way failed .*; the model and configuration"):
        endpoint.deploy(session, model_data=f"s3://{BUCKET}/m/model.tar.gz", name="half-way",
                        instance_type="ml.g5.xlarge")
    assert [m["ModelName"] for m in sent] == ["half-way"]                 # it was created ...
    sm = session.client("sagemaker")
    assert sm.list_models()["Models"] == [] and sm.list_endpoint_configs()["EndpointConfigs"] == []   # ... and deleted
    assert endpoint.main(["deploy", "--model-data", f"s3://{BUCKET}/m/model.tar.gz", "--name", "half-way-2",
                          "--instance-type", "ml.g5.xlarge"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: creating the endpoint half-way-2 failed (") and error.count("\n") == 1


@pytest.mark.parametrize("args", [[], ["--training-job", "j", "--model-data", "s3://b/m/model.tar.gz"]])
@pytest.mark.parametrize("command", [["deploy"], ["transform", "--input", "s3://b/i/", "--output", "s3://b/o/"]])
def test_no_model_or_two_is_a_usage_error_before_credentials(tmp_path, command, args):
    """argparse's exit status 2 and the subcommand's usage line; no credentials are looked for."""
    from test_sagemaker_launcher import _maskrcnn_without_an_account
    result = _maskrcnn_without_an_account("endpoint", *command, *args, home=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"usage: maskrcnn endpoint {command[0]} "), result.stderr
    assert (f"maskrcnn endpoint {command[0]}: error: name the model: --training-job JOB"
            in result.stderr), result.stderr
    assert "credentials" not in result.stderr


# --- `--wait` on a transform job or endpoint that fails --------------------------------------------
# moto's server completes every transform job and puts every endpoint in service at once: the test
# sets the failed state in moto's backend (moto_in_process) right after the Create request, as
# SageMaker would report it later.
def _fail_after(session, operation: str, fail) -> None:
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.sagemaker.models import sagemaker_backends
    session.events.register(f"after-call.sagemaker.{operation}", lambda **kw: fail(
        sagemaker_backends[DEFAULT_ACCOUNT_ID][session.region_name]))


def _fail_transforms(backend):
    for job in backend.transform_jobs.values():
        job.transform_job_status, job.failure_reason = "Failed", "ClientError: the model container exited"


def _fail_endpoints(backend):
    for created in backend.endpoints.values():
        created.endpoint_status, created.failure_reason = "Failed", "the container did not pass the ping check"


def test_wait_on_a_failed_transform_job_or_endpoint_says_how_it_ended_and_exits_1(moto_in_process, capsys,
                                                                                   monkeypatch):
    session = boto3.session.Session()
    monkeypatch.setattr(endpoint, "make_session", lambda region=None: session)
    deploy_stack(session, name="FailingStack")
    uri = f"s3://{BUCKET}/models/run1/model.tar.gz"
    _fail_after(session, "CreateTransformJob", _fail_transforms)
    _fail_after(session, "CreateEndpoint", _fail_endpoints)
    assert endpoint.main(["transform", "--stack", "FailingStack", "--model-data", uri, "--name", "t1",
                          "--instance-type", "ml.g4dn.xlarge",
                          "--input", f"s3://{BUCKET}/images/", "--output", f"s3://{BUCKET}/out/", "--wait"]) == 1
    captured = capsys.readouterr()
    assert '"transform_job": "t1"' in captured.out and "Traceback" not in captured.err
    lines = captured.err.strip().splitlines()
    assert lines[:2] == ["transform job t1: Failed", "failure reason: ClientError: the model container exited"]
    assert lines[2].startswith("estimated cost: ") and "1 x ml.g4dn.xlarge" in lines[2]
    assert endpoint.main(["deploy", "--stack", "FailingStack", "--model-data", uri, "--name", "e1", "--wait"]) == 1
    captured = capsys.readouterr()
    assert '"endpoint": "e1"' in captured.out
    assert captured.err.strip().splitlines() == [
        "endpoint e1: Failed", "failure reason: the container did not pass the ping check",
        "`maskrcnn endpoint delete e1` removes it, its configuration and its model"]


def test_list_shows_the_endpoints_deploy_created(sagemaker_env, capsys):
    session = boto3.session.Session()
    deploy_stack(session)
    job, job_model = _finished_job(session)
    endpoint.deploy(session, training_job=job, name="from-job", instance_type="ml.g4dn.2xlarge", instance_count=2)
    uri = f"s3://{BUCKET}/models/run1/model.tar.gz"
    endpoint.deploy(session, model_data=uri, name="from-s3")
    sm = session.client("sagemaker")
    # an endpoint in the account that this project did not create
    sm.create_model(ModelName="other", ExecutionRoleArn=ROLE, PrimaryContainer={"Image": IMAGE, "ModelDataUrl": uri})
    sm.create_endpoint_config(EndpointConfigName="other", ProductionVariants=[{
        "VariantName": "AllTraffic", "ModelName": "other", "InstanceType": "ml.m5.large", "InitialInstanceCount": 1}])
    sm.create_endpoint(EndpointName="other", EndpointConfigName="other")
    assert endpoint.main(["list"]) == 0
    listed = {e["endpoint"]: e for e in json.loads(capsys.readouterr().out)}
    assert sorted(listed) == ["from-job", "from-s3"]
    for entry in listed.values():
        created = datetime.datetime.fromisoformat(entry.pop("created"))
        assert abs(datetime.datetime.now(datetime.timezone.utc) - created) < datetime.timedelta(minutes=5)
    assert listed["from-job"] == {"endpoint": "from-job", "status": "InService", "instance_type": "ml.g4dn.2xlarge",
                                  "instance_count": 2, "model": job, "model_data": job_model}
    assert listed["from-s3"] == {"endpoint": "from-s3", "status": "InService", "instance_type": "ml.g4dn.xlarge",
                                 "instance_count": 1, "model": uri, "model_data": uri}
    endpoint.delete(session, "from-job")
    assert endpoint.list_endpoints(session)[0]["endpoint"] == "from-s3" and len(endpoint.list_endpoints(session)) == 1


def test_the_realtime_payload_limit_is_the_one_aws_defines():
    """botocore carries AWS's API definition: InvokeEndpoint's Body has a maximum length."""
    model = botocore.session.get_session().get_service_model("sagemaker-runtime")
    body = model.operation_model("InvokeEndpoint").input_shape.members["Body"]
    assert body.metadata["max"] == endpoint.REALTIME_MAX_PAYLOAD_BYTES == 6 * 1024 * 1024


class _Recorder(http.server.BaseHTTPRequestHandler):
    """Stands in for SageMaker Runtime: records what reaches it and answers as SageMaker does for an
    endpoint that does not exist."""
    seen: list = []

    def do_POST(self):
        _Recorder.seen.append(self.path)
        self.rfile.read(int(self.headers["Content-Length"]))
        body = json.dumps({"message": "Endpoint shapes-v1 of account 123456789012 not found."}).encode()
        self.send_response(400)
        self.send_header("x-amzn-ErrorType", "ValidationError:http://internal.amazon.com/coral/com.amazon.sagemaker/")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_invoke_refuses_what_sagemaker_would_before_sending(aws_env, monkeypatch, tmp_path, capsys):
    """Over SageMaker's 6 MiB payload limit, not a JPEG or PNG, no file, --draw without OpenCV:
    each a clear error (exit 2) and no request."""
    from local_http import serving
    big = tmp_path / "big.jpg"
    big.write_bytes(b"\xff\xd8\xff\xe0" + bytes(endpoint.REALTIME_MAX_PAYLOAD_BYTES))    # one JPEG over the limit
    at_limit = tmp_path / "at-limit.png"
    at_limit.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(endpoint.REALTIME_MAX_PAYLOAD_BYTES - 8))
    notes = tmp_path / "notes.txt"
    notes.write_text("not an image\n")
    _Recorder.seen = []
    with serving(_Recorder) as url:
        monkeypatch.setenv("AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME", url)
        cases = [
            ([str(big)], f"big.jpg is {endpoint.REALTIME_MAX_PAYLOAD_BYTES + 4} bytes, over SageMaker's limit of "
                         f"6291456 bytes (6 MiB) for a real-time request: run batch transform on it instead "
                         f"(`maskrcnn endpoint transform --input s3://BUCKET/images/ ...`, up to 25 MB an image)"),
            ([str(notes)], "notes.txt is not a JPEG or PNG file"),
            ([str(tmp_path / "missing.jpg")], "no image file"),
        ]
        for args, message in cases:
            assert endpoint.main(["invoke", "shapes-v1", *args]) == 2, args
            assert message in capsys.readouterr().err, args
        monkeypatch.setitem(sys.modules, "cv2", None)     # a client install: no OpenCV
        assert endpoint.main(["invoke", "shapes-v1", str(at_limit), "--draw", str(tmp_path / "d.jpg")]) == 2
        assert ("--draw needs OpenCV and pycocotools, which this install lacks (no module 'cv2'): "
                "python -m pip install -c constraints.txt -e '.[draw]'") in capsys.readouterr().err
        assert _Recorder.seen == []
        # a file at the limit is sent
        monkeypatch.delitem(sys.modules, "cv2")
        assert endpoint.main(["invoke", "shapes-v1", str(at_limit)]) == 2
        assert _Recorder.seen == ["/endpoints/shapes-v1/invocations"]
        assert "no endpoint named 'shapes-v1' in service in us-east-1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        endpoint.main(["invoke", "shapes-v1", str(at_limit), "--draw", "out.gif"])
    assert "--draw out.gif: name a .jpg or .png file to write" in capsys.readouterr().err


def test_draw_a_box_only_answer_and_refuse_an_answer_for_another_size(tmp_path):
    """An export without masks answers 1x1 placeholder masks: --draw draws the boxes; an answer
    whose image_size is not the file's as OpenCV reads it cannot be drawn on it."""
    import cv2
    import numpy as np
    from pycocotools import mask as mask_utils
    image = tmp_path / "grey.png"
    assert cv2.imwrite(str(image), np.full((40, 60, 3), 128, np.uint8))
    placeholder = mask_utils.encode(np.zeros((1, 1, 1), np.uint8, order="F"))[0]
    answer = {"image_size": [40, 60], "boxes": [[10, 5, 30, 25], [0, 0, 5, 5]], "classes": [1, 2],
              "class_names": ["circle", "square"], "scores": [0.9, 0.1],
              "masks": [{"size": [1, 1], "counts": placeholder["counts"].decode()}] * 2}
    assert endpoint.draw_answer(image, answer, tmp_path / "out" / "drawn.png", 0.5) == 1
    drawn = cv2.imread(str(tmp_path / "out" / "drawn.png"))
    assert (drawn[10:25, 29] != 128).any(axis=1).all() and (drawn[24, 10:30] != 128).any(axis=1).all()   # its outline
    assert (drawn[25:] == 128).all() and (drawn[:5, :5] == 128).all()   # nothing below it; not the 0.1 box
    assert (drawn[18:24, 12:28] == 128).all()     # no mask filled inside it (the label is at its top)
    with pytest.raises(LaunchError, match="answer is for a 40x60 image, .*grey.png reads as 60x40 here"):
        endpoint.draw_answer(image, {**answer, "image_size": [60, 40]}, tmp_path / "no.png", 0.5)
