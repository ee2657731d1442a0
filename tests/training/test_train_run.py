"""Real training runs on a tiny synthetic dataset: a few steps, resume, predict, bad input.

The trainer runs as a subprocess (``python -m training.train``; Horovod with one process), the
way horovodrun starts it. Module-scoped: the first run's log dir feeds resume and predict.
"""
import hashlib
import json
import math
import os
import re
import subprocess
import sys
from collections import namedtuple
from pathlib import Path

import pytest

from cloudwatch_emf import parse_emf_line
from test_cloudwatch_metrics import DEPLOYMENT, _values
from training import cloudwatch_metrics as cwm
from training import metrics
from training.metrics import EVALUATION_METRICS, TRAINING_METRICS, metric_regex
from untrained_run import run_mains   # MODULE.main(argv) per case, in one interpreter

REPO = Path(__file__).resolve().parents[2]
# 4 images an epoch at 2 images a step: 2 steps an epoch (a run of 2 epochs ends at step 4, its
# resume to 3 epochs trains steps 5-6).
STEPS_PER_EPOCH = 2
TINY = [f"TRAIN.IMAGES_PER_EPOCH={2 * STEPS_PER_EPOCH}", "TRAIN.LOG_PERIOD=1", "TRAIN.WARMUP=2",
        "PREPROC.TRAIN_SHORT_EDGE_SIZE=[96, 96]", "PREPROC.TEST_SHORT_EDGE_SIZE=96", "PREPROC.MAX_SIZE=96",
        "RPN.TRAIN_PER_LEVEL_NMS_TOPK=100", "RPN.TEST_PER_LEVEL_NMS_TOPK=100"]


def run_python(*args, timeout=600, env=None):
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1",
               PYTHONPATH=str(REPO), **(env or {}))
    return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)


def run_module(module, *args, timeout=600, env=None):
    return run_python("-m", module, *args, timeout=timeout, env=env)


def train_args(logdir, data, epochs, *extra):
    return ["--logdir", str(logdir), "--preset", "cpu_synthetic", "--config", f"DATA.BASEDIR={str(data)!r}",
            f"TRAIN.LR_EPOCH_SCHEDULE=[(1, 0.5), ({epochs}, None)]", *TINY, *extra]


Trained = namedtuple("Trained", "logdir stdout emf_lines tensorboard")


@pytest.fixture(scope="module")
def trained(tiny_dataset, tmp_path_factory):
    """The first run, of a named deployment: rank 0 also writes CloudWatch records and a TensorBoard
    copy. Its records are read now, before the resume tests train on in the same log dir."""
    root = tmp_path_factory.mktemp("run")
    logdir, tensorboard = root / "run-7", root / "tensorboard"
    proc = run_module("training.train", *train_args(logdir, tiny_dataset, 2),
                      env={cwm.DEPLOYMENT_ENV: DEPLOYMENT, cwm.TENSORBOARD_DIR_ENV: str(tensorboard)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return Trained(logdir, proc.stdout, (logdir / cwm.EMF_FILE).read_text().splitlines(), tensorboard)


@pytest.mark.slow
def test_few_step_training_run_writes_checkpoint_events_metrics(trained):
    logdir, out = trained.logdir, trained.stdout
    last = 2 * STEPS_PER_EPOCH   # 2 epochs
    assert (logdir / "checkpoint").exists() and (logdir / f"model-{last}.index").exists()
    assert list(logdir.glob("events.out.tfevents.*")), "no TensorBoard events"
    assert f"step {last}/{last}" in out and "images/s" in out and "ETA" in out
    for name in TRAINING_METRICS + EVALUATION_METRICS:  # every SageMaker metric, in the form its regex reads
        values = [m.group(1) for line in out.splitlines() if (m := re.fullmatch(metric_regex(name), line))]
        assert values, f"no log line for {name}"
        float(values[-1])
    history = json.loads((logdir / "eval_results.json").read_text())
    assert history[-1]["global_step"] == last and set(EVALUATION_METRICS) <= set(history[-1])
    assert json.loads((logdir / "config.json").read_text())["TRAIN"]["MAX_STEPS"] == last


@pytest.mark.slow
def test_a_training_run_writes_its_records_and_sagemakers_progress_lines(trained):
    """Rank 0's CloudWatch records (training/cloudwatch_metrics.py; the format's checks are in
    test_cloudwatch_metrics.py) and the lines SageMaker's metric definitions read."""
    records = [parse_emf_line(line) for line in trained.emf_lines]
    emitted = {name for r in records for name in _values(r)}
    # Every loss of the model (a mask model: maskrcnn_loss too), the COCO figures, the end.
    assert set(metrics.LOSS_METRICS) <= emitted
    assert set(metrics.EVALUATION_METRICS) <= emitted
    assert _values(records[-1]) == {metrics.RUN_FINISHED: 1, metrics.RUN_ACTIVE: 0, metrics.STEP: 4}
    assert all(r[metrics.RUN_DIMENSION] == "run-7" for r in records)
    # SageMaker's progress metrics read numbers from the real progress lines; a CPU run without
    # nvidia-smi or mixed precision has no GPU or loss-scale figures (tests/training/test_gpu_metrics.py).
    for definition in metrics.PROGRESS_METRIC_DEFINITIONS:
        values = [m.group(1) for line in trained.stdout.splitlines() if (m := re.fullmatch(definition["Regex"], line))]
        if definition["Name"] in (metrics.IMAGES_PER_SECOND, metrics.LEARNING_RATE):
            assert values and all(math.isfinite(float(v)) for v in values), definition["Name"]
        else:
            assert values == [], definition["Name"]
    assert list(trained.tensorboard.glob("events.out.tfevents.*"))
    assert json.loads((trained.logdir / "config.json").read_text())["TRAIN"]["MAX_STEPS"] == 4


@pytest.mark.slow
def test_resume_continues_at_the_saved_step(trained, tiny_dataset):
    logdir = trained.logdir
    proc = run_module("training.train", *train_args(logdir, tiny_dataset, 3, "DATA.VAL=()"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    saved, last = 2 * STEPS_PER_EPOCH, 3 * STEPS_PER_EPOCH
    assert f"at step {saved}" in proc.stdout  # "resuming from .../model-4 at step 4"
    # the data continues too: batch 4 of the rank's sequence, not its first again (test_pipeline.py)
    assert f"the input continues at step {saved}, in pass 1 over the training images" in proc.stderr
    steps = [int(m.group(1)) for m in re.finditer(rf"^step (\d+)/{last} ", proc.stdout, re.M)]
    assert steps and steps[0] == saved + 1 and steps[-1] == last
    assert (logdir / f"model-{last}.index").exists()
    # a finished schedule is not trained again
    again = run_module("training.train", *train_args(logdir, tiny_dataset, 3))
    assert again.returncode == 0 and "nothing to train" in again.stdout


@pytest.mark.slow
def test_resume_with_another_global_batch_continues_by_images_seen(trained, tiny_dataset, tmp_path):
    """model-4 of the 2-image-a-step run (8 images seen) resumed at 1 image a step continues at step 8
    of the same 4-image epochs (the global step is set to it), and config.json records that model-4
    counts steps of 2 images."""
    logdir = trained.logdir
    resumed = tmp_path / "log"
    resumed.mkdir()
    for f in [*logdir.glob("model-4.*"), logdir / "config.json"]:
        (resumed / f.name).write_bytes(f.read_bytes())
    (resumed / "checkpoint").write_text('model_checkpoint_path: "model-4"\nall_model_checkpoint_paths: "model-4"\n')
    proc = run_module("training.train", *train_args(resumed, tiny_dataset, 3, "DATA.VAL=()",
                                                    "TRAIN.BATCH_SIZE_PER_GPU=1"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "1 rank(s) x 2 image(s) (global batch 2)" in proc.stdout and "1 rank(s) x 1 image(s)" in proc.stdout
    assert "its step 4 (8 images) continues as step 8" in proc.stdout
    last = 3 * 4  # 3 epochs of 4 one-image steps
    steps = [int(m.group(1)) for m in re.finditer(rf"^step (\d+)/{last} ", proc.stdout, re.M)]
    assert steps[0] == 9 and steps[-1] == last
    assert (resumed / f"model-{last}.index").exists()
    saved = json.loads((resumed / "config.json").read_text())
    assert saved["TRAIN"]["BATCH_SIZE_PER_GPU"] == 1
    digest = hashlib.sha256((resumed / "model-4.index").read_bytes()).hexdigest()
    assert saved["_resumed_from"] == {"checkpoint": "model-4", "index_sha256": digest, "num_gpus": 1,
                                      "batch_size_per_gpu": 2}


@pytest.mark.slow
def test_load_model_fine_tunes_from_step_zero(trained, tiny_dataset, tmp_path):
    logdir = trained.logdir
    # without a validation split: trains and saves, never evaluates (no predict tower is built)
    proc = run_module("training.train", *train_args(tmp_path / "ft", tiny_dataset, 2,
                                                     f"TRAIN.LOAD_MODEL={str(logdir)!r}", "DATA.VAL=()"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"fine-tuning from {logdir / 'model-'}" in proc.stdout  # the latest checkpoint of that run
    # the same config: every variable restored, no class layer to re-initialise
    assert re.search(r"restored (\d+) of \1 variables; re-initialised 0 class-specific ones", proc.stdout)
    assert "DATA.VAL is empty: this run does not evaluate" in proc.stdout
    assert "mAP(" not in proc.stdout and not (tmp_path / "ft" / "eval_results.json").exists()
    last = 2 * STEPS_PER_EPOCH
    steps = [int(m.group(1)) for m in re.finditer(rf"^step (\d+)/{last} ", proc.stdout, re.M)]
    assert steps[0] == 1 and steps[-1] == last  # a new schedule from step 0, not a resume
    assert (tmp_path / "ft" / f"model-{last}.index").exists()


@pytest.mark.slow
def test_predict_writes_coco_results(trained, tiny_dataset, tmp_path):
    logdir = trained.logdir
    out, out2 = tmp_path / "results.json", tmp_path / "folder.json"
    images = tmp_path / "images"
    images.mkdir()
    for p in sorted((tiny_dataset / "val2017").iterdir())[:2]:
        (images / p.name).write_bytes(p.read_bytes())
    # a split, then a folder of images: both predictions in one interpreter. Four steps of training may
    # score nothing above the default threshold: every detection is kept, so there are results to check.
    keep_all = "TEST.RESULT_SCORE_THRESH=0.0"
    split_run, folder_run, no_ground_truth = run_mains("training.predict", [
        ["--checkpoint", str(logdir), "--split", "val2017", "--output", str(out), "--evaluate",
         "--config", f"DATA.BASEDIR={str(tiny_dataset)!r}", keep_all],
        ["--checkpoint", str(logdir), "--images", str(images), "--output", str(out2), "--config", keep_all],
        ["--checkpoint", str(logdir), "--images", str(images), "--output", str(out2), "--evaluate"]])
    assert split_run["code"] == 0, split_run["stderr"][-3000:]
    for name in EVALUATION_METRICS:   # --evaluate: the lines training prints (and SageMaker reads)
        assert any(re.fullmatch(metric_regex(name), line) for line in split_run["stdout"].splitlines()), name
    assert folder_run["code"] == 0 and no_ground_truth["code"] == 2
    assert "--evaluate needs --split" in no_ground_truth["stderr"]
    results = json.loads(out.read_text())
    assert isinstance(results, list) and results, "no detections to check"
    from pycocotools.coco import COCO
    gt = COCO(str(tiny_dataset / "annotations" / "instances_val2017.json"))
    for r in results:
        assert set(r) >= {"image_id", "category_id", "bbox", "score", "segmentation"}
        assert r["image_id"] in gt.getImgIds() and r["category_id"] in gt.getCatIds()
    gt.loadRes(results)
    assert {r["image_id"] for r in results} == set(gt.getImgIds())   # every image has detections
    assert folder_run["code"] == 0, folder_run["stderr"][-3000:]
    folder_results = json.loads(out2.read_text())
    assert {r["file_name"] for r in folder_results} == {p.name for p in images.iterdir()}


BAD_INPUT = {
    "batch": (["TRAIN.BATCH_SIZE_PER_GPU=0"], "BATCH_SIZE_PER_GPU"),
    "norm": (["BACKBONE.NORM='BatchNorm'"], "FreezeBN, SyncBN, GN, None"),
    "split": (["DATA.TRAIN=('no_such_split',)"], "no_such_split"),
    "weights": (["BACKBONE.WEIGHTS='missing-R50.npz'"], "BACKBONE.WEIGHTS"),
}
@pytest.fixture(scope="module")
def bad_input_runs(tiny_dataset, tmp_path_factory):
    root = tmp_path_factory.mktemp("bad_input")
    argvs = [train_args(root / case / "log", tiny_dataset, 2, *extra) for case, (extra, _) in BAD_INPUT.items()]
    return root, dict(zip(BAD_INPUT, run_mains("training.train", argvs)))


# The enqueue thread is preparing its next batch when training ends (each batch takes a second):
# what the process's threads are once main() has returned, before the interpreter exits.
_SLOW_INPUT = """
import sys, threading, time
from training import train
from training.data import pipeline
batches = pipeline.TrainingBatches.__iter__
def slow(self):
    for batch in batches(self):
        yield batch
        time.sleep(1.0)
pipeline.TrainingBatches.__iter__ = slow
status = train.main(sys.argv[1:])
print("enqueue threads alive:", [t.name for t in threading.enumerate() if t.name.startswith("EnqueueThread")])
sys.exit(status)
"""


@pytest.mark.slow
def test_training_returns_once_its_input_thread_has_ended(tiny_dataset, tmp_path):
    # tensorpack leaves its enqueue thread (a daemon) running after training; a thread that wakes up
    # inside TensorFlow while the interpreter exits aborts the process after a successful run.
    proc = run_python("-c", _SLOW_INPUT, *train_args(tmp_path / "log", tiny_dataset, 2, "DATA.VAL=()"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "enqueue threads alive: []" in proc.stdout, proc.stdout[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("case", BAD_INPUT)
def test_bad_input_stops_before_training(bad_input_runs, case):
    root, runs = bad_input_runs
    assert runs[case]["code"] == 2
    assert BAD_INPUT[case][1] in runs[case]["stderr"]
    assert not (root / case / "log").exists()
