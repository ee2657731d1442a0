"""The fast CPU run on the synthetic shapes dataset (``make demo``; tests start from it too).

A standard R50-FPN from scratch learns almost nothing in 10 minutes on 2 cores (about 0.95 images/s
at 256 px; bbox AP50 about 0.05 on these shapes after 10 minutes, measured on this kind of machine), so this
is a much smaller detector sized to the data: 128 px images, a 4-stage ResNet of basic blocks
16-32-64-128 channels wide with GroupNorm, a 64-channel FPN, one anchor size per level matched to
the 20-64 px shapes, few sampled ROIs, and a high learning rate with warmup.
One source of truth: local_job, the tests and bench/ all read OVERRIDES from here.
"""
from __future__ import annotations

# The synthetic dataset this config is tuned for (training.data.synthetic options).
DATASET = {"train": 1000, "val": 100, "size": 128, "seed": 0}

OVERRIDES = [
    "MODE_FPN=True",
    "MODE_MASK=True",
    "DATA.TRAIN=('train2017',)",
    "DATA.VAL=('val2017',)",
    "DATA.NUM_WORKERS=2",
    "BACKBONE.RESNET_NUM_BLOCKS=[1, 1, 1, 1]",
    "BACKBONE.BLOCK='basic'",
    "BACKBONE.WIDTH=16",
    "BACKBONE.NORM='GN'",
    "BACKBONE.GN_GROUPS=8",
    "BACKBONE.DATA_FORMAT='NHWC'",
    "PREPROC.TRAIN_SHORT_EDGE_SIZE=[128, 128]",
    "PREPROC.TEST_SHORT_EDGE_SIZE=128",
    "PREPROC.MAX_SIZE=128",
    "FPN.ANCHOR_STRIDES=(4, 8, 16, 32)",
    "RPN.ANCHOR_SIZES=(16, 32, 64, 128)",
    "RPN.ANCHOR_RATIOS=(0.5, 1.0, 2.0)",
    "RPN.BATCH_PER_IM=128",
    "RPN.TRAIN_PER_LEVEL_NMS_TOPK=400",
    "RPN.TEST_PER_LEVEL_NMS_TOPK=400",
    "RPN.TRAIN_POST_NMS_TOPK=200",
    "RPN.TEST_POST_NMS_TOPK=200",
    "FPN.NUM_CHANNEL=64",
    "FPN.FRCNN_FC_HEAD_DIM=256",
    "FRCNN.BATCH_PER_IM=64",
    "MRCNN.HEAD_DIM=64",
    "MRCNN.NUM_CONV=2",
    "MRCNN.MASK_SIZE=28",
    "TRAIN.BATCH_SIZE_PER_GPU=2",
    "TRAIN.BASE_LR=0.04",
    "TRAIN.WARMUP=200",  # steps (not scaled with the batch): the warmup the measured runs had
    "TRAIN.WEIGHT_DECAY=1e-4",
    "TRAIN.IMAGES_PER_EPOCH=1000",
    "TRAIN.LR_EPOCH_SCHEDULE=[(6, 0.1), (8, None)]",
    "TRAIN.EVAL_PERIOD=4",
    "TRAIN.LOG_PERIOD=25",
    "TEST.RESULTS_PER_IM=50",
]
