"""The training image as a SageMaker model server (``docker run IMAGE serve``), following SageMaker's
hosting contract: the model in /opt/ml/model, ``GET /ping`` and ``POST /invocations`` on port 8080,
for real-time endpoints and batch transform alike.

    maskrcnn serve [--model-dir /opt/ml/model] [--host 0.0.0.0] [--port 8080]

The model directory holds a SavedModel from ``maskrcnn export``, what a training job leaves
there (a checkpoint and its config.json, launch/sagemaker/entry.py) or a published model file
(tensorpack's .npz with COCO's classes, e.g. COCO-R50FPN-MaskRCNN-Standard.npz; ``--model-dir``
may name the file): the server then exports it first, into a temporary directory. Gunicorn (``gthread`` workers) runs the Flask app;
each worker loads the SavedModel once and answers with TensorFlow alone.

Requests: ``POST /invocations`` with a JPEG or PNG body and Content-Type image/jpeg, image/png or
application/x-image. The answer, application/json::

    {"image_size": [H, W],
     "boxes": [[x1, y1, x2, y2], ...],          # in the image's pixels
     "classes": [category id, ...], "class_names": [...], "scores": [...],
     "masks": [{"size": [H, W], "counts": "..."}, ...]}   # COCO RLE (pycocotools.mask.decode)

Bad requests get a JSON ``{"error": "..."}`` saying what was wrong and the server goes on: 415 for
another content type, 400 for a body that is not a JPEG or PNG image, 413 for a body over
MASKRCNN_MAX_IMAGE_BYTES or an image over MASKRCNN_MAX_IMAGE_PIXELS. ``GET /execution-parameters``
tells batch transform the payload limit and how many requests the server takes at once.

Settings (environment): SAGEMAKER_BIND_TO_PORT (SageMaker sets it for inference pipelines),
SAGEMAKER_MODEL_SERVER_WORKERS and SAGEMAKER_MODEL_SERVER_TIMEOUT (the names of SageMaker's own
inference toolkit), MASKRCNN_SERVE_THREADS, MASKRCNN_MAX_IMAGE_BYTES, MASKRCNN_MAX_IMAGE_PIXELS;
the defaults are in :data:`DEFAULTS`.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

MODEL_DIR = "/opt/ml/model"
# Where the worker processes find the SavedModel (set by main() for gunicorn's workers).
SAVED_MODEL_ENV = "MASKRCNN_SAVED_MODEL"
CONTENT_TYPES = ("image/jpeg", "image/png", "application/x-image")

# name -> (environment variable, default)
DEFAULTS = {
    "port": ("SAGEMAKER_BIND_TO_PORT", 8080),
    "workers": ("SAGEMAKER_MODEL_SERVER_WORKERS", 1),       # each loads the model: one per GPU at most
    "timeout": ("SAGEMAKER_MODEL_SERVER_TIMEOUT", 120),     # seconds a request may take
    "threads": ("MASKRCNN_SERVE_THREADS", 4),               # requests a worker runs at once
    # SageMaker's own limit for a real-time invocation's payload (6 MB); batch transform's MaxPayloadInMB default
    "max_image_bytes": ("MASKRCNN_MAX_IMAGE_BYTES", 6 * 1024 * 1024),
    "max_image_pixels": ("MASKRCNN_MAX_IMAGE_PIXELS", 50_000_000),   # decoded: 150 MB as RGB
}


@dataclasses.dataclass(frozen=True)
class Settings:
    port: int
    workers: int
    timeout: int
    threads: int
    max_image_bytes: int
    max_image_pixels: int

    @classmethod
    def from_env(cls, env=None) -> "Settings":
        env = os.environ if env is None else env
        values = {}
        for name, (var, default) in DEFAULTS.items():
            raw = env.get(var, "")
            try:
                values[name] = int(raw) if raw.strip() else default
            except ValueError:
                raise SystemExit(f"error: {var}={raw!r} must be a whole number (default {default})") from None
            if values[name] < 1:
                raise SystemExit(f"error: {var}={raw!r} must be at least 1 (default {default})")
        return cls(**values)


class RequestError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


# ------------------------------------------------------------------------------ the model
PNG_SIGNATURE, JPEG_SIGNATURE = b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff"


def is_image(data: bytes) -> bool:
    """A JPEG or PNG file by its signature (what the model's decoder takes)."""
    return data.startswith(PNG_SIGNATURE) or data.startswith(JPEG_SIGNATURE)


def image_size(data: bytes) -> tuple[int, int] | None:
    """(height, width) from a PNG or JPEG header without decoding; None when the header does not
    say (the decoder then has the last word)."""
    if data.startswith(PNG_SIGNATURE):
        if len(data) < 24 or data[12:16] != b"IHDR":
            return None
        width, height = struct.unpack(">II", data[16:24])
        return height, width
    if data.startswith(JPEG_SIGNATURE):
        i = 2
        while i + 9 < len(data):   # markers up to the frame header (SOF0..SOF15 less DHT, JPG, DAC)
            if data[i] != 0xFF:
                return None
            marker = data[i + 1]
            if marker == 0xFF:      # fill byte
                i += 1
                continue
            length = int.from_bytes(data[i + 2:i + 4], "big")
            if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
                height, width = struct.unpack(">HH", data[i + 5:i + 9])
                return height, width
            i += 2 + length
        return None
    return None


class Detector:
    """The exported SavedModel (training/export.py) and its class list."""

    def __init__(self, saved_model: str | os.PathLike):
        import tensorflow as tf
        for gpu in tf.config.list_physical_devices("GPU"):   # workers share a GPU: take memory as needed
            tf.config.experimental.set_memory_growth(gpu, True)
        from training.export import CLASSES_FILE, INPUT_NAME, SIGNATURE
        self._tf, self._input = tf, INPUT_NAME
        self._detect = tf.saved_model.load(str(saved_model)).signatures[SIGNATURE]
        self.categories = json.loads(Path(saved_model, CLASSES_FILE).read_text())["categories"]
        # The first call builds and optimizes the graph: here, not in the first request.
        self.detect(tf.io.encode_png(tf.zeros([32, 32, 3], tf.uint8)).numpy())

    def detect(self, data: bytes) -> dict:
        """The signature's outputs as NumPy arrays; RequestError(400) for undecodable bytes."""
        try:
            out = self._detect(**{self._input: self._tf.constant(data)})
        except self._tf.errors.InvalidArgumentError as err:
            first = (err.message or "").strip().splitlines()[0] if err.message else ""
            raise RequestError(400, f"the body could not be decoded as an image ({first}): send a whole JPEG or "
                                    f"PNG file") from None
        return {k: v.numpy() for k, v in out.items()}


def to_json(out: dict) -> dict:
    import numpy as np
    from pycocotools import mask as mask_utils
    masks = out["masks"]
    height, width = int(masks.shape[1]), int(masks.shape[2])
    rles = mask_utils.encode(np.asfortranarray(np.moveaxis(masks, 0, -1))) if len(masks) else []
    return {"image_size": [height, width],
            "boxes": [[round(float(v), 3) for v in box] for box in out["boxes"]],
            "classes": [int(c) for c in out["classes"]],
            "class_names": [n.decode() for n in out["class_names"]],
            "scores": [round(float(s), 5) for s in out["scores"]],
            "masks": [{"size": [int(v) for v in r["size"]], "counts": r["counts"].decode("ascii")} for r in rles]}


# ------------------------------------------------------------------------------ the app
def create_app(detector: Detector, settings: Settings):
    from flask import Flask, Response, request

    app = Flask(__name__)

    def answer(body: dict, status: int = 200) -> Response:
        return Response(json.dumps(body), status=status, mimetype="application/json")

    def discard_body() -> None:
        """Read what the client sends before answering early, so it reads the answer instead of
        finding the connection reset while it still writes (up to a bound: then gunicorn closes)."""
        stream, left = request.stream, 4 * settings.max_image_bytes
        while left > 0 and (chunk := stream.read(min(65536, left))):
            left -= len(chunk)

    def read_body(limit: int) -> bytes:
        """Up to ``limit`` bytes of the body (a read may return less than asked: read until the end)."""
        chunks, total = [], 0
        while total < limit and (chunk := request.stream.read(min(65536, limit - total))):
            chunks.append(chunk)
            total += len(chunk)
        return b"".join(chunks)

    @app.get("/ping")
    def ping():
        return answer({"status": "healthy"})

    @app.get("/execution-parameters")
    def execution_parameters():
        # batch transform asks before it starts sending; the payload limit in whole MB
        return answer({"MaxConcurrentTransforms": settings.workers * settings.threads,
                       "BatchStrategy": "SINGLE_RECORD",
                       "MaxPayloadInMB": max(1, settings.max_image_bytes // (1024 * 1024))})

    @app.post("/invocations")
    def invocations():
        try:
            kind = request.mimetype
            if kind not in CONTENT_TYPES:
                discard_body()
                raise RequestError(415, f"Content-Type {request.content_type or '(none)'} is not accepted: send "
                                        f"a JPEG or PNG image as {', '.join(CONTENT_TYPES)}")
            if request.content_length is not None and request.content_length > settings.max_image_bytes:
                discard_body()
                raise RequestError(413, f"the image is {request.content_length} bytes, over the limit of "
                                        f"{settings.max_image_bytes} (MASKRCNN_MAX_IMAGE_BYTES): send a smaller file")
            data = read_body(settings.max_image_bytes + 1)
            if len(data) > settings.max_image_bytes:   # a body sent without Content-Length
                discard_body()
                raise RequestError(413, f"the image is over the limit of {settings.max_image_bytes} bytes "
                                        f"(MASKRCNN_MAX_IMAGE_BYTES): send a smaller file")
            if not is_image(data):
                raise RequestError(400, f"the body ({len(data)} bytes) is not a JPEG or PNG image: send the "
                                        f"image file's bytes as the request body")
            size = image_size(data)
            if size is not None and size[0] * size[1] > settings.max_image_pixels:
                raise RequestError(413, f"the image is {size[1]}x{size[0]} pixels, over the limit of "
                                        f"{settings.max_image_pixels} (MASKRCNN_MAX_IMAGE_PIXELS): send a "
                                        f"smaller image")
            return answer(to_json(detector.detect(data)))
        except RequestError as err:
            return answer({"error": str(err)}, err.status)

    return app


def wsgi_app():
    """Gunicorn's app factory, called in each worker: the model is loaded there (TensorFlow must not
    be started before gunicorn forks its workers)."""
    return create_app(Detector(os.environ[SAVED_MODEL_ENV]), Settings.from_env())


# ------------------------------------------------------------------------------ the command
def model_source(model_dir: Path) -> Path | None:
    """What to export from ``model_dir`` (None: it is a SavedModel already): the directory of a
    run's checkpoint, or a published model file (tensorpack's .npz: the file itself, or the only
    one in the directory, as a model.tar.gz holding one unpacks)."""
    if model_dir.is_file() and model_dir.suffix == ".npz":
        return model_dir
    if (model_dir / "saved_model.pb").exists():
        return None
    if (model_dir / "checkpoint").exists():
        return model_dir
    model_files = sorted(model_dir.glob("*.npz")) if model_dir.is_dir() else []
    if len(model_files) == 1:
        return model_files[0]
    raise SystemExit(f"error: {model_dir} holds neither a SavedModel (saved_model.pb, from `maskrcnn export`), "
                     f"a checkpoint with its config.json (a training job's model) nor one model file (.npz, "
                     + (f"found {len(model_files)}" if model_files else "such as COCO-R50FPN-MaskRCNN-Standard.npz")
                     + "): point the endpoint's model data at one of them")


def saved_model_dir(model_dir: Path) -> Path:
    """The SavedModel to serve: ``model_dir`` itself, or an export of the checkpoint or model file in it."""
    source = model_source(model_dir)
    if source is None:
        return model_dir
    target = Path(tempfile.mkdtemp(prefix="maskrcnn-export-")) / "model"
    print(f"[serve] exporting {source} to {target}", flush=True)
    # In a process of its own: the export builds a TF1 graph, the server runs TF2 functions.
    subprocess.run([sys.executable, "-m", "training.export", "--checkpoint", str(source), "--output", str(target)],
                   check=True, stdout=sys.stderr)
    return target


def gunicorn_args(settings: Settings, host: str) -> list[str]:
    return ["--bind", f"{host}:{settings.port}", "--workers", str(settings.workers),
            "--worker-class", "gthread", "--threads", str(settings.threads),
            "--timeout", str(settings.timeout), "--graceful-timeout", "30",
            "--access-logfile", "-", "--error-logfile", "-"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="maskrcnn serve", description=__doc__.splitlines()[0])
    p.add_argument("--model-dir", default=os.path.join(os.environ.get("SAGEMAKER_BASE_DIR", "/opt/ml"), "model"),
                   help=f"SavedModel, training job model directory or model file (.npz) (default {MODEL_DIR})")
    p.add_argument("--host", default="0.0.0.0", help="address to listen on (SageMaker: every interface)")
    p.add_argument("--port", type=int, help=f"default ${DEFAULTS['port'][0]} or {DEFAULTS['port'][1]}")
    a = p.parse_args(argv)
    env = dict(os.environ)
    if a.port is not None:
        env[DEFAULTS["port"][0]] = str(a.port)
    settings = Settings.from_env(env)   # a bad setting stops here, before the model is touched
    saved_model = saved_model_dir(Path(a.model_dir))
    env[SAVED_MODEL_ENV] = str(saved_model)
    command = [sys.executable, "-m", "gunicorn", *gunicorn_args(settings, a.host), "launch.sagemaker.serve:wsgi_app()"]
    print(f"[serve] {saved_model} on {a.host}:{settings.port}: {settings.workers} worker(s) x {settings.threads} "
          f"thread(s)", flush=True)
    # exec: gunicorn becomes this process (PID 1 in the container) and gets SageMaker's SIGTERM itself
    os.execve(sys.executable, command, env)
    return 0   # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
