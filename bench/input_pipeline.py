"""Input-pipeline throughput alone: images/s of training batches (decode, augment, masks, RPN targets).

    python bench/input_pipeline.py [--scale cpu|coco] [--workers 1 2] [--batches 100] [--config K=V ...]

``--scale coco`` is the default (full-size) config at batch 4 on the COCO-realistic fixture
(short edge 800, max 1333, P2-P6 default anchors, masks, ~7 objects an image); ``--scale cpu`` the
CPU preset on the synthetic shapes. Each worker count runs in turn; besides wall-clock images/s
the JSON holds the CPU time per image (this process plus its input worker processes, and this
process alone) and the load average, since a shared machine inflates wall-clock figures.
Writes bench/results/input_pipeline[-coco]-<device>.json.
"""
from __future__ import annotations

import argparse
import os
import time

import _common


def _children_cpu_seconds() -> float:
    """User + system CPU of this process's live children (the input workers), from /proc."""
    total, me, tick = 0.0, str(os.getpid()), os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # exited meanwhile
            continue
        if fields[1] == me:  # ppid; utime and stime are fields 14 and 15 of the full line
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def measure(split, cfg, batches: int, warmup: int) -> dict:
    from training.data.pipeline import TrainingBatches
    it = iter(TrainingBatches(split.training_roidb(), cfg, seed=0))
    for _ in range(warmup):
        next(it)
    load_before = os.getloadavg()[0]
    start, cpu_start, workers_start = time.perf_counter(), time.process_time(), _children_cpu_seconds()
    for _ in range(batches):
        next(it)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    workers_cpu = _children_cpu_seconds() - workers_start
    it.close()  # stops the workers before the next run
    images = batches * cfg.TRAIN.BATCH_SIZE_PER_GPU
    return {"workers": cfg.DATA.NUM_WORKERS, "batches": batches, "seconds": round(elapsed, 3),
            "images_per_s": round(images / elapsed, 2),
            "cpu_ms_per_image": round(1000 * (cpu + workers_cpu) / images, 1),
            "main_process_cpu_ms_per_image": round(1000 * cpu / images, 1),
            "load_average_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)]}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _common.add_common_args(p)
    p.add_argument("--batches", type=int, default=0, help="timed batches per run (default: 200 cpu, 50 coco)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--workers", type=int, nargs="+", default=[],
                   help="input worker process counts to run in turn, 0 = in the main process "
                        "(default: 1 2 at coco scale, else the config's)")
    args = p.parse_args(argv)
    coco = args.scale == "coco"
    workers = args.workers or ([1, 2] if coco else [None])
    runs = []
    for n in workers:
        run_args = argparse.Namespace(**{**vars(args), "config": args.config + (
            [f"DATA.NUM_WORKERS={n}"] if n is not None else [])})
        cfg, split = _common.load_config(run_args)
        runs.append(measure(split, cfg, args.batches or (50 if coco else 200), args.warmup))
        print(runs[-1], flush=True)
    result = {"scale": args.scale, "preset": None if coco else args.preset,
              "overrides": (_common.COCO_SCALE_OVERRIDES if coco else []) + args.config,
              "batch_size": cfg.TRAIN.BATCH_SIZE_PER_GPU, "image_short_edge": cfg.PREPROC.TRAIN_SHORT_EDGE_SIZE,
              "max_size": cfg.PREPROC.MAX_SIZE, "mask": cfg.MODE_MASK, "runs": runs,
              "workers": runs[-1]["workers"], "images_per_s": runs[-1]["images_per_s"]}
    if len(runs) > 1:
        result["speedup_last_vs_first"] = round(runs[-1]["images_per_s"] / runs[0]["images_per_s"], 2)
    name = "input_pipeline-coco" if coco else "input_pipeline"
    _common.write_result(name, args, result)


if __name__ == "__main__":
    main()
