"""Training at COCO's shapes, batch 4, single-process and under 2-process Horovod, with every
TensorFlow session a rank creates traced: none may map GPUs before the trainer's own session.

On a multi-GPU node tensorpack's HorovodTrainer creates its session with
``visible_device_list = local rank``; any earlier session that creates GPU devices fixes GPU:0 to
physical GPU 0 for the whole process, and local ranks 1..7 then fail ("TensorFlow device (GPU:0)
is being mapped to multiple devices"). No GPU here, so the property is checked on the sessions
themselves: before the trainer's session, every session must be configured with no GPU device
(``device_count={"GPU": 0}``, see training/collectives.py); after it, either that or the
trainer's own pinning. A GPU is needed to see the crash; this catches its cause on any machine.

The 2-process run is also the suite's check of training as `make demo` starts it (horovodrun --gloo,
python -m training.train): SyncBN across the ranks, checkpoints, the evaluation gathered from both
ranks and every metric line readable through horovodrun's prefix.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import coco_narrow
from training.metrics import EVALUATION_METRICS, metric_regex

REPO = Path(__file__).resolve().parents[2]

# The default model's image sizes (800 / 1333), levels (P2-P6), anchors and samplers at batch 4;
# only the widths shrink, so a step takes seconds on a CPU.
COCO_SHAPES_NARROW = coco_narrow.OVERRIDES + [
    "DATA.NUM_WORKERS=2", "DATA.QUEUE_BATCHES=2", "TRAIN.BATCH_SIZE_PER_GPU=4", "TRAIN.LOG_PERIOD=1",
    "TRAIN.EVAL_MAX_IMAGES=2", "TEST.RESULTS_PER_IM=20",
]

TRACE = textwrap.dedent("""
    import atexit, json, os, runpy, sys
    from tensorflow.python.client import session as tf_session

    sessions = []
    original_init = tf_session.Session.__init__

    def traced_init(self, target="", graph=None, config=None):
        sessions.append({
            "gpu_devices": None if config is None else dict(config.device_count).get("GPU"),
            "visible_device_list": "" if config is None else config.gpu_options.visible_device_list,
        })
        original_init(self, target, graph, config)

    tf_session.Session.__init__ = traced_init
    trace_dir, rank = sys.argv[1], os.environ.get("HOROVOD_RANK", "0")
    image_stats = []
    original_isfile = os.path.isfile

    def counted_isfile(path):
        if str(path).endswith(".jpg"):  # written at once: horovodrun may end a rank before atexit
            image_stats.append(path)
            open(os.path.join(trace_dir, f"image-stats-{rank}"), "w").write(str(len(image_stats)))
        return original_isfile(path)

    os.path.isfile = counted_isfile
    trace_file = os.path.join(trace_dir, f"sessions-{rank}.json")
    atexit.register(lambda: open(trace_file, "w").write(json.dumps(
        {"local_rank": os.environ.get("HOROVOD_LOCAL_RANK", "0"), "sessions": sessions})))
    sys.argv = ["training.train"] + sys.argv[2:]
    runpy.run_module("training.train", run_name="__main__")
""")


@pytest.fixture(scope="module")
def coco_data(tmp_path_factory):
    from coco_fixture import CocoFixtureSpec, generate
    out = tmp_path_factory.mktemp("coco_startup")
    generate(out, CocoFixtureSpec(train=8, val=2, seed=6))
    return out


def _run(tmp_path, data, processes: int, extra: list[str], returncode: int = 0):
    (tmp_path / "trace.py").write_text(TRACE)
    trace_dir = tmp_path / "trace"
    trace_dir.mkdir()
    cmd = [sys.executable, str(tmp_path / "trace.py"), str(trace_dir), "--logdir", str(tmp_path / "log"),
           "--config", f"DATA.BASEDIR={str(data)!r}", *COCO_SHAPES_NARROW, *extra]
    if processes > 1:
        horovodrun = shutil.which("horovodrun", path=os.path.dirname(sys.executable))
        assert horovodrun, "horovodrun is missing next to the interpreter: run `make install`"
        cmd = [horovodrun, "-np", str(processes), "-H", f"localhost:{processes}", "--gloo"] + cmd
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1",
               PYTHONPATH=str(REPO))
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert (proc.returncode != 0) == bool(returncode), out[-5000:]
    if returncode:
        return out, {p.name[-1]: int(p.read_text()) for p in trace_dir.glob("image-stats-*")}
    traces = [json.loads(p.read_text()) for p in sorted(trace_dir.glob("sessions-*.json"))]
    assert len(traces) == processes, out[-3000:]
    return out, traces


def _assert_no_gpu_mapping_before_the_trainer(trace):
    sessions, pinned = trace["sessions"], trace["local_rank"]
    trainer = [i for i, s in enumerate(sessions) if s["visible_device_list"] == pinned and s["gpu_devices"] != 0]
    assert trainer, f"no session pinned to local rank {pinned}: {sessions}"
    for i, s in enumerate(sessions):
        if i < trainer[0]:
            assert s["gpu_devices"] == 0, f"session {i} may map GPUs before the trainer's: {sessions}"
        else:
            assert s["gpu_devices"] == 0 or s["visible_device_list"] == pinned, f"session {i}: {sessions}"


@pytest.mark.slow
def test_two_horovod_processes_at_coco_shapes_map_no_gpu_before_the_trainer(tmp_path, coco_data):
    # 8 images an epoch at 2 ranks x 4 = 1 step an epoch, 2 epochs; fp16 gradient allreduce on.
    # Also the suite's 2-process run as `make demo` starts it (horovodrun --gloo, training.train), so
    # with SyncBN: batch statistics allreduced across the ranks.
    out, traces = _run(tmp_path, coco_data, 2, ["TRAIN.IMAGES_PER_EPOCH=8", "TRAIN.LR_EPOCH_SCHEDULE=[(2, None)]",
                                                "TRAIN.GRADIENT_COMPRESSION='fp16'", "BACKBONE.NORM='SyncBN'"])
    assert "training on 2 rank(s), 4 image(s) per rank" in out and "step 2/2 " in out
    assert (tmp_path / "log" / "model-2.index").exists()
    # rank 0 evaluated the detections gathered from both ranks after each epoch; every metric line, with
    # horovodrun's prefix, is still what its regex (SageMaker's metric definition) reads
    history = json.loads((tmp_path / "log" / "eval_results.json").read_text())
    assert [h["global_step"] for h in history] == [1, 2]
    for name in EVALUATION_METRICS:
        assert any(re.fullmatch(metric_regex(name), line) for line in out.splitlines()), name
    for trace in traces:
        _assert_no_gpu_mapping_before_the_trainer(trace)
        assert len(trace["sessions"]) >= 3  # startup verdict, resume state, trainer (+ gathers)


@pytest.mark.slow
def test_one_process_at_coco_shapes_trains_and_maps_no_gpu_before_the_trainer(tmp_path, coco_data):
    # no evaluation (DATA.VAL=()): the 2-process run and test_full_model.py evaluate at these shapes
    out, traces = _run(tmp_path, coco_data, 1, ["TRAIN.IMAGES_PER_EPOCH=8", "TRAIN.LR_EPOCH_SCHEDULE=[(1, None)]",
                                                "DATA.VAL=()"])
    assert "step 2/2 " in out and (tmp_path / "log" / "model-2.index").exists()
    _assert_no_gpu_mapping_before_the_trainer(traces[0])


@pytest.mark.slow
def test_rank_zero_alone_checks_the_image_files_and_every_rank_stops(tmp_path, coco_data):
    data = tmp_path / "data"
    shutil.copytree(coco_data, data)
    missing = sorted((data / "train2017").iterdir())[3]
    missing.unlink()
    out, stats = _run(tmp_path, data, 2, [], returncode=2)
    assert f"missing from {data / 'train2017'}: {missing.name}" in out
    assert out.count("image(s) listed in") == 1  # rank 0's verdict, printed once
    # rank 0 stats every image (from 32 threads, so the last count written may lag a little); rank 1
    # only the first image of each split
    assert stats["0"] >= 5 and stats["1"] <= 2
    assert not (tmp_path / "log").exists()
