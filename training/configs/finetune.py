"""Fine-tuning on a dataset of its own: the schedule sized to the training data (training/schedule.py).

MMDetection's fine-tuning schedule: 8 passes over the training images, the LR x0.1 for the last
one, an evaluation after each pass; the LR is TRAIN.BASE_LR's (0.01 at a global batch of 8 by
default, MMDetection's fine-tuning LR). Combine it with a model preset: ``--preset cpu_synthetic,finetune``.
Where a command takes config overrides rather than presets (``maskrcnn job submit``, SageMaker's
``-H config:KEY=VALUE``), give these two.
"""
from __future__ import annotations

OVERRIDES = [
    "TRAIN.DATASET_PASSES=8",
    "TRAIN.EVAL_PERIOD=1",
]
