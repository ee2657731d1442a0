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


def _nms_topk(boxes, scores, *, pre_nms_topk: int, post_nms_topk: int, nms_thresh: float, min_size: float, image_hw):
    k = tf.minimum(pre_nms_topk, tf.size(scores))
    scores, idx = tf.nn.top_k(scores, k=k, sorted=True)
    boxes = tf_clip(tf.gather(boxes, idx), image_hw)
    # Boxes outside the image (anchors in another image's batch padding) clip to zero area; they
    # would still take NMS and top-k slots. Dropped as detectron2 drops empty boxes after clipping
    # (``Boxes.nonempty``); MIN_SIZE raises the bar.
    # (NMS's score threshold drops them: no separate tf.where and its wait for the count)
    nonempty = (boxes[:, 2] - boxes[:, 0] > min_size) & (boxes[:, 3] - boxes[:, 1] > min_size)
    scores = tf.where(nonempty, scores, -np.inf)
    keep = tf.image.non_max_suppression(boxes, scores, post_nms_topk, iou_threshold=nms_thresh,
                                        score_threshold=np.finfo(np.float32).min)
    return tf.gather(boxes, keep), tf.gather(scores, keep)


def generate_proposals(logits, deltas, anchors, image_hw, *, cfg, training: bool):
    """Proposals of one image from per-level ``logits [N_l]``, ``deltas [N_l, 4]``, ``anchors [N_l, 4]``.

    ``Level`` mode (FPN): NMS per level, then the best ``POST_NMS_TOPK`` over all levels;
    ``Joint`` mode and C4: one top-k and NMS over everything. Returns ``(boxes [K, 4], scores [K])``
    with no gradient (proposals are treated as fixed inputs to the second stage).
    """
    with tf.name_scope(scopes.PROPOSALS):
        r = cfg.RPN
        post = r.TRAIN_POST_NMS_TOPK if training else r.TEST_POST_NMS_TOPK
        image_hw = tf.cast(image_hw, tf.float32)
        clip = decode_clip(cfg.PREPROC.MAX_SIZE)  # tensorpack's log(MAX_SIZE / 16), as for the final boxes
        if cfg.MODE_FPN and cfg.FPN.PROPOSAL_MODE == "Level":
            per_level = r.TRAIN_PER_LEVEL_NMS_TOPK if training else r.TEST_PER_LEVEL_NMS_TOPK
            boxes, scores = [], []
            for lg, dl, an in zip(logits, deltas, anchors):
                b, s = _nms_topk(tf_decode(dl, an, clip=clip), lg, pre_nms_topk=per_level, post_nms_topk=per_level,
                                 nms_thresh=r.PROPOSAL_NMS_THRESH, min_size=r.MIN_SIZE, image_hw=image_hw)
                boxes.append(b)
                scores.append(s)
            boxes, scores = tf.concat(boxes, 0), tf.concat(scores, 0)
            k = tf.minimum(post, tf.size(scores))
            scores, idx = tf.nn.top_k(scores, k=k, sorted=True)
            boxes = tf.gather(boxes, idx)
        else:
            pre = r.TRAIN_PRE_NMS_TOPK if training else r.TEST_PRE_NMS_TOPK
            boxes = tf_decode(tf.concat(deltas, 0), tf.concat(anchors, 0), clip=clip)
            boxes, scores = _nms_topk(boxes, tf.concat(logits, 0), pre_nms_topk=pre, post_nms_topk=post,
                                      nms_thresh=r.PROPOSAL_NMS_THRESH, min_size=r.MIN_SIZE, image_hw=image_hw)
        return tf.stop_gradient(boxes), tf.stop_gradient(scores)
