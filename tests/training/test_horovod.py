"""A 2-process Horovod run on localhost (horovodrun --gloo), as `make demo` runs it, but tiny."""
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from training.metrics import EVALUATION_METRICS, metric_regex

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_two_process_horovod_training(tmp_path):
    from training.data.synthetic import SyntheticSpec, generate
    data = tmp_path / "data"
    generate(data, SyntheticSpec(train=12, val=4, size=96, max_object_size=48, seed=5))
    horovodrun = Path(sys.executable).parent / "horovodrun"
    horovodrun = str(horovodrun) if horovodrun.exists() else shutil.which("horovodrun")
    logdir = tmp_path / "log"
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1",
               PYTHONPATH=str(REPO))
    cmd = [horovodrun, "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, "-m", "training.train",
           "--logdir", str(logdir), "--preset", "cpu_synthetic", "--config", f"DATA.BASEDIR={str(data)!r}",
           "TRAIN.IMAGES_PER_EPOCH=8", "TRAIN.LR_EPOCH_SCHEDULE=[(1, 0.5), (2, None)]", "TRAIN.LOG_PERIOD=1",
           "TRAIN.WARMUP=2", "BACKBONE.NORM='SyncBN'", "PREPROC.TRAIN_SHORT_EDGE_SIZE=[96, 96]",
           "PREPROC.TEST_SHORT_EDGE_SIZE=96", "PREPROC.MAX_SIZE=96"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "training on 2 rank(s)" in out
    # global batch = 2 ranks x 2 images: 8 images per epoch = 2 steps, 2 epochs = 4 steps
    assert re.search(r"step 4/4 ", out)
    assert (logdir / "model-4.index").exists()
    # rank 0 evaluated the detections gathered from both ranks; metric lines carry horovodrun's prefix
    history = json.loads((logdir / "eval_results.json").read_text())
    assert len(history) == 1 and history[0]["global_step"] == 4
    for name in EVALUATION_METRICS:
        assert any(re.fullmatch(metric_regex(name), line) for line in out.splitlines()), name
