"""Deploy a trained Mask R-CNN as a SageMaker real-time endpoint, run batch transform over images in
S3, and delete an endpoint with what it was made of.

    maskrcnn endpoint deploy (--training-job JOB | --model-data s3://.../model.tar.gz | --model-dir DIR)
                                               [--instance-type ml.g4dn.xlarge] [--instance-count 1] [--wait]
    maskrcnn endpoint transform (--training-job JOB | --model-data S3_URI | --model-dir DIR)
                                               --input s3://bucket/images/ --output s3://bucket/detections/
    maskrcnn endpoint invoke ENDPOINT photo.jpg [--draw drawn.jpg] [--score-threshold 0.5]
    maskrcnn endpoint list
    maskrcnn endpoint delete ENDPOINT

The model is a finished training job's ModelArtifacts (its checkpoint and config.json, which the
server exports when it starts), any model.tar.gz in S3 holding either that or a SavedModel from
``maskrcnn export``, or a local folder (``--model-dir``: a cluster run's log dir or an export),
which is packed and uploaded to ``s3://<the stack's bucket>/models/<name>/model.tar.gz`` first. Both run in the stack's training image (``serve``: launch/sagemaker/serve.py) with
the stack's SageMaker execution role, both read from SageMakerStack's outputs. The model, the
endpoint configuration and the endpoint share one name (``<base>-<UTC time>-<4 hex>``, as run names);
``delete`` finds the configuration and the models from the endpoint. A transform job writes one
``<image name>.out`` JSON file per image (the server's answer) under --output.

``invoke`` sends one JPEG or PNG file to an endpoint (InvokeEndpoint, refused before sending when the
file is over its 6 MiB payload limit) and prints the server's JSON answer; ``--draw`` draws it onto a
copy of the image with training/draw.py, which needs OpenCV and pycocotools (the ``draw`` extra).
``list`` shows the endpoints ``deploy`` created (they carry the tag :data:`MODEL_TAG`).

The transform job is created with the SageMaker Python SDK v3 (sagemaker.core.resources); the
models, endpoint configurations and endpoints with boto3 (why: SDK_FALLBACK's comment).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import boto3

from infra import outputs
from launch import cost, deployment
from launch.aws import LaunchError, make_session, require_output, stack_outputs
from launch.run_names import check_run_name, new_run_name
from launch.sagemaker.serve import DEFAULTS as SERVER_DEFAULTS
from launch.sagemaker.serve import JPEG_SIGNATURE, PNG_SIGNATURE
from training.predict import DRAW_SCORE_THRESHOLD

DEFAULT_INSTANCE_TYPE = "ml.g4dn.xlarge"    # one NVIDIA T4 (16 GB), 4 vCPUs: the smallest GPU inference type
VARIANT_NAME = "AllTraffic"                       # the SageMaker SDK's name for an endpoint's one variant
# The image is large (about 3 GB compressed) and a training job's checkpoint is exported before the
# server answers /ping: more than SageMaker's default wait. (3600 s is its maximum.)
STARTUP_TIMEOUT_SECONDS = 1200
TRANSFORM_CONTENT_TYPE = "application/x-image"    # one image a request, JPEG or PNG alike
TRANSFORM_ACCEPT = "application/json"
# Batch transform takes images over the real-time limit: a transform job's model runs the server with
# MASKRCNN_MAX_IMAGE_BYTES raised to match. AWS (CreateTransformJob): MaxPayloadInMB at most 100, and
# MaxConcurrentTransforms x MaxPayloadInMB at most 100; the server asks for 4 requests at once
# (1 worker x 4 threads, its /execution-parameters), so 25.
TRANSFORM_MAX_PAYLOAD_MB = 25
# InvokeEndpoint's Body: "Length Constraints: Maximum length of 6291456" (the AWS API reference; the
# same bound is in botocore's model of the API). SageMaker refuses a larger request.
REALTIME_MAX_PAYLOAD_BYTES = 6 * 1024 * 1024
MAX_IMAGE_BYTES_ENV = SERVER_DEFAULTS["max_image_bytes"][0]
# What the model server accepts (launch/sagemaker/serve.py CONTENT_TYPES), by the file's signature.
IMAGE_CONTENT_TYPES = ((JPEG_SIGNATURE, "image/jpeg"), (PNG_SIGNATURE, "image/png"))
INVOKE_ACCEPT = "application/json"
# Every endpoint `deploy` creates carries this tag (how `list` tells the project's endpoints from
# others in the account); its value names the model: the training job, or the model data's S3 URI.
MODEL_TAG = "maskrcnn-model"
TAG_VALUE_MAX = 256
DRAW_EXTRA = "draw"           # pyproject.toml's extra with what --draw imports


# Where boto3 sends the request instead of sagemaker.core.resources: Model, EndpointConfig and
# Endpoint .create() describe the new resource at once and validate the description with pydantic,
# which rejects the empty structures (VpcConfig {}, DataCaptureConfig {}) moto's describe calls
# return for fields never set, so they cannot be tested against moto; .get() for delete alike.
# The requests are the same. TransformJob.create passes and is used.
SDK_FALLBACK = "boto3 for the models, endpoint configurations and endpoints"


class NotCompleted(Exception):
    """A ``--wait`` that ended in a failed state: ``result`` is what was created, ``lines`` say how
    it ended (status, failure reason, cost)."""

    def __init__(self, result: dict[str, str], lines: list[str]):
        super().__init__(lines[0])
        self.result, self.lines = result, lines


def _client(session: boto3.session.Session):
    return session.client("sagemaker")


def _not_found(err: Exception) -> bool:
    text = str(err)
    return "ValidationException" in text or "ResourceNotFound" in text or "not found" in text.lower() \
        or "Could not find" in text


def model_data_of_job(session: boto3.session.Session, job_name: str) -> str:
    """The S3 URI of a completed training job's model; a clear error for any other job."""
    # boto3 (see SDK_FALLBACK), as launcher.describe_job; TrainingJob.get also raises on a
    # ModelArtifacts without S3ModelArtifacts, the very case to report here.
    sm = _client(session)
    try:
        job = sm.describe_training_job(TrainingJobName=job_name)
    except sm.exceptions.ClientError as err:
        if _not_found(err):
            raise LaunchError(f"no training job named {job_name!r} in {session.region_name}: list them with "
                              f"`aws sagemaker list-training-jobs`") from None
        raise
    status = job.get("TrainingJobStatus")
    if status != "Completed":
        reason = f" ({job['FailureReason']})" if job.get("FailureReason") else ""
        raise LaunchError(f"training job {job_name} is {status}{reason}, not Completed: deploy a job that "
                          f"completed, or pass --model-data with the S3 URI of a model.tar.gz")
    uri = (job.get("ModelArtifacts") or {}).get("S3ModelArtifacts")
    if not uri or not uri.startswith("s3://"):
        raise LaunchError(f"training job {job_name} completed but has no model (no ModelArtifacts.S3ModelArtifacts): "
                          f"pass --model-data with the S3 URI of a model.tar.gz")
    return uri


MODEL_PREFIX = "models"     # s3://<bucket>/models/<name>/model.tar.gz: a --model-dir, uploaded


def model_files(model_dir: str | Path) -> list[Path]:
    """What a model.tar.gz of ``model_dir`` holds: a SavedModel export whole, or of a run's log dir
    its latest checkpoint with the ``checkpoint`` file and config.json (what the server exports at
    start; not the events, the older checkpoints or the logs), or a published model file (.npz)."""
    model_dir = Path(model_dir)
    if model_dir.is_file() and model_dir.suffix == ".npz":
        return [model_dir]
    if (model_dir / "saved_model.pb").is_file():
        return sorted(p for p in model_dir.rglob("*") if p.is_file())
    index = model_dir / "checkpoint"
    latest = re.search(r'^model_checkpoint_path:\s*"([^"]+)"', index.read_text(), re.M) if index.is_file() else None
    if not latest or not (model_dir / "config.json").is_file():
        raise LaunchError(f"--model-dir {model_dir} holds neither a SavedModel (saved_model.pb: `maskrcnn export`) "
                          f"nor a run's checkpoint with its config.json (a training log dir), and is no model file (.npz)")
    prefix = Path(latest.group(1)).name
    weights = sorted(p for p in model_dir.glob(f"{prefix}.*") if p.is_file())
    if not any(p.name.endswith(".index") for p in weights):
        raise LaunchError(f"--model-dir {model_dir}: its checkpoint file names {prefix}, which is not there")
    return [index, model_dir / "config.json", *weights]


def upload_model(session, model_dir: str | Path, name: str, stack_name: str) -> str:
    """Packs ``model_dir`` (:func:`model_files`) and uploads it to the stack's bucket; its S3 URI."""
    files = model_files(model_dir)
    bucket = require_output(stack_outputs(session, stack_name), outputs.BUCKET_NAME, stack_name)
    key = f"{MODEL_PREFIX}/{name}/model.tar.gz"
    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(tmp) / "model.tar.gz"
        root = Path(model_dir) if Path(model_dir).is_dir() else Path(model_dir).parent   # a model file: its folder
        with tarfile.open(archive, "w:gz") as tar:
            for path in files:      # SageMaker unpacks it into /opt/ml/model
                tar.add(path, arcname=str(path.relative_to(root)))
        session.client("s3").upload_file(str(archive), bucket, key)
    return f"s3://{bucket}/{key}"


NAME_THE_MODEL = ("name the model: --training-job JOB (its ModelArtifacts), --model-data "
                  "s3://.../model.tar.gz or --model-dir DIR (a run's log dir or an export), exactly one")


def _names_one_model(training_job: str | None, model_data: str | None, model_dir: str | None) -> bool:
    return sum(map(bool, (training_job, model_data, model_dir))) == 1


def _model_data(session, training_job: str | None, model_data: str | None, model_dir: str | None = None,
                *, name: str = "", stack_name: str = outputs.SAGEMAKER_STACK) -> str:
    if not _names_one_model(training_job, model_data, model_dir):
        raise LaunchError(NAME_THE_MODEL)
    if model_dir:
        return upload_model(session, model_dir, name, stack_name)   # checks the folder before uploading
    if model_data:
        if not model_data.startswith("s3://") or not model_data.endswith(".tar.gz"):
            raise LaunchError(f"--model-data {model_data!r} must be the S3 URI of a .tar.gz archive "
                              f"(SageMaker unpacks it into /opt/ml/model), e.g. s3://bucket/models/run1/model.tar.gz")
        return model_data
    return model_data_of_job(session, training_job)


def _stack(session, stack_name: str) -> tuple[str, str]:
    """(training image URI, SageMaker execution role ARN) from SageMakerStack's outputs."""
    found = stack_outputs(session, stack_name)
    return (require_output(found, outputs.TRAINING_IMAGE_URI, stack_name),
            require_output(found, outputs.TRAINING_ROLE_ARN, stack_name))


def _name(name: str | None, base: str) -> str:
    return check_run_name(name) if name else new_run_name(base)


def create_model(session, name: str, model_data: str, stack_name: str,
                 environment: dict[str, str] | None = None) -> str:
    """CreateModel: the training image serving ``model_data`` with the stack's execution role."""
    image, role = _stack(session, stack_name)
    container = {"Image": image, "ModelDataUrl": model_data, **({"Environment": environment} if environment else {})}
    # boto3: see SDK_FALLBACK
    _client(session).create_model(ModelName=name, ExecutionRoleArn=role, PrimaryContainer=container)
    return name


def deploy(session: boto3.session.Session, *, training_job: str | None = None, model_data: str | None = None,
           model_dir: str | None = None, name: str | None = None, base_name: str = "maskrcnn", instance_type: str = DEFAULT_INSTANCE_TYPE,
           instance_count: int = 1, stack_name: str = outputs.SAGEMAKER_STACK, wait: bool = False) -> dict[str, str]:
    """CreateModel, CreateEndpointConfig and CreateEndpoint, all named ``name``; every argument is
    checked before the first request."""
    _check_instances(instance_type, instance_count)
    name = _name(name, base_name)
    _stack(session, stack_name)   # its outputs exist, before anything is created
    data = _model_data(session, training_job, model_data, model_dir, name=name, stack_name=stack_name)
    create_model(session, name, data, stack_name)
    sm = _client(session)   # boto3: see SDK_FALLBACK
    with _undone_on_failure(sm, name, "endpoint") as created:
        sm.create_endpoint_config(EndpointConfigName=name, ProductionVariants=[{
            "VariantName": VARIANT_NAME, "ModelName": name, "InstanceType": instance_type,
            "InitialInstanceCount": instance_count,
            "ContainerStartupHealthCheckTimeoutInSeconds": STARTUP_TIMEOUT_SECONDS}])
        created.append("endpoint_config")
        sm.create_endpoint(EndpointName=name, EndpointConfigName=name,
                           Tags=[{"Key": MODEL_TAG, "Value": (training_job or data)[:TAG_VALUE_MAX]}])
    result = {"endpoint": name, "endpoint_config": name, "model": name, "model_data": data}
    if wait:
        import botocore.exceptions
        try:
            sm.get_waiter("endpoint_in_service").wait(EndpointName=name)
        except botocore.exceptions.WaiterError:
            described = sm.describe_endpoint(EndpointName=name)
            if described["EndpointStatus"] == "InService":
                raise
            raise NotCompleted(result, [f"endpoint {name}: {described['EndpointStatus']}",
                                        f"failure reason: {described.get('FailureReason') or 'none given'}",
                                        f"`maskrcnn endpoint delete {name}` removes it, its configuration "
                                        f"and its model"]) from None
    return result


def transform(session: boto3.session.Session, *, input_uri: str, output_uri: str, training_job: str | None = None,
              model_data: str | None = None, model_dir: str | None = None, name: str | None = None, base_name: str = "maskrcnn-transform",
              instance_type: str = DEFAULT_INSTANCE_TYPE, instance_count: int = 1,
              stack_name: str = outputs.SAGEMAKER_STACK, wait: bool = False) -> dict[str, str]:
    """A model and a batch transform job (same name) over every object under ``input_uri``."""
    from sagemaker.core.resources import TransformJob
    from sagemaker.core.shapes import (TransformDataSource, TransformInput, TransformOutput, TransformResources,
                                       TransformS3DataSource)

    _check_instances(instance_type, instance_count)
    for what, uri in (("--input", input_uri), ("--output", output_uri)):
        if not uri.startswith("s3://") or len(uri) <= len("s3://"):
            raise LaunchError(f"{what} {uri!r} must be an S3 prefix, e.g. s3://bucket/images/")
    name = _name(name, base_name)
    _stack(session, stack_name)
    data = _model_data(session, training_job, model_data, model_dir, name=name, stack_name=stack_name)
    create_model(session, name, data, stack_name,
                 environment={MAX_IMAGE_BYTES_ENV: str(TRANSFORM_MAX_PAYLOAD_MB * 1024 * 1024)})
    with _undone_on_failure(_client(session), name, "transform job"):
        job = TransformJob.create(
            transform_job_name=name, model_name=name,
            transform_input=TransformInput(
                data_source=TransformDataSource(s3_data_source=TransformS3DataSource(s3_data_type="S3Prefix",
                                                                                     s3_uri=input_uri)),
                content_type=TRANSFORM_CONTENT_TYPE, split_type="None"),   # each object is one image, one request
            transform_output=TransformOutput(s3_output_path=output_uri, accept=TRANSFORM_ACCEPT),
            transform_resources=TransformResources(instance_type=instance_type, instance_count=instance_count),
            batch_strategy="SingleRecord", max_payload_in_mb=TRANSFORM_MAX_PAYLOAD_MB,
            session=session, region=session.region_name)
    result = {"transform_job": name, "model": name, "model_data": data, "input": input_uri, "output": output_uri}
    if wait:
        from launch.sagemaker.launcher import failed_status
        try:
            job.wait()
        except Exception as err:
            if not failed_status(err):
                raise
            described = _client(session).describe_transform_job(TransformJobName=name)
            start, end = described.get("TransformStartTime"), described.get("TransformEndTime")
            seconds = (end - start).total_seconds() if start and end else 0
            raise NotCompleted(result, [f"transform job {name}: {described['TransformJobStatus']}",
                                        f"failure reason: {described.get('FailureReason') or 'none given'}",
                                        cost.estimate(instance_type, instance_count, seconds).line()]) from None
    return result


def image_content_type(path: str | Path, data: bytes) -> str:
    """The Content-Type of an image file's bytes, or a LaunchError before anything is sent: a JPEG
    or PNG (what the model server decodes) within InvokeEndpoint's payload limit."""
    if len(data) > REALTIME_MAX_PAYLOAD_BYTES:
        raise LaunchError(
            f"{path} is {len(data)} bytes, over SageMaker's limit of {REALTIME_MAX_PAYLOAD_BYTES} bytes (6 MiB) for "
            f"a real-time request: run batch transform on it instead (`maskrcnn endpoint transform --input "
            f"s3://BUCKET/images/ ...`, up to {TRANSFORM_MAX_PAYLOAD_MB} MB an image), or send it smaller (the "
            f"model resizes every image to its PREPROC.TEST_SHORT_EDGE_SIZE anyway)")
    for signature, content_type in IMAGE_CONTENT_TYPES:
        if data.startswith(signature):
            return content_type
    raise LaunchError(f"{path} is not a JPEG or PNG file (by its first bytes): the model takes those two")


def _drawing_modules():
    """What --draw imports (not the client's: OpenCV and pycocotools), or a LaunchError naming the extra."""
    try:
        import cv2
        import numpy as np
        from pycocotools import mask as mask_utils

        from training import draw
    except ImportError as err:
        raise LaunchError(f"--draw needs OpenCV and pycocotools, which this install lacks (no module "
                          f"{err.name!r}): python -m pip install -c constraints.txt -e '.[{DRAW_EXTRA}]'") from None
    return cv2, np, mask_utils, draw


def draw_answer(image_path: str | Path, answer: dict, out_path: str | Path, score_threshold: float) -> int:
    """Writes the image with the answer's detections scoring at least ``score_threshold`` drawn on it
    (training/draw.py, as `maskrcnn predict --draw`); how many were drawn."""
    cv2, np, mask_utils, draw = _drawing_modules()
    image = cv2.imread(str(image_path), cv2.IMREAD_COLOR)    # turned as its EXIF orientation says, as the model does
    if image is None:
        raise LaunchError(f"cannot read {image_path} to draw on")
    if list(image.shape[:2]) != list(answer["image_size"]):
        raise LaunchError(f"the endpoint's answer is for a {answer['image_size'][1]}x{answer['image_size'][0]} image, "
                          f"{image_path} reads as {image.shape[1]}x{image.shape[0]} here: the detections cannot "
                          f"be drawn on it")
    keep = [i for i, score in enumerate(answer["scores"]) if score >= score_threshold]
    # a model without masks answers 1x1 placeholders: boxes only then
    with_masks = keep and all(answer["masks"][i]["size"] == answer["image_size"] for i in keep)
    masks = np.stack([mask_utils.decode(answer["masks"][i]) for i in keep]) if with_masks else None
    drawn = draw.draw_instances(image, np.array([answer["boxes"][i] for i in keep]).reshape(-1, 4), masks,
                                names=[answer["class_names"][i] for i in keep],
                                scores=[answer["scores"][i] for i in keep],
                                colors=[draw.class_color(int(answer["classes"][i])) for i in keep])
    Path(out_path).parent.mkdir(parents=True, exist_ok=True)
    try:
        draw.write_image(out_path, drawn)
    except OSError as err:
        raise LaunchError(str(err)) from None
    return len(keep)


def invoke(session: boto3.session.Session, name: str, image_path: str | Path) -> dict[str, Any]:
    """InvokeEndpoint with one image file; the model server's JSON answer (launch/sagemaker/serve.py)."""
    import botocore.exceptions
    path = Path(image_path)
    if not path.is_file():
        raise LaunchError(f"no image file {path}")
    data = path.read_bytes()
    content_type = image_content_type(path, data)   # before anything is sent
    runtime = session.client("sagemaker-runtime")
    try:
        response = runtime.invoke_endpoint(EndpointName=name, ContentType=content_type, Accept=INVOKE_ACCEPT, Body=data)
    except botocore.exceptions.ClientError as err:
        error = err.response.get("Error", {})
        if error.get("Code") == "ModelError":     # the model server's own 4xx/5xx, passed on
            original = err.response.get("OriginalMessage") or error.get("Message", "")
            with contextlib.suppress(ValueError, TypeError, AttributeError):
                original = json.loads(original)["error"]
            status = err.response.get("OriginalStatusCode", "an error")
            raise LaunchError(f"endpoint {name}'s model server answered {status}: {original}") from None
        if _not_found(err) and "Endpoint" in error.get("Message", ""):
            raise LaunchError(f"no endpoint named {name!r} in service in {session.region_name} "
                              f"({error.get('Message')}): `maskrcnn endpoint list` shows them") from None
        raise
    return json.loads(response["Body"].read())


def list_endpoints(session: boto3.session.Session) -> list[dict[str, Any]]:
    """The endpoints ``deploy`` created (tag :data:`MODEL_TAG`), newest first: status, instances,
    the model they serve, when they were created."""
    sm = _client(session)   # boto3: see SDK_FALLBACK
    found = []
    for page in sm.get_paginator("list_endpoints").paginate(SortBy="CreationTime", SortOrder="Descending"):
        for summary in page["Endpoints"]:
            tags = {t["Key"]: t["Value"] for t in sm.list_tags(ResourceArn=summary["EndpointArn"]).get("Tags", [])}
            if MODEL_TAG not in tags:
                continue
            described = sm.describe_endpoint(EndpointName=summary["EndpointName"])
            config = sm.describe_endpoint_config(EndpointConfigName=described["EndpointConfigName"])
            variants = config["ProductionVariants"]
            variant = variants[0] if variants else {}
            running = (described.get("ProductionVariants") or [{}])[0]
            try:
                model_data = sm.describe_model(ModelName=variant["ModelName"])["PrimaryContainer"].get("ModelDataUrl")
            except (KeyError, sm.exceptions.ClientError):    # a model deleted by hand
                model_data = None
            entry = {"endpoint": summary["EndpointName"], "status": summary["EndpointStatus"],
                     "instance_type": variant.get("InstanceType"), "instance_count": running.get("CurrentInstanceCount", variant.get("InitialInstanceCount")),
                     "model": tags[MODEL_TAG], "model_data": model_data,
                     "created": summary["CreationTime"].isoformat(timespec="seconds")}
            if described.get("FailureReason"):
                entry["failure_reason"] = described["FailureReason"]
            found.append(entry)
    return found


def delete(session: boto3.session.Session, name: str) -> dict[str, Any]:
    """DeleteEndpoint, DeleteEndpointConfig and DeleteModel (the configuration's models)."""
    sm = _client(session)   # boto3: see SDK_FALLBACK
    try:
        config_name = sm.describe_endpoint(EndpointName=name)["EndpointConfigName"]
    except sm.exceptions.ClientError as err:
        if _not_found(err):
            raise LaunchError(f"no endpoint named {name!r} in {session.region_name}: list them with "
                              f"`aws sagemaker list-endpoints`") from None
        raise
    models = [v["ModelName"] for v in sm.describe_endpoint_config(EndpointConfigName=config_name)["ProductionVariants"]]
    sm.delete_endpoint(EndpointName=name)
    sm.delete_endpoint_config(EndpointConfigName=config_name)
    for model in models:
        sm.delete_model(ModelName=model)
    return {"endpoint": name, "endpoint_config": config_name, "models": models}


@contextlib.contextmanager
def _undone_on_failure(sm, name: str, what: str):
    """Deletes the model ``name`` (and the endpoint configuration, once the body appends
    "endpoint_config" to the list it gets) when the body fails: a failed deploy leaves nothing
    behind to pay for or to collide with the next attempt's name. The failure is a LaunchError."""
    created: list[str] = []
    try:
        yield created
    except Exception as err:
        if "endpoint_config" in created:
            sm.delete_endpoint_config(EndpointConfigName=name)
        sm.delete_model(ModelName=name)
        detail = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise LaunchError(f"creating the {what} {name} failed ({detail}); the model and configuration made "
                          f"for it are deleted again") from err


def _check_instances(instance_type: str, instance_count: int) -> None:
    if not instance_type.startswith("ml."):
        raise LaunchError(f"instance type {instance_type!r} is not a SageMaker type; they start with 'ml.', "
                          f"e.g. {DEFAULT_INSTANCE_TYPE}")
    if instance_count < 1:
        raise LaunchError(f"instance count {instance_count} must be at least 1")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="maskrcnn endpoint", description=__doc__.splitlines()[0])
    p.add_argument("--region")
    sub = p.add_subparsers(dest="command", required=True)
    model_commands = {}
    for command, text in (("deploy", "create a real-time endpoint"), ("transform", "start a batch transform job")):
        c = model_commands[command] = sub.add_parser(command, help=text)
        c.add_argument("--stack", help=deployment.stack_help(outputs.SAGEMAKER_STACK))
        c.add_argument("--training-job", help="a completed training job: its model")
        c.add_argument("--model-data", help="S3 URI of a model.tar.gz (a training job's, or an export's)")
        c.add_argument("--model-dir", help="a local run's log dir, `maskrcnn export` folder or model file (a tensorpack "
                                           ".npz with COCO's classes): packed and uploaded to the stack's bucket")
        c.add_argument("--name", help="name of the endpoint (or transform job), its configuration and model "
                                      "(default: <base>-<UTC time>-<4 hex>)")
        c.add_argument("--instance-type", default=DEFAULT_INSTANCE_TYPE)
        c.add_argument("--instance-count", type=int, default=1)
        c.add_argument("--wait", action="store_true", help="wait until the endpoint is in service (the job ends)")
        if command == "transform":
            c.add_argument("--input", required=True, help="S3 prefix of the images (JPEG or PNG)")
            c.add_argument("--output", required=True, help="S3 prefix for the detections (<image>.out, JSON)")
    i = sub.add_parser("invoke", help="detect objects in one image file with an endpoint (JSON out)",
                       description="Sends IMAGE (JPEG or PNG, at most 6 MiB: SageMaker's limit for a real-time "
                                   "request; larger ones: `maskrcnn endpoint transform`) to the endpoint and prints "
                                   "its answer: image_size, boxes (x1, y1, x2, y2 in the image's pixels), classes, "
                                   "class_names, scores, masks (COCO RLE).")
    i.add_argument("endpoint")
    i.add_argument("image", help="a JPEG or PNG file")
    i.add_argument("--draw", metavar="OUT", help="also write the image with the detections drawn on it to OUT "
                                                 f"(.jpg or .png; needs the `{DRAW_EXTRA}` extra: OpenCV, pycocotools)")
    i.add_argument("--score-threshold", type=float, default=DRAW_SCORE_THRESHOLD,
                   help=f"--draw shows detections scoring at least this (default {DRAW_SCORE_THRESHOLD})")
    sub.add_parser("list", help="the endpoints `deploy` created: status, instances, model, created")
    d = sub.add_parser("delete", help="delete an endpoint, its configuration and its model")
    d.add_argument("endpoint")
    a = p.parse_args(argv)
    if a.command == "invoke":   # usage errors, before credentials are looked for
        if not 0.0 <= a.score_threshold <= 1.0:
            i.error(f"--score-threshold must be between 0 and 1, got {a.score_threshold}")
        if a.draw and not a.draw.lower().endswith((".jpg", ".jpeg", ".png")):
            i.error(f"--draw {a.draw}: name a .jpg or .png file to write")
    # A usage error, before credentials are looked for: there is nothing to ask AWS yet.
    if a.command in model_commands and not _names_one_model(a.training_job, a.model_data, a.model_dir):
        model_commands[a.command].error(NAME_THE_MODEL)
    try:
        session = make_session(a.region)
        if a.command in ("deploy", "transform"):
            stack = deployment.stack_name(outputs.SAGEMAKER_STACK, stack=a.stack)
        if a.command == "deploy":
            result = deploy(session, training_job=a.training_job, model_data=a.model_data, model_dir=a.model_dir,
                            name=a.name,
                            instance_type=a.instance_type, instance_count=a.instance_count, stack_name=stack,
                            wait=a.wait)
        elif a.command == "transform":
            result = transform(session, input_uri=a.input, output_uri=a.output, training_job=a.training_job,
                               model_data=a.model_data, model_dir=a.model_dir, name=a.name,
                               instance_type=a.instance_type,
                               instance_count=a.instance_count, stack_name=stack, wait=a.wait)
        elif a.command == "invoke":
            if a.draw:
                _drawing_modules()      # what --draw needs is here, before the request is paid for
            result = invoke(session, a.endpoint, a.image)
            if a.draw:
                drawn = draw_answer(a.image, result, a.draw, a.score_threshold)
                print(f"drew {drawn} of {len(result['scores'])} detections (score {a.score_threshold:g} or more) "
                      f"on {a.draw}", file=sys.stderr)
        elif a.command == "list":
            result = list_endpoints(session)
        else:
            result = delete(session, a.endpoint)
        print(json.dumps(result, indent=2))
        if a.command == "deploy":   # stdout stays JSON for scripts
            print(f"endpoint {result['endpoint']} is billed by the hour until it is deleted: "
                  f"maskrcnn endpoint delete {result['endpoint']}", file=sys.stderr)
    except NotCompleted as ended:
        print(json.dumps(ended.result, indent=2))
        print("\n".join(ended.lines), file=sys.stderr)
        return 1
    except LaunchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
