"""Region Proposal Network: a shared conv head on every level, and proposal generation."""
from __future__ import annotations

import numpy as np
from tensorpack.models import Conv2D
from tensorpack.tfutils.argscope import argscope

from training.compat import tf, tf1
from training.model import scopes
from training.model.anchors import tf_grid_anchors
from training.model.backbone import channels_axis
from training.model.box_ops import decode_clip, tf_clip, tf_decode


def rpn_head(feature, *, channels: int, num_anchors: int, data_format: str):
    """Objectness logits ``[B, H, W, A]`` and box deltas ``[B, H, W, A, 4]`` for one level (NHWC order).

    Call once per level inside the same variable scope with reuse, so the head is shared.
    """
    with argscope(Conv2D, data_format=data_format, kernel_initializer=tf1.random_normal_initializer(stddev=0.01)):
        hidden = Conv2D("conv0", feature, channels, 3, activation=tf.nn.relu)
        logits = Conv2D("class", hidden, num_anchors, 1)
        deltas = Conv2D("box", hidden, 4 * num_anchors, 1)
    if channels_axis(data_format) == 1:
        logits = tf.transpose(logits, [0, 2, 3, 1])
        deltas = tf.transpose(deltas, [0, 2, 3, 1])
    shp = tf.shape(logits)
    deltas = tf.reshape(deltas, [shp[0], shp[1], shp[2], num_anchors, 4])
    return logits, deltas


def multilevel_rpn(features, *, cfg, data_format: str):
    """Run the shared RPN head on each level; returns flattened per-level lists and anchors.

    ``logits[l]``: ``[B, N_l]``; ``deltas[l]``: ``[B, N_l, 4]``; ``anchors[l]``: ``[N_l, 4]``, in the
    same ``[H, W, A]`` order as the input pipeline's anchor targets.
    """
    from training.model.anchors import level_anchor_specs
    specs = level_anchor_specs(cfg)
    num_anchors = len(specs[0][1]) * len(cfg.RPN.ANCHOR_RATIOS)
    channels = cfg.FPN.NUM_CHANNEL if cfg.MODE_FPN else cfg.RPN.HEAD_DIM
    all_logits, all_deltas, all_anchors = [], [], []
    for feat, (stride, sizes) in zip(features, specs):
        with tf1.variable_scope("rpn", reuse=tf1.AUTO_REUSE):
            logits, deltas = rpn_head(feat, channels=channels, num_anchors=num_anchors, data_format=data_format)
        shp = tf.shape(logits)
        all_anchors.append(tf_grid_anchors(stride, sizes, cfg.RPN.ANCHOR_RATIOS, shp[1], shp[2]))
        all_logits.append(tf.reshape(logits, [shp[0], -1]))
        all_deltas.append(tf.reshape(deltas, [shp[0], -1, 4]))
    return all_logits, all_deltas, all_anchors


def _topk_boxes(logits, deltas, anchors, image_hw, *, pre_nms_topk: int, min_size: float, clip: float):
    """The best ``pre_nms_topk`` anchors of each image by logit, decoded and clipped to the image.

    ``logits [B, N]``, ``deltas [B, N, 4]``, ``anchors [N, 4]``. Returns ``boxes [B, pre_nms_topk, 4]``
    in descending score order and ``scores [B, pre_nms_topk]``. Rows that are not a proposal (past
    ``N``, or no wider or taller than ``min_size`` after clipping: tensorpack's filter) are zeros:
    padded NMS never selects an all-zero box and an empty box suppresses nothing.
    """
    n = tf.shape(logits)[1]
    # fewer anchors than pre_nms_topk (a coarse level of a small image): pad to the static size
    logits = tf.pad(logits, [[0, 0], [0, tf.maximum(pre_nms_topk - n, 0)]], constant_values=-np.inf)
    scores, idx = tf.nn.top_k(logits, k=pre_nms_topk, sorted=True)
    real = idx < n
    idx = tf.minimum(idx, n - 1)
    b = tf.shape(idx)[0]
    # decode the chosen anchors only (decoding is per box: the values of decoding all, then choosing)
    picked = tf_decode(tf.reshape(tf.gather(deltas, idx, batch_dims=1), [-1, 4]),
                       tf.reshape(tf.gather(anchors, idx), [-1, 4]), clip=clip)
    boxes = tf_clip(tf.reshape(picked, [b, pre_nms_topk, 4]), image_hw)
    keep = real & (boxes[..., 2] - boxes[..., 0] > min_size) & (boxes[..., 3] - boxes[..., 1] > min_size)
    return tf.where(keep[..., None], boxes, tf.zeros_like(boxes)), scores, keep


def _batched_nms(boxes, scores, keep, *, max_output_size: int, nms_thresh: float, padded: bool):
    """Greedy NMS of every row of ``boxes [R, K, 4]`` (sorted by descending score; ``keep [R, K]``
    false for the all-zero rows that are no box), keeping at most ``max_output_size`` boxes a row.
    Returns ``boxes``, ``scores`` ``[R, max_output_size(, 4)]`` best first, rows past each row's
    count zeros / -inf, and the counts.

    ``padded``: one ``non_max_suppression_padded`` call for all rows (a GPU's way: no output size to
    wait for per row); otherwise ``tf.image.non_max_suppression`` row after row, which a CPU runs
    about as fast for all the rows as the padded form for one of them. The two select the same boxes.

    ``non_max_suppression_padded`` suppresses a box at IoU >= its threshold, NMS (tensorpack's
    ``tf.image.non_max_suppression``) at IoU > threshold: the next float32 above the threshold
    makes them the same (a box at IoU exactly 0.7 with a better one stays). IoU does not depend on
    which axis comes first, so x1y1x2y2 boxes pass as canonical y1x1y2x2 ones (without
    ``canonicalized_coordinates`` it checks the order with a ``tf.cond`` on the first box, which
    reads that box back to the host).
    """
    if padded:
        threshold = float(np.nextafter(np.float32(nms_thresh), np.float32(np.inf)))
        # tile_size: how many boxes suppress each other at once; a row of K <= 512 boxes is one tile
        idx, count = tf.image.non_max_suppression_padded(
            boxes, scores, max_output_size, iou_threshold=threshold, pad_to_max_output_size=True,
            sorted_input=True, canonicalized_coordinates=True, tile_size=min(512, int(boxes.shape[1])))
    else:
        def row(args):
            b, s = args
            # rows that are no box score -inf, below the threshold: never selected
            i = tf.image.non_max_suppression(b, s, max_output_size, iou_threshold=nms_thresh,
                                             score_threshold=np.finfo(np.float32).min)
            return tf.pad(i, [[0, max_output_size - tf.size(i)]]), tf.size(i)

        idx, count = tf.map_fn(row, (boxes, tf.where(keep, scores, -np.inf)),
                               fn_output_signature=(tf.TensorSpec([max_output_size], tf.int32),
                                                    tf.TensorSpec([], tf.int32)))
    valid = tf.range(max_output_size)[None, :] < count[:, None]
    boxes = tf.where(valid[..., None], tf.gather(boxes, idx, batch_dims=1), 0.0)
    scores = tf.where(valid, tf.gather(scores, idx, batch_dims=1), -np.inf)
    return boxes, scores, count


def generate_proposals(logits, deltas, anchors, image_hw, *, cfg, training: bool):
    """Proposals of a batch of images from per-level ``logits [B, N_l]``, ``deltas [B, N_l, 4]``,
    ``anchors [N_l, 4]`` and each image's ``image_hw [B, 2]``, as tensorpack's
    ``generate_rpn_proposals`` / ``generate_fpn_proposals`` compute them for one image.

    ``RPN.PROPOSAL_NMS`` (``padded`` on a GPU, ``greedy`` on a CPU) chooses how NMS runs over the
    images and levels, with the same result (``_batched_nms``).

    ``Level`` mode (FPN), per level: the best ``PER_LEVEL_NMS_TOPK`` anchors by logit, decoded,
    clipped to the image, those no wider or taller than ``RPN.MIN_SIZE`` dropped, NMS at
    ``PROPOSAL_NMS_THRESH`` keeping ``PER_LEVEL_NMS_TOPK``; then the best ``POST_NMS_TOPK`` over all
    levels. ``Joint`` mode and C4: the same over all anchors at once, ``PRE_NMS_TOPK`` before NMS
    and ``POST_NMS_TOPK`` after. One NMS call for all images and levels, at static shapes.

    Returns ``boxes [B, K, 4]``, ``scores [B, K]`` (logits) best first, ``K`` = ``POST_NMS_TOPK``
    (or fewer when the levels cannot hold that many), and ``counts [B]``: image ``i``'s proposals
    are its first ``counts[i]`` rows, the rest are zeros with a score of -inf. No gradient
    (proposals are fixed inputs to the second stage).
    """
    with tf.name_scope(scopes.PROPOSALS):
        r = cfg.RPN
        post = r.TRAIN_POST_NMS_TOPK if training else r.TEST_POST_NMS_TOPK
        image_hw = tf.cast(image_hw, tf.float32)
        clip = decode_clip(cfg.PREPROC.MAX_SIZE)  # tensorpack's log(MAX_SIZE / 16), as for the final boxes
        if cfg.MODE_FPN and cfg.FPN.PROPOSAL_MODE == "Level":
            per_level = r.TRAIN_PER_LEVEL_NMS_TOPK if training else r.TEST_PER_LEVEL_NMS_TOPK
            groups = list(zip(logits, deltas, anchors))
            pre, nms_keep = per_level, per_level
        else:
            groups = [(tf.concat(logits, 1), tf.concat(deltas, 1), tf.concat(anchors, 0))]
            pre = r.TRAIN_PRE_NMS_TOPK if training else r.TEST_PRE_NMS_TOPK
            nms_keep = post
        tops = [_topk_boxes(lg, dl, an, image_hw, pre_nms_topk=pre, min_size=r.MIN_SIZE, clip=clip)
                for lg, dl, an in groups]
        # images x levels as the batch of one NMS call: row i * L + l is image i's level l
        num_groups = len(groups)
        boxes = tf.reshape(tf.stack([t[0] for t in tops], axis=1), [-1, pre, 4])
        scores = tf.reshape(tf.stack([t[1] for t in tops], axis=1), [-1, pre])
        keep = tf.reshape(tf.stack([t[2] for t in tops], axis=1), [-1, pre])
        boxes, scores, counts = _batched_nms(boxes, scores, keep, max_output_size=nms_keep,
                                             nms_thresh=r.PROPOSAL_NMS_THRESH, padded=r.PROPOSAL_NMS == "padded")
        boxes = tf.reshape(boxes, [-1, num_groups * nms_keep, 4])
        scores = tf.reshape(scores, [-1, num_groups * nms_keep])
        counts = tf.reduce_sum(tf.reshape(counts, [-1, num_groups]), axis=1)
        k = min(post, num_groups * nms_keep)
        if num_groups > 1:
            # levels one after the other, each best first: ties go to the lower level, as top-k over
            # the concatenated per-level results gives
            scores, idx = tf.nn.top_k(scores, k=k, sorted=True)
            boxes = tf.gather(boxes, idx, batch_dims=1)
        counts = tf.minimum(counts, k)
        return tf.stop_gradient(boxes), tf.stop_gradient(scores), tf.stop_gradient(counts)
