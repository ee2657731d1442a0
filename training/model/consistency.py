"""In-graph checks that stop a training step loudly instead of training on misaligned targets.

The RPN's sampled anchors come from the input pipeline as indices into each image's anchors,
concatenated over levels; the graph predicts ``sum_l H_l * W_l * A`` logits per image. If the two
disagree (a level whose cells the pipeline counts differently from the graph), every index past
that level would silently pick another anchor's logit. These checks compare the counts per level
and per image at run time (a few scalar comparisons per step) and raise ``InvalidArgumentError`` with a
message naming the level, the counts and the fix; likewise for the sampled ROIs and the mask
targets. Each function returns its checked tensors, to be used in their place.
"""
from __future__ import annotations

import math

from training.compat import tf, tf1
from training.model.anchors import feature_size


def _after(checks, tensors):
    with tf.control_dependencies(checks):
        return [tf.identity(t) for t in tensors]


def level_name(stride: int, fpn: bool) -> str:
    return f"P{int(math.log2(stride))} (stride {stride})" if fpn else f"C4 (stride {stride})"


def _tf_feature_size(padded, stride: int):
    # the TensorFlow form of anchors.feature_size (ceil division), so both count cells alike
    return -tf.math.floordiv(-padded, stride)


def checked_anchor_targets(num_anchors, anchor_index, anchor_labels, anchor_targets, level_logits, padded_hw, *,
                           specs, anchors_per_cell: int, fpn: bool):
    """Check the pipeline's sampled RPN anchors against the RPN's logits.

    ``num_anchors [B]``: the anchors per image the pipeline indexed; ``anchor_index`` /
    ``anchor_labels [B, K]``, ``anchor_targets [B, K, 4]``: the sampled rows (label -1: padding).
    ``level_logits[l]``: ``[B, N_l]`` logits of level ``l``; ``padded_hw``: the padded input side
    lengths; ``specs``: ``[(stride, sizes), ...]`` per level (anchors.level_anchor_specs).
    Per level, ``N_l`` must be the count the pipeline's formula gives (``feature_size`` of the
    padded input x anchors per cell); per image, the pipeline's ``num_anchors`` must be
    ``sum_l N_l`` and every sampled index must lie below it; the shapes must agree.
    """
    checks = []
    with tf.name_scope("check_anchor_targets"):
        hp, wp = padded_hw[0], padded_hw[1]
        counts = []
        for logits, (stride, _) in zip(level_logits, specs):
            graph_count = tf.shape(logits)[1]
            pipeline_count = _tf_feature_size(hp, stride) * _tf_feature_size(wp, stride) * anchors_per_cell
            checks.append(tf1.debugging.assert_equal(
                graph_count, pipeline_count, message=(
                    f"RPN level {level_name(stride, fpn)}: the graph predicts a different number of anchors per "
                    f"image than the input pipeline labels (anchors.feature_size counts ceil(padded side / "
                    f"stride) cells x {anchors_per_cell} anchors); graph, pipeline:")))
            counts.append(graph_count)
        total = tf.add_n(counts)
        labels_shape = tf.shape(anchor_labels)
        checks.append(tf1.debugging.assert_equal(
            num_anchors, total, message=(
                "num_anchors: the input pipeline counts a different number of anchors per image than the RPN "
                "has logits (summed over levels): its anchors do not match the feature maps of the model; "
                "pipeline per image, logits:"), data=[num_anchors, total]))
        checks.append(tf1.debugging.assert_equal(
            labels_shape[0], tf.shape(level_logits[0])[0],
            message="anchor_labels and the RPN logits differ in batch size; labels, logits:"))
        checks.append(tf1.debugging.assert_equal(
            tf.shape(anchor_index), labels_shape,
            message="anchor_index [B, K] does not match anchor_labels [B, K]; index, labels:"))
        checks.append(tf1.debugging.assert_equal(
            tf.shape(anchor_targets)[:2], labels_shape,
            message="anchor_targets [B, K, 4] does not match anchor_labels [B, K]; targets, labels:"))
        used = anchor_labels >= 0
        checks.append(tf1.debugging.assert_equal(
            tf.reduce_all(tf.logical_not(used) | ((anchor_index >= 0) & (anchor_index < total))), True, message=(
                "a sampled RPN anchor index lies outside the anchors of its image; anchors per image:"),
            data=[total]))
        return _after(checks, [anchor_index, anchor_labels, anchor_targets])


def checked_sampled_rois(rois, labels, fg_gt_index, num_fg, *, batch_per_im: int, fg_ratio: float, image: int):
    """Check one image's sampled ROIs: at most ``batch_per_im``, foreground first and within its
    quota, one label per ROI, one matched box per foreground ROI."""
    checks = []
    with tf.name_scope(f"check_sampled_rois_{image}"):
        n = tf.shape(rois)[0]
        checks.append(tf1.debugging.assert_equal(
            n, tf.shape(labels)[0], message=f"image {image}: sampled ROIs and their labels differ in count; ROIs, labels:"))
        checks.append(tf1.debugging.assert_less_equal(
            n, batch_per_im, message=f"image {image}: more sampled ROIs than FRCNN.BATCH_PER_IM={batch_per_im}:"))
        checks.append(tf1.debugging.assert_less_equal(
            num_fg, int(batch_per_im * fg_ratio),
            message=f"image {image}: more foreground ROIs than FRCNN.BATCH_PER_IM x FRCNN.FG_RATIO:"))
        checks.append(tf1.debugging.assert_equal(
            tf.shape(fg_gt_index)[0], num_fg,
            message=f"image {image}: foreground ROIs and their matched ground-truth boxes differ in count:"))
        checks.append(tf1.debugging.assert_equal(
            tf.reduce_all(labels[:num_fg] > 0) & tf.reduce_all(tf.equal(labels[num_fg:], 0)), True,
            message=f"image {image}: sampled ROI labels are not foreground first, then background:"))
        return _after(checks, [rois, labels, fg_gt_index])


def checked_mask_targets(mask_logits, targets, fg_labels, *, num_classes: int):
    """Mask targets ``[F, S, S]`` must match the mask logits ``[F, C, S, S]`` of the F foreground ROIs."""
    with tf.name_scope("check_mask_targets"):
        f = tf.size(fg_labels)
        logits_shape = tf.shape(mask_logits)
        checks = [
            tf1.debugging.assert_equal(
                logits_shape, tf.stack([f, num_classes, logits_shape[2], logits_shape[2]]),
                message=f"mask logits are not [foreground ROIs, {num_classes} classes, S, S]; logits shape, foreground ROIs:",
                data=[logits_shape, f]),
            tf1.debugging.assert_equal(
                tf.shape(targets), tf.stack([f, logits_shape[2], logits_shape[3]]),
                message="mask targets are not [foreground ROIs, S, S] like the mask logits; targets shape, logits shape:",
                data=[tf.shape(targets), logits_shape]),
        ]
        return _after(checks, [mask_logits, targets])
