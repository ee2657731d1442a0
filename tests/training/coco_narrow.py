"""COCO's shapes with narrow widths, for tests and benchmarks at COCO scale on a CPU.

The default model's image sizes (short edge 800, max 1333), levels (P2-P6), anchors and samplers
stay; only the backbone, FPN and head widths shrink, so a step at batch 4 takes seconds on a CPU.
Users add what their run varies (batch, workers, periods). The full-width default model is trained
in tests/training/test_full_model.py.
"""
from __future__ import annotations

OVERRIDES = [
    "DATA.TRAIN=('train2017',)", "DATA.VAL=('val2017',)",
    "BACKBONE.RESNET_NUM_BLOCKS=[1, 1, 1, 1]", "BACKBONE.BLOCK='basic'", "BACKBONE.WIDTH=8",
    "BACKBONE.NORM='GN'", "BACKBONE.GN_GROUPS=4", "BACKBONE.DATA_FORMAT='NHWC'",
    "FPN.NUM_CHANNEL=16", "FPN.FRCNN_FC_HEAD_DIM=32", "MRCNN.HEAD_DIM=16", "MRCNN.NUM_CONV=1",
    "TRAIN.WARMUP=1",
]
