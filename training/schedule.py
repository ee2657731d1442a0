"""A schedule sized to the training data (``TRAIN.DATASET_PASSES``), for fine-tuning.

COCO's schedules are step counts for 118k images: "2x" is 360000 steps of 8 images, 2.88 M images,
with the first evaluation after 120000. On a dataset of a few hundred images that is thousands of
passes over it. Fine-tuning guides state the schedule in passes over the new data instead:

* MMDetection, "Finetuning Models" (docs/en/user_guides/finetune.md, "Modify training schedule":
  https://mmdetection.readthedocs.io/en/latest/user_guides/finetune.html): "a smaller learning rate
  and fewer training epochs": 8 epochs (passes over the dataset), the LR x0.1 after epoch 7, LR 0.01
  "set for a batch size of 8", a linear warmup over the first 500 iterations, evaluation each epoch
  (its default ``val_interval``).
* detectron2's tutorial (Colab "Detectron2 Beginner's Tutorial", balloon dataset of 61 images):
  ``SOLVER.IMS_PER_BATCH = 2``, ``BASE_LR = 0.00025``, ``MAX_ITER = 300`` ("seems good enough for
  this toy dataset; you will need to train longer for a practical dataset"), ``STEPS = []`` (no
  decay): 600 images, about 10 passes.

With ``TRAIN.DATASET_PASSES = P > 0`` (the ``finetune`` preset: training/configs/finetune.py sets
MMDetection's 8), :func:`fit_to_dataset` derives from the number of training images N:

* an epoch is one pass: ``IMAGES_PER_EPOCH = N``, so ``EVAL_PERIOD`` and ``CHECKPOINT_PERIOD`` count
  passes;
* ``LR_EPOCH_SCHEDULE = [(round(7P/8), 0.1), (P, None)]``: MMDetection's drop for the last eighth
  (at least one pass before it, none for P = 1);
* ``WARMUP``: at most one pass of steps (MMDetection's 500 iterations would outlast a whole 8-pass
  run on a few hundred images).

The LR stays ``TRAIN.BASE_LR`` for a global batch of 8, scaled with the global batch: the default
0.01 is MMDetection's fine-tuning LR at that batch.
"""
from __future__ import annotations

DECAY_FRACTION = 7 / 8   # MMDetection's fine-tuning schedule: LR x0.1 after epoch 7 of 8
DECAY_FACTOR = 0.1


def epoch_schedule(passes: int) -> list[tuple]:
    """``TRAIN.LR_EPOCH_SCHEDULE`` for ``passes`` passes over the data."""
    if passes == 1:
        return [(1, None)]
    decay = min(passes - 1, max(1, round(passes * DECAY_FRACTION)))
    return [(decay, DECAY_FACTOR), (passes, None)]


def fit_to_dataset(cfg, *, num_images: int, global_batch: int) -> None:
    """Set the schedule of an unfrozen config with ``TRAIN.DATASET_PASSES > 0`` from the number of
    training images (called by ``config.finalize`` before it derives the steps)."""
    passes = cfg.TRAIN.DATASET_PASSES
    cfg.TRAIN.IMAGES_PER_EPOCH = num_images
    cfg.TRAIN.LR_EPOCH_SCHEDULE = epoch_schedule(passes)
    steps_per_pass = -(-num_images // global_batch)
    cfg.TRAIN.WARMUP = min(cfg.TRAIN.WARMUP, steps_per_pass)


def plan(cfg, *, num_images: int) -> str:
    """What a finalized config will train: images, passes over the ``num_images`` training images,
    steps, and how often it evaluates (printed at the start of training)."""
    t = cfg.TRAIN
    global_batch = t.BATCH_SIZE_PER_GPU * t.NUM_GPUS
    images = t.MAX_STEPS * global_batch
    if not cfg.DATA.VAL:
        evaluation = "no evaluation (DATA.VAL is empty)"
    elif t.EVAL_PERIOD:
        first = min(t.EVAL_PERIOD, t.MAX_EPOCH) * t.STEPS_PER_EPOCH
        evaluation = f"evaluation every {t.EVAL_PERIOD} epoch(s), the first after step {min(first, t.MAX_STEPS)}"
    else:
        evaluation = "one evaluation, at the end"
    return (f"plan: {images:,} images = {images / max(num_images, 1):,.1f} passes over {num_images:,} training "
            f"images; {t.MAX_STEPS:,} steps of {global_batch} = {t.MAX_EPOCH} epochs of {t.STEPS_PER_EPOCH} "
            f"steps; {evaluation}")


def planned_time(*, images_left: int, images_per_second: float, measured_steps: tuple[int, int]) -> str:
    """The time the rest of the plan takes at the speed measured over ``measured_steps`` (printed once
    the first steps after the start-up have been timed)."""
    hours = images_left / max(images_per_second, 1e-9) / 3600
    return (f"plan: {images_left:,} images left take about {hours:.2f} hours at {images_per_second:.2f} images/s "
            f"(steps {measured_steps[0]}-{measured_steps[1]})")
