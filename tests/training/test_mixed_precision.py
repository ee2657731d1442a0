"""TRAIN.MIXED_PRECISION: TensorFlow's real AMP rewrite (CUDA mode) on the default model's training
graph keeps anchors, box coding, proposals, ROI sampling and sampling boxes, mask targets and the
losses in float32, while the convolutions and matmuls do go float16.

The rewrite converts only ops with float16 GPU kernels, which tensorflow-cpu lacks, so
``training.amp_check`` runs under the CUDA build of the same TensorFlow that ``make install`` puts
in ``.venv/tf-gpu-build`` (the training image's TensorFlow is that build; its Dockerfile runs the
same check). TensorFlow's own switches let the rewrite run as for a Volta-or-newer GPU without one.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import coco_narrow
from training.model import scopes

REPO = Path(__file__).resolve().parents[2]
TF_GPU_BUILD = REPO / ".venv" / "tf-gpu-build"

# Moves the ops of coordinate arithmetic (and Exp) onto TensorFlow's float16 allowlist, the kind of
# change to the model or to TensorFlow's lists that the check exists to catch.
FORCE_COORDINATES_FLOAT16 = {
    "TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_ALLOWLIST_ADD": "Exp,Mul,AddV2,Sub,RealDiv",
    "TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_INFERLIST_REMOVE": "Mul,AddV2,Sub,RealDiv",
    "TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_DENYLIST_REMOVE": "Exp",
}


def _amp_check(*args, gpu_build=True, env=None):
    assert not gpu_build or (TF_GPU_BUILD / "tensorflow").is_dir(), \
        f"{TF_GPU_BUILD} is missing: run `make install` (it installs TensorFlow's CUDA build there)"
    path = [str(TF_GPU_BUILD)] if gpu_build else []
    run_env = {**os.environ, "PYTHONPATH": os.pathsep.join(path + [str(REPO)]), **(env or {})}
    return subprocess.run([sys.executable, "-m", "training.amp_check", *args], cwd=REPO, env=run_env,
                          capture_output=True, text=True, timeout=300)


def test_amp_rewrite_keeps_coordinates_and_losses_float32_on_the_default_model(tmp_path):
    proc = _amp_check("--json", str(tmp_path / "report.json"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    # the rewrite did run: every convolution and FC layer of R50-FPN and the heads is float16
    assert report["float16_ops"]["Conv2D"] >= 70 and report["float16_ops"]["MatMul"] >= 4
    assert report["float16_ops"]["Conv2DBackpropFilter"] >= 70
    # ... and every guarded scope exists in the graph and has no float16 node
    assert all(report["scope_nodes"][s] > 0 for s in scopes.FLOAT32), report["scope_nodes"]
    assert report["float16_in_float32_scopes"] == {}


def test_the_check_fails_when_coordinate_arithmetic_goes_float16():
    proc = _amp_check(*["--config", *coco_narrow.OVERRIDES], env=FORCE_COORDINATES_FLOAT16)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "error: float16 nodes under float32 scopes" in proc.stderr
    for scope in (scopes.BOX_DECODE, scopes.ANCHORS, scopes.ROI_BOXES, "rpn_losses"):
        line = next(x for x in proc.stdout.splitlines() if x.split()[:1] == [scope])
        assert " float16: " in line, line


def test_tensorflow_cpu_is_refused_rather_than_passing():
    proc = _amp_check(gpu_build=False)
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "has no GPU kernels (tensorflow-cpu)" in proc.stderr and "make install" in proc.stderr
