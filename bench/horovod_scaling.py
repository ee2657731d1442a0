"""Horovod scaling on one machine: training images/s with 1 and 2 processes, fp16 gradient
compression off and on, the same per-rank config in every run (the real trainer, horovodrun --gloo).

    python bench/horovod_scaling.py [--scale coco|cpu] [--steps 12] [--skip 3] [--processes 1 2]

``--scale coco``: COCO's shapes (800 px short edge, max 1333, P2-P6 default anchors and samplers,
batch 4 per rank) on the COCO-realistic fixture with a narrow backbone and heads (full widths take
minutes a step on a CPU); ``--scale cpu``: the ``cpu_synthetic`` preset. The rate is taken from
the trainer's progress lines between step ``--skip`` and the last (graph building, the first
steps and the final evaluation are excluded). Writes bench/results/horovod_scaling-<scale>-<device>.json.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import _common

coco_narrow = _common.load_test_helper("coco_narrow", under="training")

COCO_SHAPES_NARROW = coco_narrow.OVERRIDES + [
    "DATA.NUM_WORKERS=2", "TRAIN.BATCH_SIZE_PER_GPU=4", "TEST.RESULTS_PER_IM=20",
]
PROGRESS = re.compile(r"^(?:\[\d+\]<stdout>:)?step (\d+)/\d+ .* elapsed (?:(\d+)h)?(\d+)m(\d+)s", re.M)


def rate(out: str, skip: int, global_batch: int) -> float:
    points = [(int(m[0]), int(m[1] or 0) * 3600 + int(m[2]) * 60 + int(m[3])) for m in PROGRESS.findall(out)]
    points = [p for p in points if p[0] >= skip]
    if len(points) < 2 or points[-1][1] == points[0][1]:
        raise RuntimeError(f"too few progress lines to time (raise --steps): {points}")
    (s0, t0), (s1, t1) = points[0], points[-1]
    return (s1 - s0) * global_batch / (t1 - t0)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scale", choices=("coco", "cpu"), default="coco")
    p.add_argument("--steps", type=int, default=12, help="training steps per run")
    p.add_argument("--skip", type=int, default=3, help="steps before the timed span")
    p.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    p.add_argument("--compression", nargs="+", default=["none", "fp16"], choices=("none", "fp16"))
    p.add_argument("--output", default="")
    args = p.parse_args(argv)
    coco = args.scale == "coco"
    data = _common.dataset("", args.scale)
    batch = 4 if coco else 2
    horovodrun = str(Path(sys.executable).parent / "horovodrun")
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(_common.REPO))
    runs = []
    for n in args.processes:
        for compression in (args.compression if n > 1 else ["none"]):
            overrides = (COCO_SHAPES_NARROW if coco else []) + [
                f"DATA.BASEDIR={str(data)!r}", f"TRAIN.IMAGES_PER_EPOCH={args.steps * batch * n}",
                "TRAIN.LR_EPOCH_SCHEDULE=[(1, None)]", "TRAIN.LOG_PERIOD=1", "TRAIN.EVAL_MAX_IMAGES=1",
                f"TRAIN.GRADIENT_COMPRESSION={compression!r}"]
            with tempfile.TemporaryDirectory() as logdir:
                cmd = [horovodrun, "-np", str(n), "-H", f"localhost:{n}", "--gloo", sys.executable, "-m",
                       "training.train", "--logdir", logdir, *([] if coco else ["--preset", "cpu_synthetic"]),
                       "--config", *overrides]
                load_before = os.getloadavg()[0]
                proc = subprocess.run(cmd, cwd=_common.REPO, env=env, capture_output=True, text=True)
            out = proc.stdout + proc.stderr
            if proc.returncode:
                sys.exit(f"training failed ({n} processes, {compression}):\n{out[-3000:]}")
            images_per_s = rate(out, args.skip, batch * n)
            runs.append({"processes": n, "compression": compression, "images_per_s": round(images_per_s, 2),
                         "images_per_s_per_process": round(images_per_s / n, 2),
                         "load_average_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)]})
            print(runs[-1], flush=True)
    one = next((r["images_per_s"] for r in runs if r["processes"] == 1), None)
    for r in runs:
        if one:
            r["speedup_vs_1_process"] = round(r["images_per_s"] / one, 2)
    _common.write_result(f"horovod_scaling-{args.scale}", args, {
        "overrides": (COCO_SHAPES_NARROW if coco else ["--preset cpu_synthetic"]), "batch_per_process": batch,
        "steps": args.steps, "timed_from_step": args.skip, "runs": runs})


if __name__ == "__main__":
    main()
