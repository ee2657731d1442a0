"""The metric names and regexes are those of the SageMaker EFS example, and the trainer's log lines
match them."""
from __future__ import annotations

import re

import pytest

from training import metrics

# The metric_definitions of AWS's SageMaker example notebook "Distributed Training of Mask-RCNN in Amazon
# SageMaker using EFS", copied literally (the notebook's "\\s" is the regex \s).
EXAMPLE_METRIC_DEFINITIONS = [
    ("fastrcnn_losses/box_loss", r".*fastrcnn_losses/box_loss:\s*(\S+).*"),
    ("fastrcnn_losses/label_loss", r".*fastrcnn_losses/label_loss:\s*(\S+).*"),
    ("fastrcnn_losses/label_metrics/accuracy", r".*fastrcnn_losses/label_metrics/accuracy:\s*(\S+).*"),
    ("fastrcnn_losses/label_metrics/false_negative",
     r".*fastrcnn_losses/label_metrics/false_negative:\s*(\S+).*"),
    ("fastrcnn_losses/label_metrics/fg_accuracy", r".*fastrcnn_losses/label_metrics/fg_accuracy:\s*(\S+).*"),
    ("fastrcnn_losses/num_fg_label", r".*fastrcnn_losses/num_fg_label:\s*(\S+).*"),
    ("maskrcnn_loss/accuracy", r".*maskrcnn_loss/accuracy:\s*(\S+).*"),
    ("maskrcnn_loss/fg_pixel_ratio", r".*maskrcnn_loss/fg_pixel_ratio:\s*(\S+).*"),
    ("maskrcnn_loss/maskrcnn_loss", r".*maskrcnn_loss/maskrcnn_loss:\s*(\S+).*"),
    ("maskrcnn_loss/pos_accuracy", r".*maskrcnn_loss/pos_accuracy:\s*(\S+).*"),
    ("mAP(bbox)/IoU=0.5", r".*mAP\(bbox\)/IoU=0\.5:\s*(\S+).*"),
    ("mAP(bbox)/IoU=0.5:0.95", r".*mAP\(bbox\)/IoU=0\.5:0\.95:\s*(\S+).*"),
    ("mAP(bbox)/IoU=0.75", r".*mAP\(bbox\)/IoU=0\.75:\s*(\S+).*"),
    ("mAP(bbox)/large", r".*mAP\(bbox\)/large:\s*(\S+).*"),
    ("mAP(bbox)/medium", r".*mAP\(bbox\)/medium:\s*(\S+).*"),
    ("mAP(bbox)/small", r".*mAP\(bbox\)/small:\s*(\S+).*"),
    ("mAP(segm)/IoU=0.5", r".*mAP\(segm\)/IoU=0\.5:\s*(\S+).*"),
    ("mAP(segm)/IoU=0.5:0.95", r".*mAP\(segm\)/IoU=0\.5:0\.95:\s*(\S+).*"),
    ("mAP(segm)/IoU=0.75", r".*mAP\(segm\)/IoU=0\.75:\s*(\S+).*"),
    ("mAP(segm)/large", r".*mAP\(segm\)/large:\s*(\S+).*"),
    ("mAP(segm)/medium", r".*mAP\(segm\)/medium:\s*(\S+).*"),
    ("mAP(segm)/small", r".*mAP\(segm\)/small:\s*(\S+).*"),
]

# The only (line, other regex) pairs that match, both harmless: see training/metrics.py.
PREFIX_OVERLAPS = {("mAP(bbox)/IoU=0.5:0.95", "mAP(bbox)/IoU=0.5"),
                   ("mAP(segm)/IoU=0.5:0.95", "mAP(segm)/IoU=0.5")}


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


# A progress line of a real run (docs/training.md), as training/callbacks.py ProgressLogger prints it.
PROGRESS_LINE = ("step 1900/2000 epoch 8 | rpn_losses/label_loss=0.0165 ... total_cost=0.3308 | lr=0.00200 | "
                 "19.03 images/s | elapsed 6m39s | ETA 0m21s")


def test_definitions_are_the_example_ones_and_six_from_the_progress_line():
    assert len(metrics.METRIC_DEFINITIONS) == 28
    got = {d["Name"]: d["Regex"] for d in metrics.METRIC_DEFINITIONS[:22]}
    assert got == dict(EXAMPLE_METRIC_DEFINITIONS)
    assert metrics.METRIC_DEFINITIONS[22:] == metrics.PROGRESS_METRIC_DEFINITIONS
    assert all(set(d) == {"Name", "Regex"} for d in metrics.METRIC_DEFINITIONS)
    # SageMaker takes at most 40 metric definitions a training job (botocore's sagemaker model: MetricDefinitionList max 40)
    assert len(set(metrics.SAGEMAKER_METRIC_NAMES)) == 28 <= 40


def test_progress_definitions_read_the_progress_line_and_nothing_else():
    captured = {d["Name"]: m.group(1) for d in metrics.METRIC_DEFINITIONS
                if (m := re.match(d["Regex"], PROGRESS_LINE))}
    assert captured == {metrics.IMAGES_PER_SECOND: "19.03", metrics.LEARNING_RATE: "0.00200"}
    for name in metrics.METRIC_NAMES:   # no "name: value" line is a progress line
        line = metrics.format_metric(name, 0.5)
        assert not any(re.match(d["Regex"], line) for d in metrics.PROGRESS_METRIC_DEFINITIONS), line


@pytest.mark.parametrize("name", metrics.METRIC_NAMES)
@pytest.mark.parametrize("value", [0.123, 0.0, 1.0, 1234567.0, 3.5e-07, float("nan")])
def test_own_regex_captures_the_value(name, value):
    line = metrics.format_metric(name, value)
    match = re.match(metrics.metric_regex(name), line)
    assert match is not None, line
    captured = float(match.group(1))
    if value != value:
        assert captured != captured
    else:
        assert captured == pytest.approx(value, rel=1e-5)


def test_example_line():
    assert metrics.format_metric("fastrcnn_losses/box_loss", 0.123) == "fastrcnn_losses/box_loss: 0.123"


def test_regex_also_matches_inside_a_longer_log_line():
    # tensorpack-style prefixes ("[1121 12:00:00 @monitor.py:467] ") must not stop the match.
    line = "[1121 12:00:00 @monitor.py:467] " + metrics.format_metric("mAP(segm)/small", 0.25)
    assert float(re.match(metrics.metric_regex("mAP(segm)/small"), line).group(1)) == 0.25


def test_a_line_yields_a_value_only_for_its_own_metric():
    for line_name in metrics.METRIC_NAMES:
        line = metrics.format_metric(line_name, 0.5)
        for other in metrics.METRIC_NAMES:
            if other == line_name:
                continue
            match = re.match(metrics.metric_regex(other), line)
            if (line_name, other) in PREFIX_OVERLAPS:
                # Matches, but captures "0.95:", which SageMaker cannot read as a number.
                assert match is not None and match.group(1) == "0.95:"
                assert not _is_number(match.group(1))
            else:
                assert match is None, (line, other)


def test_unknown_metric_is_rejected():
    with pytest.raises(ValueError, match="unknown metric"):
        metrics.format_metric("fastrcnn_losses/typo", 1.0)


def test_names_for_evaluation():
    assert metrics.map_metric_name("segm", "IoU=0.75") == "mAP(segm)/IoU=0.75"
    assert len(metrics.EVALUATION_METRICS) == 12
    with pytest.raises(ValueError):
        metrics.map_metric_name("keypoints", "IoU=0.5")
