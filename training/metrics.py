"""The training metrics: their names, the regexes SageMaker scrapes from the log, the log-line format,
and the names, namespaces and dimensions they have in CloudWatch.

One source of truth: the trainer prints every metric with :func:`format_metric`, and the SageMaker
launcher passes :data:`METRIC_DEFINITIONS` to the training job unchanged. The first 22 names and
their regexes are the ``metric_definitions`` of AWS's SageMaker example notebook "Distributed Training
of Mask-RCNN in Amazon SageMaker using EFS" (``.*<escaped name>:\\s*(\\S+).*``);
``tests/training/test_metrics.py`` checks them against that example's literal strings. The others
(throughput, learning rate, rank 0's GPU utilisation and peak memory, the mixed-precision loss scale
and skipped steps) are read from the progress line the trainer prints every TRAIN.LOG_PERIOD steps
(:data:`PROGRESS_METRIC_DEFINITIONS`).

On the EC2 cluster rank 0 also writes the metrics in CloudWatch's embedded metric format
(training/cloudwatch_metrics.py) under :data:`NAMESPACE`; the CloudWatch agent of the master node
ships that file, and the stacks' dashboards and alarms (infra/constructs/monitoring.py) name the
metrics by the constants here.

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


# Throughput and learning rate, read from the progress line (training/callbacks.py ProgressLogger):
#   step 1900/2000 epoch 8 | rpn_losses/label_loss=0.0165 ... | lr=0.00200 | 19.03 images/s | elapsed ...
# Losses there are written "name=value", so none of the "name:" regexes above match that line, and
# these two match no "name: value" line.
IMAGES_PER_SECOND = "images/s"            # the whole job's training images per second
LEARNING_RATE = "learning_rate"           # also the graph's tensor name ("learning_rate:0")
# Rank 0's GPU (training/gpu_metrics.py), on the progress line where it has one, e.g.
#   ... | ETA 0m21s | gpu 87.5% 12.34 GiB peak | loss scale 32768 skipped 2
GPU_UTILIZATION_MEAN = "gpu_utilization"  # percent: mean of nvidia-smi's utilization.gpu since the last line
GPU_PEAK_MEMORY_GIB = "gpu_peak_memory_gib"  # GiB: TensorFlow's peak allocation on the GPU since it started
# Under TRAIN.MIXED_PRECISION (training/gradients.py): the dynamic loss scale after the step, and the
# steps its process skipped (a gradient not finite) since the process started.
AMP_LOSS_SCALE = "amp_loss_scale"
AMP_SKIPPED_STEPS = "amp_skipped_steps"
PROGRESS_METRIC_DEFINITIONS = [
    {"Name": IMAGES_PER_SECOND, "Regex": r".*\| (\S+) images/s \|.*"},
    {"Name": LEARNING_RATE, "Regex": r".*\| lr=(\S+) \|.*"},
    {"Name": GPU_UTILIZATION_MEAN, "Regex": r".*\| gpu (\S+)% .*"},
    {"Name": GPU_PEAK_MEMORY_GIB, "Regex": r".*\| gpu .* (\S+) GiB peak.*"},
    {"Name": AMP_LOSS_SCALE, "Regex": r".*\| loss scale (\S+) skipped .*"},
    {"Name": AMP_SKIPPED_STEPS, "Regex": r".*\| loss scale \S+ skipped (\S+)$"},
]

# What SageMaker receives (training jobs' MetricDefinitions): [{"Name": ..., "Regex": ...}, ...].
METRIC_DEFINITIONS = ([{"Name": name, "Regex": metric_regex(name)} for name in METRIC_NAMES]
                      + PROGRESS_METRIC_DEFINITIONS)
# The metrics SageMaker publishes for a job (namespace /aws/sagemaker/TrainingJobs, dimension Host).
SAGEMAKER_METRIC_NAMES = tuple(d["Name"] for d in METRIC_DEFINITIONS)
SAGEMAKER_NAMESPACE = "/aws/sagemaker/TrainingJobs"
SAGEMAKER_HOST_DIMENSION = "Host"         # "<training job name>/algo-<n>"

# ------------------------------------------------------------------------------------- CloudWatch
# The embedded-metric-format records of rank 0 on the EC2 cluster (training/cloudwatch_metrics.py).
NAMESPACE = "MaskRCNN/Training"
DEPLOYMENT_DIMENSION = "Deployment"       # the training stack's name: what alarms and dashboards select
RUN_DIMENSION = "Run"                     # the run's name (its log directory's name)
PATH_PROPERTY = "Path"                    # "cluster" or "sagemaker": a log field, not a dimension
# Every metric once per deployment (alarms, the dashboard) and once per run (comparing runs).
DIMENSION_SETS = ((DEPLOYMENT_DIMENSION,), (DEPLOYMENT_DIMENSION, RUN_DIMENSION))

# The model's losses (training/model/generalized_rcnn.py, its ``stats``): the mean of each over the
# steps since the last record. maskrcnn_loss only with MODE_MASK.
RPN_LABEL_LOSS = "rpn_losses/label_loss"
RPN_BOX_LOSS = "rpn_losses/box_loss"
WEIGHT_DECAY_COST = "wd_cost"
TOTAL_COST = "total_cost"                 # the sum of every loss and the weight decay: what is minimised
LOSS_METRICS = (RPN_LABEL_LOSS, RPN_BOX_LOSS, FASTRCNN_LABEL_LOSS, FASTRCNN_BOX_LOSS, MASKRCNN_LOSS,
                WEIGHT_DECAY_COST, TOTAL_COST)

STEP = "step"                             # global step (of TRAIN.MAX_STEPS)
EPOCH = "epoch"
PROGRESS = "progress"                     # percent of TRAIN.MAX_STEPS done
IMAGES_PER_SECOND_PER_GPU = "images/s/gpu"  # images/s over the number of ranks (one per GPU)
LOSS_NOT_FINITE = "loss_not_finite"       # steps since the last record whose total_cost was NaN or inf
# The records also carry GPU_UTILIZATION_MEAN (over the period since the last record) and
# GPU_PEAK_MEMORY_GIB of rank 0's GPU, and under mixed precision AMP_LOSS_SCALE and AMP_SKIPPED_STEPS.
HEARTBEAT = "heartbeat"                   # 1 in every record written while steps advance
RUN_ACTIVE = "run_active"                 # 1 from the start of a run, 0 in its last record
RUN_FINISHED = "run_finished"             # 1: the run reached TRAIN.MAX_STEPS
RUN_FAILED = "run_failed"                 # 1: training stopped on an error
RUN_STOPPED = "run_stopped"               # 1: training stopped before the end of its schedule on request

# CloudWatch units (MetricDatum.Unit) of the records' metrics; every other metric has none.
UNITS = {STEP: "Count", EPOCH: "Count", PROGRESS: "Percent", IMAGES_PER_SECOND: "Count/Second",
         IMAGES_PER_SECOND_PER_GPU: "Count/Second", LOSS_NOT_FINITE: "Count", HEARTBEAT: "Count",
         RUN_FINISHED: "Count", RUN_FAILED: "Count", RUN_STOPPED: "Count", GPU_UTILIZATION_MEAN: "Percent",
         AMP_SKIPPED_STEPS: "Count"}

# Node metrics of the cluster's CloudWatch agent (infra/userdata/cluster_node.sh, ship_logs): one
# namespace per deployment, NODE_NAMESPACE_PREFIX + the training stack's name, every series with the
# one dimension InstanceId (the agent rolls the per-GPU and per-device series up to the node).
NODE_NAMESPACE_PREFIX = "MaskRCNN/Nodes/"
NODE_DIMENSION = "InstanceId"
GPU_UTILIZATION = "nvidia_smi_utilization_gpu"          # percent
GPU_MEMORY_UTILIZATION = "nvidia_smi_utilization_memory"  # percent of the time memory was read or written
GPU_MEMORY_USED = "nvidia_smi_memory_used"              # MiB
EFA_RX_BYTES = "efa_rx_bytes"                           # bytes received in the period, every EFA device
EFA_TX_BYTES = "efa_tx_bytes"


def format_metric(name: str, value: float) -> str:
    """The log line for one metric, e.g. ``fastrcnn_losses/box_loss: 0.123``.

    Print each metric on a line of its own: that is what makes a line match only its own regex
    (see the module docstring for the one harmless prefix overlap).
    """
    if name not in METRIC_NAMES:
        raise ValueError(f"unknown metric {name!r}; known metrics are listed in training/metrics.py")
    # Six significant digits; nan/inf print as float() reads them back.
    return f"{name}: {float(value):.6g}"
