"""Padding per image in training batches, aspect-ratio grouping off vs on.

    python bench/batch_padding.py [--scale coco|cpu] [--batches 2000] [--config K=V ...]

Padded pixels per image: each batch's padded area (images x padded height x padded width) minus its
images' resized areas, summed, divided by the images. Computed from the pipeline's own plans
(``TrainingBatches.plans``: the images each batch holds and their drawn sizes), so no image is
read and thousands of batches take seconds. ``--scale coco`` (default): the default config at
batch 4 on the COCO-realistic fixture (COCO's image sizes, landscape and portrait). The figure is
a property of the sizes and the batching alone: the machine does not change it.
Writes bench/results/batch_padding[-coco]-<device>.json.
"""
from __future__ import annotations

import argparse
import itertools

import _common


def padding(split, cfg, batches: int) -> dict:
    from training.data.pipeline import TrainingBatches
    padded = real = images = 0
    for layout, sizes, _, _ in itertools.islice(TrainingBatches(split.training_roidb(), cfg, seed=0).plans(), batches):
        padded += layout.batch * layout.height * layout.width
        real += sum(h * w for h, w in sizes)
        images += layout.batch
    return {"aspect_ratio_grouping": cfg.DATA.ASPECT_RATIO_GROUPING, "batches": batches, "images": images,
            "padded_pixels_per_image": round((padded - real) / images),
            "image_pixels_per_image": round(real / images),
            "padded_fraction_of_batch": round((padded - real) / padded, 4)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _common.add_common_args(p)
    p.set_defaults(scale="coco")
    p.add_argument("--batches", type=int, default=2000)
    args = p.parse_args(argv)
    runs = []
    for grouping in (False, True):
        run_args = argparse.Namespace(**{**vars(args), "config": args.config + [f"DATA.ASPECT_RATIO_GROUPING={grouping}"]})
        cfg, split = _common.load_config(run_args)
        runs.append(padding(split, cfg, args.batches))
        print(runs[-1], flush=True)
    off, on = runs
    result = {"scale": args.scale, "overrides": (_common.COCO_SCALE_OVERRIDES if args.scale == "coco" else [])
              + args.config, "batch_size": cfg.TRAIN.BATCH_SIZE_PER_GPU,
              "image_short_edge": cfg.PREPROC.TRAIN_SHORT_EDGE_SIZE, "max_size": cfg.PREPROC.MAX_SIZE,
              "training_images": len(split.training_roidb()), "runs": runs,
              "padded_pixels_grouped_vs_ungrouped": round(on["padded_pixels_per_image"] / off["padded_pixels_per_image"], 3)}
    _common.write_result("batch_padding-coco" if args.scale == "coco" else "batch_padding", args, result)


if __name__ == "__main__":
    main()
