"""Fast R-CNN second stage: ROI sampling for training, the box head, and detection outputs."""
from __future__ import annotations

from tensorpack.models import Conv2D, FullyConnected
from tensorpack.tfutils.argscope import argscope

from training.compat import tf, tf1
from training.model import scopes
from training.model.backbone import group_norm
from training.model.box_ops import tf_clip, tf_decode, tf_encode, tf_iou


def sample_rois(proposals, gt_boxes, gt_labels, *, batch_per_im: int, fg_ratio: float, fg_thresh: float,
                num_proposals=None):
    """Choose the ROIs one image trains on (Mask R-CNN paper: 25% foreground at IoU >= 0.5).

    Ground-truth boxes join the proposals so foreground exists from the first step. With
    ``num_proposals``, only the first that many rows of ``proposals`` are proposals (the rest pad
    the batch's proposals to one size) and the others are never sampled. Returns
    ``rois [R, 4]``, ``labels [R]`` (0 = background; foreground first), ``fg_gt_index [F]``
    (the matched box of each foreground ROI) and ``num_fg``.
    """
    with tf.name_scope(scopes.ROI_SAMPLING):
        boxes = tf.concat([proposals, gt_boxes], axis=0)
        iou = tf_iou(boxes, gt_boxes)  # [N, G]
        best_iou = tf.reduce_max(iou, axis=1)
        best_gt = tf.argmax(iou, axis=1, output_type=tf.int32)
        # a uniformly random subset of each kind in random order, as shuffling and slicing would give,
        # from random keys and top_k: both have GPU kernels (RandomShuffle runs on the CPU only)
        n = tf.size(best_iou)
        if num_proposals is None:
            real = tf.ones([n], tf.bool)
        else:
            rows = tf.range(n)
            real = (rows < num_proposals) | (rows >= tf.shape(proposals)[0])
        is_fg = (best_iou >= fg_thresh) & real
        is_bg = ~is_fg & real
        keys = tf.random.uniform([n], 0.0, 1.0)
        num_fg = tf.minimum(int(batch_per_im * fg_ratio), tf.reduce_sum(tf.cast(is_fg, tf.int32)))
        fg = tf.nn.top_k(tf.where(is_fg, keys, -1.0), k=num_fg, sorted=True).indices
        num_bg = tf.minimum(batch_per_im - num_fg, tf.reduce_sum(tf.cast(is_bg, tf.int32)))
        bg = tf.nn.top_k(tf.where(is_bg, keys, -1.0), k=num_bg, sorted=True).indices
        keep = tf.concat([fg, bg], axis=0)
        fg_gt_index = tf.gather(best_gt, fg)
        labels = tf.concat([tf.gather(gt_labels, fg_gt_index), tf.zeros([num_bg], tf.int32)], axis=0)
        rois = tf.stop_gradient(tf.gather(boxes, keep))
        return rois, tf.stop_gradient(labels), tf.stop_gradient(fg_gt_index), num_fg


def class_outputs(feature, *, num_classes: int):
    """Class logits ``[N, num_classes + 1]`` and per-class box deltas ``[N, num_classes, 4]``.

    Laid out as tensorpack's ``fastrcnn_outputs``, whose weights load here: the box layer has a
    delta for the background class too (``(num_classes + 1) * 4`` outputs, background first),
    which no loss or detection reads; it is dropped here, so callers see foreground classes only.
    """
    logits = FullyConnected("class", feature, num_classes + 1, kernel_initializer=tf1.random_normal_initializer(stddev=0.01))
    deltas = FullyConnected("box", feature, (num_classes + 1) * 4,
                            kernel_initializer=tf1.random_normal_initializer(stddev=0.001))
    return logits, tf.reshape(deltas, [-1, num_classes + 1, 4])[:, 1:]


def box_head(pooled, *, head_func: str, fc_dim: int, conv_dim: int, num_classes: int, gn_groups: int = 32):
    """``pooled``: NHWC ``[N, P, P, C]`` -> class logits ``[N, num_classes + 1]``, deltas ``[N, num_classes, 4]``.

    Variables as tensorpack's FPN heads name them (``fastrcnn/fc6``, ``fastrcnn/fc7``,
    ``fastrcnn/outputs/class``, ``fastrcnn/outputs/box``), and the first fully connected layer
    flattens its input in tensorpack's (C, H, W) order: tensorpack pools ROIs as NCHW, so rows of
    its ``fc6/W`` (``fc/W``) run channel-major, and its COCO weights mean the same here.
    """
    def nchw(x):  # FullyConnected flattens what it gets
        return tf.transpose(x, [0, 3, 1, 2])

    with tf1.variable_scope("fastrcnn"):
        x = pooled
        if head_func in ("fastrcnn_4conv1fc_head", "fastrcnn_4conv1fc_gn_head"):
            with argscope(Conv2D, data_format="channels_last", kernel_initializer=tf1.variance_scaling_initializer(2.0)):
                for i in range(4):
                    x = Conv2D(f"conv{i}", x, conv_dim, 3, use_bias=head_func == "fastrcnn_4conv1fc_head")
                    if head_func == "fastrcnn_4conv1fc_gn_head":
                        with tf1.variable_scope(f"conv{i}"):
                            x = group_norm("gn", x, groups=gn_groups, data_format="NHWC")
                    x = tf.nn.relu(x)
            x = FullyConnected("fc", nchw(x), fc_dim, activation=tf.nn.relu,
                               kernel_initializer=tf1.variance_scaling_initializer())
        else:  # fastrcnn_2fc_head
            init = tf1.variance_scaling_initializer()
            x = FullyConnected("fc6", nchw(x), fc_dim, activation=tf.nn.relu, kernel_initializer=init)
            x = FullyConnected("fc7", x, fc_dim, activation=tf.nn.relu, kernel_initializer=init)
        with tf1.variable_scope("outputs"):
            return class_outputs(x, num_classes=num_classes)


def box_targets(rois, gt_boxes, fg_gt_index, num_fg, weights):
    """Encoded regression targets of the foreground ROIs (which come first in ``rois``)."""
    return tf_encode(tf.gather(gt_boxes, fg_gt_index), rois[:num_fg], weights)


def detections(rois, logits, deltas, image_hw, *, weights, score_thresh: float, nms_thresh: float, max_dets: int,
               decode_clip: float):
    """Final detections of one image: per-class decoding (log-size deltas clipped at
    ``decode_clip``), score threshold, class-wise NMS, as tensorpack's fastrcnn_predictions.

    Returns ``boxes [K, 4]``, ``scores [K]``, ``labels [K]`` (1-based classes), best first. Boxes
    that clipping to the image left with no width or height are kept, as tensorpack keeps them:
    they score what the model gave them and take their place in the ranking (their masks are
    empty); dropping them would change which detections fill ``max_dets``.
    """
    num_classes = tf.shape(deltas)[1]
    probs = tf.nn.softmax(logits)[:, 1:]  # [N, C]
    n = tf.shape(rois)[0]
    rois_rep = tf.reshape(tf.tile(rois[:, None, :], [1, num_classes, 1]), [-1, 4])
    boxes = tf_decode(tf.reshape(deltas, [-1, 4]), rois_rep, weights, clip=decode_clip)
    boxes = tf_clip(boxes, tf.cast(image_hw, tf.float32))  # [N*C, 4]
    scores = tf.reshape(probs, [-1])
    labels = tf.tile(tf.range(1, num_classes + 1)[None, :], [n, 1])
    labels = tf.reshape(labels, [-1])
    keep = tf.reshape(tf.where(scores > score_thresh), [-1])
    boxes, scores, labels = tf.gather(boxes, keep), tf.gather(scores, keep), tf.gather(labels, keep)
    # class-wise NMS in one call: shift each class's boxes to a region of their own
    offset = tf.cast(labels, tf.float32)[:, None] * (tf.reduce_max(tf.cast(image_hw, tf.float32)) + 1.0)
    keep = tf.image.non_max_suppression(boxes + offset, scores, max_dets, iou_threshold=nms_thresh)
    return tf.gather(boxes, keep), tf.gather(scores, keep), tf.gather(labels, keep)
