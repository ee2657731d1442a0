"""The training metrics SageMaker scrapes from the log: names, regexes and the log-line format.

One source of truth: the trainer prints every metric with :func:`format_metric`, and the SageMaker
launcher passes :data:`METRIC_DEFINITIONS` to the training job unchanged. The 22 names and their
regexes are the ``metric_definitions`` of AWS's SageMaker example notebook "Distributed Training of
Mask-RCNN in Amazon SageMaker using EFS" (``.*<escaped name>:\\s*(\\S+).*``);
``tests/training/test_metrics.py`` checks them against that example's literal strings.

Known overlap, kept because the regexes are the example's contract: the regex of
``mAP(bbox)/IoU=0.5`` also matches the line of ``mAP(bbox)/IoU=0.5:0.95`` (``IoU=0\\.5:`` is a prefix
of ``IoU=0.5:0.95:``) and captures ``0.95:``, which is not a number; SageMaker keeps only captures that read as numbers
(observed in https://github.com/aws/sagemaker-python-sdk/issues/3208), so that match yields no value.
The same holds for segm. Every other pair of (metric line, other metric's regex) does not match.
"""
from __future__ import annotations

import re

# Training losses and statistics (tensorpack FasterRCNN summary names).
FASTRCNN_BOX_LOSS = "fastrcnn_losses/box_loss"
FASTRCNN_LABEL_LOSS = "fastrcnn_losses/label_loss"
FASTRCNN_ACCURACY = "fastrcnn_losses/label_metrics/accuracy"
FASTRCNN_FALSE_NEGATIVE = "fastrcnn_losses/label_metrics/false_negative"
FASTRCNN_FG_ACCURACY = "fastrcnn_losses/label_metrics/fg_accuracy"
FASTRCNN_NUM_FG_LABEL = "fastrcnn_losses/num_fg_label"
MASKRCNN_ACCURACY = "maskrcnn_loss/accuracy"
MASKRCNN_FG_PIXEL_RATIO = "maskrcnn_loss/fg_pixel_ratio"
MASKRCNN_LOSS = "maskrcnn_loss/maskrcnn_loss"
MASKRCNN_POS_ACCURACY = "maskrcnn_loss/pos_accuracy"

TRAINING_METRICS = (
    FASTRCNN_BOX_LOSS, FASTRCNN_LABEL_LOSS, FASTRCNN_ACCURACY, FASTRCNN_FALSE_NEGATIVE,
    FASTRCNN_FG_ACCURACY, FASTRCNN_NUM_FG_LABEL, MASKRCNN_ACCURACY, MASKRCNN_FG_PIXEL_RATIO,
    MASKRCNN_LOSS, MASKRCNN_POS_ACCURACY,
)

# COCO evaluation: the six COCOeval summary figures, for boxes and for masks.
IOU_TYPES = ("bbox", "segm")
# Suffix per COCOeval.stats index 0..5 (AP, AP50, AP75, AP small, AP medium, AP large).
COCO_STAT_SUFFIXES = ("IoU=0.5:0.95", "IoU=0.5", "IoU=0.75", "small", "medium", "large")


def map_metric_name(iou_type: str, suffix: str) -> str:
    """``map_metric_name("bbox", "IoU=0.5")`` -> ``"mAP(bbox)/IoU=0.5"``."""
    if iou_type not in IOU_TYPES or suffix not in COCO_STAT_SUFFIXES:
        raise ValueError(f"no metric for iou_type={iou_type!r}, suffix={suffix!r}; "
                         f"iou types: {IOU_TYPES}, suffixes: {COCO_STAT_SUFFIXES}")
    return f"mAP({iou_type})/{suffix}"


EVALUATION_METRICS = tuple(map_metric_name(t, s) for t in IOU_TYPES for s in COCO_STAT_SUFFIXES)
METRIC_NAMES = TRAINING_METRICS + EVALUATION_METRICS


def metric_regex(name: str) -> str:
    """The SageMaker EFS example's regex for ``name``: anything, the literal name, a colon, then the value."""
    return ".*" + re.escape(name) + r":\s*(\S+).*"


# What SageMaker receives (training jobs' MetricDefinitions): [{"Name": ..., "Regex": ...}, ...].
METRIC_DEFINITIONS = [{"Name": name, "Regex": metric_regex(name)} for name in METRIC_NAMES]


def format_metric(name: str, value: float) -> str:
    """The log line for one metric, e.g. ``fastrcnn_losses/box_loss: 0.123``.

    Print each metric on a line of its own: that is what makes a line match only its own regex
    (see the module docstring for the one harmless prefix overlap).
    """
    if name not in METRIC_NAMES:
        raise ValueError(f"unknown metric {name!r}; known metrics are listed in training/metrics.py")
    # Six significant digits; nan/inf print as float() reads them back.
    return f"{name}: {float(value):.6g}"
