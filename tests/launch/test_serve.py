"""The model server for real: gunicorn started the way the image starts it (`maskrcnn-entrypoint
serve`), on 127.0.0.1 and a free port, with an exported model; requests over HTTP with `requests`."""
import concurrent.futures
import http.server
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
import requests
from pycocotools import mask as mask_utils

from aws_fakes import free_port
from saved_models import REPO, python_env, run_python

ENTRYPOINT = REPO / "docker" / "entrypoint.sh"
MAX_BYTES, MAX_PIXELS = 100_000, 1_000_000     # small limits, so that the tests' oversized images are small

# The SavedModel's own answer, from TensorFlow alone in a process of its own.
DIRECT = """
import json, sys
import tensorflow as tf
detect = tf.saved_model.load(sys.argv[1]).signatures["serving_default"]
out = {}
for path in sys.argv[2:]:
    with open(path, "rb") as f:
        result = {k: v.numpy() for k, v in detect(image_bytes=tf.constant(f.read())).items()}
    out[path] = {"boxes": result["boxes"].tolist(), "classes": result["classes"].tolist(),
                 "class_names": [n.decode() for n in result["class_names"]],
                 "scores": result["scores"].tolist(), "masks": result["masks"].tolist()}
print(json.dumps(out))
"""


def start_server(model_dir: Path, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**python_env(), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "MASKRCNN_MAX_IMAGE_BYTES": str(MAX_BYTES), "MASKRCNN_MAX_IMAGE_PIXELS": str(MAX_PIXELS),
           "SAGEMAKER_MODEL_SERVER_WORKERS": "1", "MASKRCNN_SERVE_THREADS": "4"}
    with open(log, "w") as out:
        proc = subprocess.Popen(["bash", str(ENTRYPOINT), "serve", "--model-dir", str(model_dir), "--host", "127.0.0.1",
                                 "--port", str(port)], env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 240
    while True:
        try:
            if requests.get(url + "/ping", timeout=2).status_code == 200:
                return proc, url
        except (requests.ConnectionError, requests.Timeout):   # not listening yet, or the worker is loading
            pass
        if proc.poll() is not None or time.time() > deadline:
            stop_server(proc)
            pytest.fail(f"the server did not answer /ping:\n{log.read_text()[-3000:]}")
        time.sleep(0.5)


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()   # gunicorn's master (the entrypoint execs it): stops its workers gracefully
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def exported(untrained_model):
    return untrained_model


@pytest.fixture(scope="module")
def images(exported, tmp_path_factory):
    """Two synthetic PNGs and a JPEG of another size, with the SavedModel's direct answers."""
    folder = tmp_path_factory.mktemp("images")
    pngs = sorted((exported.data / "val2017").iterdir())[:2]
    paths = [folder / p.name for p in pngs]
    for src, dst in zip(pngs, paths):
        dst.write_bytes(src.read_bytes())
    paths.append(folder / "photo.jpg")
    assert cv2.imwrite(str(paths[-1]), cv2.resize(cv2.imread(str(pngs[0])), (90, 70)), [cv2.IMWRITE_JPEG_QUALITY, 90])
    direct = run_python("-c", DIRECT, str(exported.model), *map(str, paths))
    assert direct.returncode == 0, direct.stderr[-3000:]
    expected = json.loads(direct.stdout.splitlines()[-1])
    return [(path, expected[str(path)]) for path in paths]


@pytest.fixture(scope="module")
def server(exported, tmp_path_factory):
    proc, url = start_server(exported.model, tmp_path_factory.mktemp("log") / "server.log")
    yield url
    stop_server(proc)


def post(url, path: Path, content_type="image/png", **kwargs):
    return requests.post(url + "/invocations", data=path.read_bytes(), headers={"Content-Type": content_type},
                         timeout=120, **kwargs)


def assert_same_detections(answer: dict, expected: dict) -> None:
    """The server's JSON equals the SavedModel's outputs (the server rounds boxes to 3 and scores to 5
    decimals; masks are COCO RLE)."""
    assert answer["classes"] == expected["classes"] and answer["class_names"] == expected["class_names"]
    assert len(answer["boxes"]) == len(expected["boxes"]) > 0
    np.testing.assert_allclose(answer["boxes"], expected["boxes"], atol=5e-4)
    np.testing.assert_allclose(answer["scores"], expected["scores"], atol=5e-6)
    masks = np.array(expected["masks"], np.uint8)
    assert answer["image_size"] == list(masks.shape[1:])
    decoded = np.stack([mask_utils.decode(m) for m in answer["masks"]])
    np.testing.assert_array_equal(decoded, masks)


@pytest.mark.slow   # the module's server: an export and gunicorn loading TensorFlow
def test_ping_and_batch_transform_parameters(server):
    assert requests.get(server + "/ping", timeout=10).status_code == 200
    params = requests.get(server + "/execution-parameters", timeout=10).json()
    # SageMaker's documented fields; 1 worker x 4 threads; 100,000 bytes rounds down to under 1 MB
    assert params == {"MaxConcurrentTransforms": 4, "BatchStrategy": "SINGLE_RECORD", "MaxPayloadInMB": 1}


@pytest.mark.slow   # the module's server: an export and gunicorn loading TensorFlow
def test_invocations_answer_the_saved_models_detections(server, images):
    for path, expected in images:
        for content_type in ("image/png", "image/jpeg", "application/x-image"):   # the file decides the decoder
            response = post(server, path, content_type)
            assert response.status_code == 200, response.text
            assert response.headers["Content-Type"] == "application/json"
            assert_same_detections(response.json(), expected)


def _big_png(tmp_path) -> Path:
    """A PNG over MAX_PIXELS that compresses to a few KB (a decompression bomb, small)."""
    path = tmp_path / "big.png"
    assert cv2.imwrite(str(path), np.zeros((1100, 1000, 3), np.uint8))
    assert path.stat().st_size < MAX_BYTES
    return path


@pytest.mark.slow   # the module's server: an export and gunicorn loading TensorFlow
def test_bad_requests_get_a_clear_4xx_and_the_server_keeps_serving(server, images, tmp_path):
    good, expected = images[0]
    oversized = tmp_path / "oversized.jpg"
    oversized.write_bytes(good.read_bytes()[:4] + os.urandom(MAX_BYTES))   # JPEG-looking, one limit too many
    truncated = tmp_path / "truncated.png"
    truncated.write_bytes(good.read_bytes()[:200])
    not_image = tmp_path / "notes.txt"
    not_image.write_text("these are not the pixels you are looking for\n")
    cases = [
        (good, "text/plain", 415, "Content-Type text/plain is not accepted"),
        (good, "application/json", 415, "send a JPEG or PNG image as image/jpeg, image/png, application/x-image"),
        (not_image, "image/jpeg", 400, "is not a JPEG or PNG image"),
        (truncated, "image/png", 400, "could not be decoded as an image"),
        (oversized, "image/jpeg", 413, f"over the limit of {MAX_BYTES} (MASKRCNN_MAX_IMAGE_BYTES)"),
        (_big_png(tmp_path), "image/png", 413, "1000x1100 pixels, over the limit of 1000000"),
    ]
    for path, content_type, status, message in cases:
        response = post(server, path, content_type)
        assert response.status_code == status, (path.name, content_type, response.text)
        assert response.headers["Content-Type"] == "application/json"
        assert message in response.json()["error"], response.json()
        after = post(server, good)
        assert after.status_code == 200, (path.name, after.text)
        assert_same_detections(after.json(), expected)
    # no Content-Type at all
    response = requests.post(server + "/invocations", data=good.read_bytes(), timeout=60)
    assert response.status_code == 415 and "Content-Type (none) is not accepted" in response.json()["error"]


@pytest.mark.slow   # the module's server: an export and gunicorn loading TensorFlow
def test_eight_concurrent_requests_are_all_answered(server, images):
    work = [images[i % len(images)] for i in range(8)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        responses = list(pool.map(lambda item: post(server, item[0], "application/x-image"), work))
    for (path, expected), response in zip(work, responses):
        assert response.status_code == 200, response.text
        assert_same_detections(response.json(), expected)


@pytest.mark.slow
def test_a_training_jobs_model_directory_is_exported_and_served(exported, images, tmp_path):
    """What a training job leaves in /opt/ml/model (a checkpoint and config.json, which SageMaker
    unpacks there for the endpoint): the server exports it at start and answers like the export."""
    assert not (exported.run / "saved_model.pb").exists()
    proc, url = start_server(exported.run, tmp_path / "server.log")
    try:
        path, expected = images[2]
        response = post(url, path, "image/jpeg")
        assert response.status_code == 200, response.text
        assert_same_detections(response.json(), expected)
    finally:
        stop_server(proc)
    assert f"exporting {exported.run} to" in (tmp_path / "server.log").read_text()


def test_bad_settings_and_an_empty_model_directory_are_refused_before_starting(tmp_path, monkeypatch, capsys):
    from launch.sagemaker import serve
    monkeypatch.setenv("SAGEMAKER_MODEL_SERVER_WORKERS", "two")
    with pytest.raises(SystemExit, match=r"SAGEMAKER_MODEL_SERVER_WORKERS='two' must be a whole number \(default 1\)"):
        serve.main(["--model-dir", str(tmp_path)])
    monkeypatch.setenv("SAGEMAKER_MODEL_SERVER_WORKERS", "1")
    monkeypatch.setenv("MASKRCNN_MAX_IMAGE_BYTES", "0")
    with pytest.raises(SystemExit, match="MASKRCNN_MAX_IMAGE_BYTES='0' must be at least 1"):
        serve.main(["--model-dir", str(tmp_path)])
    monkeypatch.delenv("MASKRCNN_MAX_IMAGE_BYTES")
    with pytest.raises(SystemExit, match=f"{tmp_path} holds neither a SavedModel .*, a checkpoint .* nor one model "
                                         r"file \(.npz, such as COCO-R50FPN-MaskRCNN-Standard.npz\)"):
        serve.main(["--model-dir", str(tmp_path)])
    # SageMaker's defaults: port 8080, the model in <base dir>/model (/opt/ml/model)
    assert serve.Settings.from_env({}).port == 8080
    monkeypatch.setenv("SAGEMAKER_BASE_DIR", str(tmp_path / "ml"))
    with pytest.raises(SystemExit, match=f"{tmp_path}/ml/model holds neither"):
        serve.main([])


class SageMakerFrontEnd(http.server.BaseHTTPRequestHandler):
    """Stands in for SageMaker Runtime in front of the container: InvokeEndpoint's
    POST /endpoints/NAME/invocations goes to the model server's POST /invocations with its body,
    Content-Type and Accept; a 4xx/5xx of the model server comes back as SageMaker's ModelError
    (HTTP 424, with OriginalStatusCode and OriginalMessage: the API's ModelError shape)."""
    model_server = ""
    seen: list = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        SageMakerFrontEnd.seen.append((self.path, self.headers["Content-Type"], self.headers.get("Accept")))
        answer = requests.post(self.model_server + "/invocations", data=body, timeout=120,
                               headers={"Content-Type": self.headers["Content-Type"], "Accept": self.headers["Accept"]})
        if answer.ok:
            status, content_type, payload = 200, answer.headers["Content-Type"], answer.content
            error_type = None
        else:
            status, content_type, error_type = 424, "application/json", "ModelError"
            payload = json.dumps({"ErrorCode": "CLIENT_ERROR_FROM_MODEL", "OriginalStatusCode": answer.status_code,
                                  "OriginalMessage": answer.text,
                                  "Message": f"Received client error ({answer.status_code}) from primary"}).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        if error_type:
            self.send_header("x-amzn-ErrorType", f"{error_type}:http://internal.amazon.com/coral/com.amazon.sagemaker/")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


def _turned_jpeg(path: Path, out: Path) -> Path:
    """``path``'s image as a phone stores a portrait photo: pixels turned, EXIF Orientation 6."""
    from PIL import Image
    exif = Image.Exif()
    exif[0x0112] = 6
    upright = cv2.imread(str(path))[:, :, ::-1]
    data = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(np.rot90(upright, 1))).save(data, "JPEG", exif=exif, quality=95)
    out.write_bytes(data.getvalue())
    return out


@pytest.mark.slow   # the module's server: an export and gunicorn loading TensorFlow
def test_endpoint_invoke_sends_the_image_and_draws_the_answer(server, images, tmp_path, monkeypatch, capsys):
    """`maskrcnn endpoint invoke` through a SageMaker Runtime stand-in to the real model server: the
    answer is the model's; a phone photo is answered and drawn upright; the server's 400 is said."""
    from launch.sagemaker import endpoint
    from local_http import serving
    from training.draw import class_color, draw_instances

    for var, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                       ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(var, value)
    SageMakerFrontEnd.model_server, SageMakerFrontEnd.seen = server, []
    with serving(SageMakerFrontEnd) as url:
        monkeypatch.setenv("AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME", url)
        photo, expected = images[2]
        assert endpoint.main(["invoke", "shapes-v1", str(photo)]) == 0
        assert_same_detections(json.loads(capsys.readouterr().out), expected)
        assert SageMakerFrontEnd.seen == [("/endpoints/shapes-v1/invocations", "image/jpeg", "application/json")]

        turned = _turned_jpeg(photo, tmp_path / "portrait.jpg")
        height, width = cv2.imread(str(photo)).shape[:2]
        drawn = tmp_path / "drawn" / "portrait.png"
        assert endpoint.main(["invoke", "shapes-v1", str(turned), "--draw", str(drawn),
                              "--score-threshold", "0.2"]) == 0
        captured = capsys.readouterr()
        answer = json.loads(captured.out)
        assert answer["image_size"] == [height, width]    # upright, as the phone showed it
        keep = [i for i, s in enumerate(answer["scores"]) if s >= 0.2]
        assert 0 < len(keep) and f"drew {len(keep)} of {len(answer['scores'])} detections" in captured.err
        image = cv2.imread(str(turned))
        expected_drawing = draw_instances(
            image, np.array([answer["boxes"][i] for i in keep]),
            np.stack([mask_utils.decode(answer["masks"][i]) for i in keep]),
            names=[answer["class_names"][i] for i in keep], scores=[answer["scores"][i] for i in keep],
            colors=[class_color(answer["classes"][i]) for i in keep])
        np.testing.assert_array_equal(cv2.imread(str(drawn)), expected_drawing)
        assert (expected_drawing != image).any()

        truncated = tmp_path / "truncated.png"
        truncated.write_bytes(images[0][0].read_bytes()[:200])
        assert endpoint.main(["invoke", "shapes-v1", str(truncated)]) == 2
        assert ("endpoint shapes-v1's model server answered 400: the body could not be decoded as an image"
                in capsys.readouterr().err)


def test_a_model_file_is_what_the_server_exports(tmp_path):
    """A published model file: named itself, or the one .npz of the model directory (a
    model.tar.gz holding it unpacks so); two are ambiguous."""
    from launch.sagemaker.serve import model_source
    model = tmp_path / "COCO-R50FPN-MaskRCNN-Standard.npz"
    model.write_bytes(b"weights")
    assert model_source(model) == model
    assert model_source(tmp_path) == model
    (tmp_path / "other.npz").write_bytes(b"weights")
    with pytest.raises(SystemExit, match=r"nor one model file \(.npz, found 2\)"):
        model_source(tmp_path)
    (tmp_path / "saved_model.pb").write_bytes(b"graph")
    assert model_source(tmp_path) is None
