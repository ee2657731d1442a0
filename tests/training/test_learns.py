"""The learning gate: a small seeded Mask R-CNN trained for about 2 minutes must reach a stated AP50.

Every other training test checks that the trainer runs (finite losses, metrics in range); this one
checks that it learns. It runs the README's demo job as a user would, ``python -m training.local_job``
(what ``make demo`` runs after ``cdk synth``, which tests/infra/test_infra_cli.py runs), with the gate's
options (tests/training/learning_gate.py: one process, its dataset and settings; on the CPU with
deterministic kernels on any host, learning_gate.environment). It trains 1200 steps on a synthetic
shapes dataset the test writes, evaluates the 100 validation images with COCOeval, and both bbox and
segm mAP@0.5 in the run's eval_results.json must reach BAR_AP50; the segm AP50 must also beat the same
detections with filled boxes as masks by BAR_MASK_MARGIN; the job exits 0 (its own accuracy target).

The bar and its margins (docs/training.md, "The learning gate"): five seeds (TRAIN.SEED and the
dataset seed together; this test's is 42 / 0) reached bbox / segm AP50 0.724-0.755 / 0.675-0.721
(this test's, five runs), 0.639 / 0.608, 0.707 / 0.664, 0.694 / 0.678, 0.672 / 0.637; an untrained
model (LR ~0) 0.003 / 0.000; the model with its Fast R-CNN box regression targets negated
0.232 / 0.301. With TF_DETERMINISTIC_OPS=1 runs on otherwise idle cores repeat bit for bit; on
busy cores the order of the in-place weight updates varies and a run drifts as far as another
seed would, which the margin below the worst seed covers.

Also here, fast: training.local_job's exit status follows its accuracy target.
"""
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# 0.11 below the worst seed's worst figure (segm 0.608), 0.20 above the broken model's best (segm
# 0.301 with negated box targets).
BAR_AP50 = 0.5
# The segm bar alone does not tell a mask head from one that fills each box: the gate run's detections
# with filled boxes as masks score segm AP50 0.482 (circle 0.319, square 0.221, triangle 0.014 at
# IoU 0.5:0.95), right at BAR_AP50. So the run's segm AP50 must also beat that re-scoring
# (mask_head_margin) by BAR_MASK_MARGIN. Measured on the gate run (TRAIN.SEED=42, dataset seed 0,
# bbox / segm AP50 0.755 / 0.721): margin 0.721 - 0.482 = 0.239. The bar is half of it, 0.12: the
# other 0.12 covers the seeds' spread (segm AP50 0.608-0.721, 0.11 apart); a filled-box head has
# margin 0 by construction.
BAR_MASK_MARGIN = 0.12


def _gate_run(tmp_path):
    import learning_gate
    from training.data.synthetic import SyntheticSpec, generate
    data = tmp_path / "shapes"
    generate(data, SyntheticSpec(**learning_gate.DATASET))
    logdir = tmp_path / "log"
    # deterministic CPU kernels, GPUs hidden (learning_gate.environment says why); horovodrun hands
    # its own environment to the processes it starts on this host
    env = learning_gate.environment(dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2",
                                         PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO)))
    start = time.time()
    # the demo's job (make demo), with the gate's options
    proc = subprocess.run([sys.executable, "-m", "training.local_job", *learning_gate.local_job_args(data, logdir)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
    wall = time.time() - start
    detections = tmp_path / "val_detections.json"
    if (logdir / "eval_results.json").exists():   # the trained model's detections on the validation split
        # inference only: no determinism flag (under it TensorFlow refuses the graph's unseeded random
        # ops, which inference never runs); the same CPU kernels, the same figures as the run's evaluation
        predict_env = {k: v for k, v in env.items() if k != "TF_DETERMINISTIC_OPS"}
        predicted = subprocess.run([sys.executable, "-m", "training.predict", "--checkpoint", str(logdir),
                                    "--split", "val2017", "--output", str(detections)],
                                   cwd=REPO, env=predict_env, capture_output=True, text=True, timeout=600)
        assert predicted.returncode == 0, predicted.stdout[-3000:] + predicted.stderr[-3000:]
    return proc, logdir, wall, data, detections


def mask_head_margin(ground_truth, detections: list[dict]) -> tuple[float, float]:
    """Segm AP50 of ``detections``, and of the same detections with each mask replaced by its
    filled box (what a mask head that learned nothing but "fill the box" would score)."""
    from training import evaluation
    key = "mAP(segm)/IoU=0.5"
    own = evaluation.evaluate(ground_truth, detections, ("segm",))[key]
    filled = evaluation.evaluate(ground_truth, evaluation.with_filled_box_masks(ground_truth, detections), ("segm",))[key]
    return own, filled


@pytest.mark.slow
def test_model_learns_to_the_stated_ap50(tmp_path):
    proc, logdir, wall, data, detections = _gate_run(tmp_path)
    # the job trained and evaluated (its exit status, the demo's verdict, is checked below)
    assert (logdir / "eval_results.json").exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "training.train" in proc.stdout and "horovodrun" in proc.stdout   # local_job's "running: ..." line
    final = json.loads((logdir / "eval_results.json").read_text())[-1]
    max_steps = json.loads((logdir / "config.json").read_text())["TRAIN"]["MAX_STEPS"]
    assert final["global_step"] == max_steps == 1200
    ap50 = {t: final[f"mAP({t})/IoU=0.5"] for t in ("bbox", "segm")}
    own, filled = mask_head_margin(data / "annotations" / "instances_val2017.json",
                                   json.loads(detections.read_text()))
    assert own == pytest.approx(ap50["segm"], abs=1e-6)   # the detections the run itself evaluated
    speed = re.findall(r"([\d.]+) images/s", proc.stdout)[-1:]
    print(f"learning gate: AP50 bbox {ap50['bbox']:.3f} segm {ap50['segm']:.3f} (bar {BAR_AP50}); "
          f"segm AP50 of the predicted detections {own:.3f}, with filled boxes as masks {filled:.3f}, "
          f"margin {own - filled:.3f} (bar {BAR_MASK_MARGIN}); "
          f"training command {wall:.0f}s, {''.join(speed) or '?'} images/s")
    assert all(v >= BAR_AP50 for v in ap50.values()), (
        f"the model did not learn: AP50 bbox {ap50['bbox']:.3f}, segm {ap50['segm']:.3f}, bar {BAR_AP50} "
        f"(seeded runs reach 0.61-0.74, an untrained model 0.00; docs/training.md)\n" + proc.stdout[-2000:])
    assert own - filled >= BAR_MASK_MARGIN, (
        f"the mask head does not beat filling each box: segm AP50 {own:.3f}, the same detections with "
        f"filled boxes {filled:.3f}, margin {own - filled:.3f} < {BAR_MASK_MARGIN} (docs/training.md)")
    # the demo's own verdict on the same run: its accuracy target met, exit status 0
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "target mAP@0.5 >= 0.5 for bbox and segm" in proc.stdout


def test_gate_runs_on_cpu_kernels_with_determinism_on_any_host():
    """On a GPU host (CUDA_VISIBLE_DEVICES set, or unset: every GPU visible) the gate's training
    still sees no GPU, where TF_DETERMINISTIC_OPS=1 would make ROIAlign's and FreezeBN's backward
    raise; determinism and the Eigen kernels stay on; the rest of the environment passes through."""
    import learning_gate
    for host in ({"CUDA_VISIBLE_DEVICES": "0,1,2,3", "PATH": "/usr/bin"}, {"PATH": "/usr/bin"},
                 {"TF_DETERMINISTIC_OPS": "0", "TF_ENABLE_ONEDNN_OPTS": "1", "PATH": "/usr/bin"}):
        env = learning_gate.environment(host)
        assert env["CUDA_VISIBLE_DEVICES"] == ""
        assert env["TF_DETERMINISTIC_OPS"] == "1" and env["TF_ENABLE_ONEDNN_OPTS"] == "0"
        assert env["PATH"] == "/usr/bin"
    host = {"CUDA_VISIBLE_DEVICES": "0"}
    learning_gate.environment(host)
    assert host == {"CUDA_VISIBLE_DEVICES": "0"}   # the test process's own environment is untouched


# -- training.local_job's verdict (no training: horovodrun's run is replaced by its results file)

def _local_job(tmp_path, monkeypatch, ap50: dict, minutes: float | None = None):
    from training import local_job
    from training.callbacks import EVAL_RESULTS_FILE
    data = tmp_path / "data"
    for split in ("train2017", "val2017"):  # the dataset "exists": local_job generates nothing
        (data / "annotations").mkdir(parents=True, exist_ok=True)
        (data / "annotations" / f"instances_{split}.json").write_text("{}")
    logdir = tmp_path / "log"

    def fake_horovodrun(cmd, **_):
        assert "training.train" in cmd
        logdir.mkdir()
        results = {f"mAP({t})/IoU=0.5": v for t, v in ap50.items()}
        (logdir / EVAL_RESULTS_FILE).write_text(json.dumps([{"epoch": 8, "global_step": 2000, **results}]))
        return 0

    monkeypatch.setattr(local_job, "horovodrun", lambda: "horovodrun")
    monkeypatch.setattr(local_job.subprocess, "call", fake_horovodrun)
    if minutes is not None:
        monkeypatch.setattr(local_job, "TARGET_MINUTES", minutes)
    return local_job.main(["--data", str(data), "--logdir", str(logdir)])


def test_the_gates_options_give_training_the_gates_config(tmp_path, monkeypatch):
    """local_job with the gate's options starts one Horovod process whose config is the CPU preset
    with the gate's settings over it, on the gate's dataset: the config the bar was measured with."""
    import learning_gate
    from training import local_job, train
    from training.callbacks import EVAL_RESULTS_FILE
    from training.configs import cpu_synthetic
    data, logdir = tmp_path / "shapes", tmp_path / "log"
    for split in ("train2017", "val2017"):
        (data / "annotations").mkdir(parents=True, exist_ok=True)
        (data / "annotations" / f"instances_{split}.json").write_text("{}")
    started = []

    def horovodrun(cmd, **_):
        started.append(cmd)
        logdir.mkdir()
        (logdir / EVAL_RESULTS_FILE).write_text(json.dumps([{"epoch": 12, "global_step": 1200}]))
        return 0

    monkeypatch.setattr(local_job, "horovodrun", lambda: "horovodrun")
    monkeypatch.setattr(local_job.subprocess, "call", horovodrun)
    local_job.main(learning_gate.local_job_args(data, logdir))
    [cmd] = started
    assert cmd[:5] == ["horovodrun", "-np", "1", "-H", "localhost:1"]
    args = train.parse_args(cmd[cmd.index("training.train") + 1:])
    assert Path(args.logdir) == logdir.resolve()
    config = train.build_config(args.config, preset=args.preset).to_dict()
    gate = train.build_config(cpu_synthetic.OVERRIDES + learning_gate.OVERRIDES
                              + [f"DATA.BASEDIR={str(data.resolve())!r}"]).to_dict()
    assert config == gate
    assert config["TRAIN"]["BATCH_SIZE_PER_GPU"] == 2 and config["DATA"]["NUM_WORKERS"] == 0


def test_local_job_exits_1_below_the_accuracy_target(tmp_path, monkeypatch, capsys):
    assert _local_job(tmp_path, monkeypatch, {"bbox": 0.93, "segm": 0.41}) == 1
    out, err = capsys.readouterr()
    assert "NOT met" in out
    assert "did not learn enough" in err and "segm 0.410" in err


def test_local_job_exits_0_on_target_and_reports_time_over_budget(tmp_path, monkeypatch, capsys):
    assert _local_job(tmp_path / "a", monkeypatch, {"bbox": 0.96, "segm": 0.94}) == 0
    assert "for bbox and segm within 15 min: met" in capsys.readouterr().out
    # over the time budget alone: reported, not a failure (the machine's speed varies by hour)
    assert _local_job(tmp_path / "b", monkeypatch, {"bbox": 0.96, "segm": 0.94}, minutes=0) == 0
    out = capsys.readouterr().out
    assert "NOT met" in out and "over the 0-minute budget" in out
