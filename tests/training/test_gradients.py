"""The order of loss scaling, fp16 allreduce and unscaling (training/gradients.py), shown on CPU with
two real Horovod ranks (tests/training/gradient_order_job.py).

A gradient of 1e-8 is below float16's smallest subnormal (2**-24 ~ 6e-8): cast to float16 it is 0.
TensorFlow's dynamic loss scale starts at 2**15, so the scaled gradient is 1e-8 * 32768 ~ 3.3e-4,
which float16 holds to 11 significant bits. Allreduced inside the loss-scaled region the step keeps
the gradient; allreduced after the unscaling (tensorpack's trainer allreduces what the optimizer's
compute_gradients returns, and the loss-scale optimizer returns unscaled gradients) it is lost.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
TINY = 1e-8
INITIAL_LOSS_SCALE = 2 ** 15


@pytest.mark.slow
def test_fp16_allreduce_happens_inside_loss_scaling():
    assert np.float16(TINY) == 0 and np.float16(TINY * INITIAL_LOSS_SCALE) != 0   # the premise, by hand
    horovodrun = Path(sys.executable).parent / "horovodrun"
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    run = subprocess.run([str(horovodrun), "-np", "2", "-H", "localhost:2", "--gloo", sys.executable,
                          str(Path(__file__).with_name("gradient_order_job.py"))],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    ranks = [json.loads(line.split(">:", 1)[-1]) for line in run.stdout.splitlines() if '"rank"' in line]
    assert sorted(r["rank"] for r in ranks) == [0, 1] and all(r["size"] == 2 for r in ranks)
    # by hand: scaled in float32, rounded to float16 for the allreduce (both ranks send the same value,
    # so the average is exact), back to float32, unscaled
    scale = np.float32(INITIAL_LOSS_SCALE)
    through_fp16 = float(np.float32(np.float16(np.float32(TINY) * scale)) / scale)
    assert through_fp16 != float(np.float32(TINY))     # the float16 rounding shows in the result
    for r in ranks:
        assert r["inside"] == through_fp16             # kept: reduced in float16 while scaled
        assert r["inside_var"] == -through_fp16        # SGD with LR 1 applied it
        assert r["after"] == 0                         # lost: reduced in float16 after unscaling


@pytest.mark.parametrize("setting, size, local_size, loss_scaled, expected", [
    ("auto", 8, 8, True, False),     # one node: nothing to save on the network
    ("auto", 16, 8, True, True),     # across nodes, the gradients loss-scaled (AMP on GPU)
    ("auto", 16, 8, False, False),   # across nodes in fp32: unscaled gradients would underflow in fp16
    ("fp16", 1, 1, False, True),     # asked for explicitly: always
    ("fp16", 16, 8, False, True),
    ("none", 16, 8, True, False)])
def test_compression_setting(setting, size, local_size, loss_scaled, expected):
    from training.gradients import fp16_compression
    assert fp16_compression(setting, size=size, local_size=local_size, loss_scaled=loss_scaled) is expected



def test_the_trainer_leaves_the_allreduce_to_the_optimizer():
    from training.gradients import OptimizerAllreduceTrainer
    grads = [("g", "v")]
    assert OptimizerAllreduceTrainer.allreduce(None, grads) is grads
