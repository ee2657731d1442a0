"""Anchor boxes and the RPN's training targets.

Anchors of cell ``i`` of a level are centred at image coordinate ``i * stride``, as tensorpack's
``get_all_anchors`` places them (the RPN weights of its COCO models were trained on those), one per
(size, ratio) pair (sizes outer, ratios inner), in the order ``[H, W, A]`` row-major: the RPN head's outputs are
flattened in the same order, so the pipeline's targets line up with the graph's predictions.
Targets are computed in NumPy in the input pipeline (cheap, and off the training step).
"""
from __future__ import annotations

import numpy as np

from training.model import scopes
from training.model.box_ops import np_encode, np_ioa, np_iou


def cell_anchors(sizes, ratios) -> np.ndarray:
    """``[A, 4]`` anchors centred at the origin; ratio = height / width, area = size**2."""
    out = []
    for size in sizes:
        for ratio in ratios:
            w = size / np.sqrt(ratio)
            h = size * np.sqrt(ratio)
            out.append([-0.5 * w, -0.5 * h, 0.5 * w, 0.5 * h])
    return np.asarray(out, np.float32)


def grid_anchors(stride: int, sizes, ratios, feat_h: int, feat_w: int) -> np.ndarray:
    """``[feat_h * feat_w * A, 4]`` anchors of one level, in ``[H, W, A]`` order."""
    base = cell_anchors(sizes, ratios)
    cy = np.arange(feat_h, dtype=np.float32) * stride
    cx = np.arange(feat_w, dtype=np.float32) * stride
    cx, cy = np.meshgrid(cx, cy)  # [H, W]
    shifts = np.stack([cx, cy, cx, cy], axis=-1)[:, :, None, :]  # [H, W, 1, 4]
    return (shifts + base[None, None]).reshape(-1, 4).astype(np.float32)


def level_anchor_specs(cfg) -> list[tuple[int, tuple]]:
    """``[(stride, sizes), ...]`` per RPN level of the model in ``cfg``."""
    if cfg.MODE_FPN:
        return [(s, (size,)) for s, size in zip(cfg.FPN.ANCHOR_STRIDES, cfg.RPN.ANCHOR_SIZES)]
    return [(cfg.RPN.ANCHOR_STRIDE, tuple(cfg.RPN.ANCHOR_SIZES))]


def feature_size(padded: int, stride: int) -> int:
    """Cells of a level with ``stride`` along a padded side: ``ceil(padded / stride)``.

    The backbone halves a side divisible by 32 exactly down to C5 (stride 32); P6 takes every
    other P5 cell starting at the first, which rounds up (a 25-cell P5 gives a 13-cell P6). The
    graph and the input pipeline both count cells with this one function; ``build_graph`` checks
    it against the feature maps at run time.
    """
    return -(-int(padded) // int(stride))


def all_anchors(cfg, padded_h: int, padded_w: int) -> list[np.ndarray]:
    """Anchors of every RPN level for a (padded) input of ``padded_h x padded_w``."""
    return [grid_anchors(stride, sizes, cfg.RPN.ANCHOR_RATIOS, feature_size(padded_h, stride),
                         feature_size(padded_w, stride))
            for stride, sizes in level_anchor_specs(cfg)]


def rpn_targets(anchors: np.ndarray, gt_boxes: np.ndarray, is_crowd: np.ndarray, image_hw, *,
                rng: np.random.Generator, positive_thresh: float = 0.7, negative_thresh: float = 0.3,
                batch_per_im: int = 256, fg_ratio: float = 0.5, crowd_overlap_thresh: float = 9.99):
    """Label ``anchors`` for one image: 1 foreground, 0 background, -1 ignored.

    tensorpack's rules (``get_anchor_labels`` and ``filter_boxes_inside_shape`` in its
    examples/FasterRCNN data.py and common.py): only anchors wholly inside the real (unpadded)
    image are labelled. An anchor is foreground when its IoU with some box is >=
    ``positive_thresh`` or it is (one of) the best anchors of some box, and background when its
    best IoU is below ``negative_thresh`` (also when it is a box's best anchor). Foreground and
    background anchors whose intersection with a crowd box covers more than
    ``crowd_overlap_thresh`` of the anchor are ignored. At most ``batch_per_im`` labels are kept,
    foreground up to ``fg_ratio`` of them. Returns ``(labels [A] int32, box_targets [A, 4]
    float32)``; targets are encoded against the anchor for foreground anchors.
    """
    num = len(anchors)
    labels = np.full((num,), -1, np.int32)
    targets = np.zeros((num, 4), np.float32)
    h, w = image_hw
    inside = np.flatnonzero((anchors[:, 0] >= 0) & (anchors[:, 1] >= 0) & (anchors[:, 2] <= w) & (anchors[:, 3] <= h))
    is_crowd = np.asarray(is_crowd, bool).reshape(-1)
    gt_boxes = np.asarray(gt_boxes, np.float32).reshape(-1, 4)
    boxes = gt_boxes[~is_crowd]
    crowd = gt_boxes[is_crowd]
    if len(inside) == 0:
        return labels, targets
    a_in = anchors[inside]
    lab = np.zeros((len(inside),), np.int32)  # background unless matched
    if len(boxes):
        iou = np_iou(a_in, boxes)  # [Ai, G]
        best_gt = iou.argmax(axis=1)
        best_iou = iou[np.arange(len(inside)), best_gt]
        lab[:] = -1
        # every box gets its best anchors (ties included), then the thresholds, negative last
        gt_best = iou.max(axis=0)
        best_for_gt = np.flatnonzero(((iou == gt_best[None, :]) & (gt_best[None, :] > 0)).any(axis=1))
        lab[best_for_gt] = 1
        lab[best_iou >= positive_thresh] = 1
        lab[best_iou < negative_thresh] = 0
        tgt = np_encode(boxes[best_gt], a_in)
        if len(crowd) and crowd_overlap_thresh <= 1.0:
            # candidates mostly inside a crowd region are ambiguous: ignore them
            inter = np_ioa(crowd, a_in)  # [C, Ai]: the share of each anchor inside each crowd box
            lab[(lab >= 0) & (inter.max(axis=0) > crowd_overlap_thresh)] = -1
    else:
        tgt = np.zeros((len(inside), 4), np.float32)

    fg = np.flatnonzero(lab == 1)
    max_fg = int(batch_per_im * fg_ratio)
    if len(fg) > max_fg:
        lab[rng.choice(fg, len(fg) - max_fg, replace=False)] = -1
    num_fg = int((lab == 1).sum())
    bg = np.flatnonzero(lab == 0)
    max_bg = batch_per_im - num_fg
    if len(bg) > max_bg:
        lab[rng.choice(bg, len(bg) - max_bg, replace=False)] = -1
    labels[inside] = lab
    fg_all = inside[lab == 1]
    targets[fg_all] = tgt[lab == 1]
    return labels, targets


def tf_grid_anchors(stride: int, sizes, ratios, feat_h, feat_w):
    """TensorFlow form of :func:`grid_anchors` for dynamic feature sizes."""
    from training.compat import tf
    with tf.name_scope(scopes.ANCHORS):
        base = tf.constant(cell_anchors(sizes, ratios))
        cy = tf.cast(tf.range(feat_h), tf.float32) * stride
        cx = tf.cast(tf.range(feat_w), tf.float32) * stride
        cx, cy = tf.meshgrid(cx, cy)
        shifts = tf.stack([cx, cy, cx, cy], axis=-1)[:, :, None, :]
        return tf.reshape(shifts + base[None, None], [-1, 4])
