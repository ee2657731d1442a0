"""Input-pipeline throughput alone: images/s of training batches (decode, augment, masks, RPN targets).

    python bench/input_pipeline.py [--batches 200] [--workers 2] [--preset cpu_synthetic] [--config K=V ...]

Writes bench/results/input_pipeline-<device>.json. Runs unchanged on a GPU machine (no GPU used).
"""
from __future__ import annotations

import argparse
import time

import _common


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _common.add_common_args(p)
    p.add_argument("--batches", type=int, default=200)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--workers", type=int, default=0, help="decode threads (default: the config's DATA.NUM_WORKERS)")
    args = p.parse_args(argv)
    if args.workers:
        args.config.append(f"DATA.NUM_WORKERS={args.workers}")
    cfg, split = _common.load_config(args)
    from training.data.pipeline import TrainingBatches
    it = iter(TrainingBatches(split.training_roidb(), cfg, seed=0))
    for _ in range(args.warmup):
        next(it)
    start = time.perf_counter()
    for _ in range(args.batches):
        next(it)
    elapsed = time.perf_counter() - start
    images = args.batches * cfg.TRAIN.BATCH_SIZE_PER_GPU
    _common.write_result("input_pipeline", args, {
        "preset": args.preset, "overrides": args.config, "batch_size": cfg.TRAIN.BATCH_SIZE_PER_GPU,
        "workers": cfg.DATA.NUM_WORKERS, "image_short_edge": cfg.PREPROC.TRAIN_SHORT_EDGE_SIZE,
        "batches": args.batches, "seconds": round(elapsed, 3), "images_per_s": round(images / elapsed, 2)})


if __name__ == "__main__":
    main()
