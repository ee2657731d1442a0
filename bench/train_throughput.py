"""Training throughput of one process at a fixed small config: images/s of full training steps.

    python bench/train_throughput.py [--steps 100] [--batch-size 2] [--mixed-precision] [--xla]
    python bench/train_throughput.py --scale coco --mixed-precision     # on a GPU: images/s per GPU at
                                                                        # the default COCO config, batch 4, AMP

Batches are prepared before timing, so this measures the model (forward, backward, update),
not the input pipeline (see bench/input_pipeline.py). On a GPU machine the same command runs
NCHW on the GPU; --mixed-precision and --xla switch on TRAIN.MIXED_PRECISION / TRAIN.XLA there.
Writes bench/results/train_throughput-<device>.json.
"""
from __future__ import annotations

import argparse
import itertools
import time

import _common


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _common.add_common_args(p)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=0, help="images per step (default: the config's)")
    p.add_argument("--mixed-precision", action="store_true")
    p.add_argument("--xla", action="store_true")
    p.add_argument("--threads", type=int, default=0, help="TF intra/inter-op threads (0 = TF's default)")
    args = p.parse_args(argv)
    if args.batch_size:
        args.config.append(f"TRAIN.BATCH_SIZE_PER_GPU={args.batch_size}")
    args.config += [f"TRAIN.MIXED_PRECISION={args.mixed_precision}", f"TRAIN.XLA={args.xla}"]

    from training.compat import tf1, use_graph_mode
    use_graph_mode()
    cfg, split = _common.load_config(args)
    from training.data.pipeline import TrainingBatches
    from training.model.tower import build_towers

    batches = list(itertools.islice(iter(TrainingBatches(split.training_roidb(), cfg, seed=0)), 20))
    towers = build_towers(cfg)
    train_op = towers.train_op
    conf = tf1.ConfigProto(allow_soft_placement=True)
    conf.gpu_options.allow_growth = True
    if args.threads:
        conf.intra_op_parallelism_threads = conf.inter_op_parallelism_threads = args.threads
    # TRAIN.XLA marks the parts the model compiles (generalized_rcnn._xla_scope): no session-wide jit level
    with tf1.Session(config=conf) as sess:
        sess.run(tf1.global_variables_initializer())
        feeds = itertools.cycle([towers.feed(b) for b in batches])
        for _ in range(args.warmup):
            sess.run(train_op, feed_dict=next(feeds))
        start = time.perf_counter()
        for _ in range(args.steps):
            sess.run(train_op, feed_dict=next(feeds))
        elapsed = time.perf_counter() - start
    images = args.steps * cfg.TRAIN.BATCH_SIZE_PER_GPU
    _common.write_result("train_throughput-coco" if args.scale == "coco" else "train_throughput", args, {
        "scale": args.scale,
        "preset": args.preset, "overrides": args.config, "batch_size": cfg.TRAIN.BATCH_SIZE_PER_GPU,
        "data_format": cfg.BACKBONE.DATA_FORMAT, "image_short_edge": cfg.PREPROC.TRAIN_SHORT_EDGE_SIZE,
        "mixed_precision": cfg.TRAIN.MIXED_PRECISION, "xla": cfg.TRAIN.XLA, "threads": args.threads or "default",
        "steps": args.steps, "seconds": round(elapsed, 3), "step_ms": round(1000 * elapsed / args.steps, 1),
        "images_per_s": round(images / elapsed, 2)})


if __name__ == "__main__":
    main()
