"""The RPN's training labels for one image, computed where they are cheap: near the boxes.

Same rules as :func:`training.model.anchors.rpn_targets` (tensorpack's ``get_anchor_labels``:
only anchors wholly inside the real image are labelled; foreground at IoU >= the positive
threshold or best anchor of a box, unless its IoU is below the negative threshold, which makes it
background; candidates mostly covered by a crowd box ignored; at most ``batch_per_im`` labels,
foreground up to ``fg_ratio``), but not as a dense anchors x boxes IoU
matrix: at 800x1333 with P2-P6 there are ~270k anchors, and that matrix made the per-image
targets the pipeline's bottleneck. An anchor can only overlap a box when its centre is within
half an anchor size of the box, and each level's anchors are stored row by row (``[H, W, A]``),
so each box is compared only with the block of rows and columns (per level) that can reach it.
Only the sampled anchors are labelled and encoded, and only they leave the worker.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from training.model.anchors import all_anchors
from training.model.box_ops import np_encode


@dataclasses.dataclass(frozen=True)
class Level:
    start: int              # offset of the level's first anchor in the concatenation
    rows: int               # H
    row_len: int            # W * A anchors per row
    row_centre_y: np.ndarray   # [H]
    col_centre_x: np.ndarray   # [W * A], the same in every row
    half_w: float           # half the widest / tallest anchor of the level
    half_h: float


@dataclasses.dataclass(frozen=True)
class AnchorSet:
    """Every RPN anchor of a padded input size, concatenated over levels as the graph orders them."""

    boxes: np.ndarray           # [N, 4] float32
    centre_x: np.ndarray        # [N]
    centre_y: np.ndarray        # [N]
    areas: np.ndarray           # [N]
    levels: tuple               # Level per level

    @classmethod
    def build(cls, cfg, padded_h: int, padded_w: int) -> "AnchorSet":
        per_level = all_anchors(cfg, padded_h, padded_w)
        boxes = np.concatenate(per_level, axis=0).astype(np.float32)
        # the anchors of one cell share a centre up to float32 rounding; snap it so rows sort exactly
        cx = np.round(0.5 * (boxes[:, 0] + boxes[:, 2]) * 64) / 64
        cy = np.round(0.5 * (boxes[:, 1] + boxes[:, 3]) * 64) / 64
        levels, start = [], 0
        for anchors in per_level:
            stop = start + len(anchors)
            row_len = int(np.sum(cy[start:stop] == cy[start])) if len(anchors) else 1
            rows = len(anchors) // row_len
            grid_y = cy[start:stop].reshape(rows, row_len)
            grid_x = cx[start:stop].reshape(rows, row_len)
            # [H, W, A] row-major: every row has the same x centres, rows go down the image
            if not (np.all(grid_y == grid_y[:, :1]) and np.all(grid_x == grid_x[:1])
                    and np.all(np.diff(grid_y[:, 0]) > 0) and np.all(np.diff(grid_x[0]) >= 0)):
                raise ValueError("anchors of a level are not stored row by row ([H, W, A]); "
                                 "the banded RPN target search relies on that order")
            levels.append(Level(start, rows, row_len, grid_y[:, 0].copy(), grid_x[0].copy(),
                                float((anchors[:, 2] - anchors[:, 0]).max()) / 2,
                                float((anchors[:, 3] - anchors[:, 1]).max()) / 2))
            start = stop
        areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
        return cls(boxes, cx, cy, areas, tuple(levels))

    def __len__(self) -> int:
        return len(self.boxes)

    def blocks(self, box: np.ndarray):
        """Per level, ``(level, row slice, column slice)`` of the grid block holding every anchor of
        that level that can intersect ``box`` (1 px margin for the snapped centres)."""
        for level in self.levels:
            r0 = int(np.searchsorted(level.row_centre_y, box[1] - level.half_h - 1, side="right"))
            r1 = int(np.searchsorted(level.row_centre_y, box[3] + level.half_h + 1, side="left"))
            c0 = int(np.searchsorted(level.col_centre_x, box[0] - level.half_w - 1, side="right"))
            c1 = int(np.searchsorted(level.col_centre_x, box[2] + level.half_w + 1, side="left"))
            if r1 > r0 and c1 > c0:
                yield level, slice(r0, r1), slice(c0, c1)

    def grid(self, values: np.ndarray, level: Level) -> np.ndarray:
        """A per-anchor array's view of ``level`` as ``[H, W * A, ...]`` (writes go through)."""
        part = values[level.start:level.start + level.rows * level.row_len]
        return part.reshape((level.rows, level.row_len) + values.shape[1:])


def _iou_with(a: np.ndarray, areas: np.ndarray, box: np.ndarray) -> np.ndarray:
    """IoU of anchors ``a`` [..., 4] (areas ``areas``) with one box."""
    iw = np.minimum(a[..., 2], box[2]) - np.maximum(a[..., 0], box[0])
    ih = np.minimum(a[..., 3], box[3]) - np.maximum(a[..., 1], box[1])
    np.maximum(iw, 0, out=iw)
    np.maximum(ih, 0, out=ih)
    inter = iw * ih
    union = areas + (box[2] - box[0]) * (box[3] - box[1]) - inter
    return np.where(union > 0, inter / np.maximum(union, 1e-12), 0).astype(np.float32)


def _ioa_with(a: np.ndarray, areas: np.ndarray, box: np.ndarray) -> np.ndarray:
    """Intersection of anchors ``a`` [..., 4] with one box, over each anchor's area ``areas``."""
    iw = np.clip(np.minimum(a[..., 2], box[2]) - np.maximum(a[..., 0], box[0]), 0, None)
    ih = np.clip(np.minimum(a[..., 3], box[3]) - np.maximum(a[..., 1], box[1]), 0, None)
    return np.where(areas > 0, iw * ih / np.maximum(areas, 1e-12), 0).astype(np.float32)


def classify_anchors(anchors: AnchorSet, gt_boxes: np.ndarray, is_crowd: np.ndarray, image_hw, *,
                     positive_thresh: float, negative_thresh: float, crowd_overlap_thresh: float):
    """Before sampling: ``(foreground mask [N], background mask [N], best box index [N])``."""
    h, w = image_hw
    b = anchors.boxes
    inside = (b[:, 0] >= 0) & (b[:, 1] >= 0) & (b[:, 2] <= w) & (b[:, 3] <= h)  # tensorpack's filter_boxes_inside_shape
    is_crowd = np.asarray(is_crowd, bool).reshape(-1)
    gt_boxes = np.asarray(gt_boxes, np.float32).reshape(-1, 4)
    boxes, crowd = gt_boxes[~is_crowd], gt_boxes[is_crowd]
    best_iou = np.zeros(len(anchors), np.float32)
    best_gt = np.zeros(len(anchors), np.int32)
    foreground = np.zeros(len(anchors), bool)
    for g, box in enumerate(boxes):
        blocks, top = [], 0.0
        for level, rows, cols in anchors.blocks(box):
            iou = _iou_with(anchors.grid(anchors.boxes, level)[rows, cols], anchors.grid(anchors.areas, level)[rows, cols], box)
            iou[~anchors.grid(inside, level)[rows, cols]] = 0  # outside anchors: never labelled, nobody's best
            best = anchors.grid(best_iou, level)[rows, cols]   # views: updates land in best_iou / best_gt
            better = iou > best
            best[better] = iou[better]
            anchors.grid(best_gt, level)[rows, cols][better] = g
            blocks.append((level, rows, cols, iou))
            top = max(top, float(iou.max()))
        if top > 0:  # every box's best anchors (ties included) are candidates, even below the threshold
            for level, rows, cols, iou in blocks:
                anchors.grid(foreground, level)[rows, cols] |= iou == top
    foreground |= inside & (best_iou >= positive_thresh)
    # below the negative threshold an anchor is background, even when it is a box's best
    background = inside & (best_iou < negative_thresh)
    foreground &= ~background
    # no box (only crowds): every inside anchor is background, crowds are not consulted (as tensorpack)
    if len(boxes) and len(crowd) and crowd_overlap_thresh <= 1.0:
        for box in crowd:  # a candidate mostly inside a crowd region is ambiguous: ignore it
            for level, rows, cols in anchors.blocks(box):
                covered = _ioa_with(anchors.grid(anchors.boxes, level)[rows, cols],
                                    anchors.grid(anchors.areas, level)[rows, cols], box) > crowd_overlap_thresh
                anchors.grid(background, level)[rows, cols] &= ~covered
                anchors.grid(foreground, level)[rows, cols] &= ~covered
    return foreground, background, best_gt


def sample_rpn_targets(anchors: AnchorSet, gt_boxes: np.ndarray, is_crowd: np.ndarray, image_hw, *,
                       rng: np.random.Generator, index_out: np.ndarray, labels_out: np.ndarray,
                       targets_out: np.ndarray, positive_thresh: float = 0.7, negative_thresh: float = 0.3,
                       batch_per_im: int = 256, fg_ratio: float = 0.5, crowd_overlap_thresh: float = 9.99) -> None:
    """Write one image's sampled anchors as rows, foreground first, then padding rows.

    ``index_out [K]``: each sampled anchor's position in the concatenation over levels;
    ``labels_out [K]``: 1 foreground, 0 background, -1 padding; ``targets_out [K, 4]``: the
    encoded box of a foreground anchor, 0 elsewhere. ``K >= batch_per_im``; every row is written
    (the buffers are reused). Only these rows cross to the graph, not a label per anchor: ~270k
    anchors an image at 800x1333 would be ~5 MB of labels and targets, for at most
    ``batch_per_im`` that count.
    """
    if len(index_out) < batch_per_im:
        raise ValueError(f"room for {len(index_out)} sampled anchors, RPN.BATCH_PER_IM is {batch_per_im}")
    foreground, background, best_gt = classify_anchors(
        anchors, gt_boxes, is_crowd, image_hw, positive_thresh=positive_thresh,
        negative_thresh=negative_thresh, crowd_overlap_thresh=crowd_overlap_thresh)
    fg = np.flatnonzero(foreground)
    max_fg = int(batch_per_im * fg_ratio)
    if len(fg) > max_fg:
        fg = np.sort(rng.choice(fg, max_fg, replace=False))
    bg = np.flatnonzero(background)
    max_bg = batch_per_im - len(fg)
    if len(bg) > max_bg:
        bg = np.sort(rng.choice(bg, max_bg, replace=False))
    nf, n = len(fg), len(fg) + len(bg)
    index_out[:nf] = fg
    index_out[nf:n] = bg
    index_out[n:] = 0
    labels_out[:nf] = 1
    labels_out[nf:n] = 0
    labels_out[n:] = -1
    targets_out[nf:] = 0
    if nf:
        boxes = np.asarray(gt_boxes, np.float32).reshape(-1, 4)[~np.asarray(is_crowd, bool).reshape(-1)]
        targets_out[:nf] = np_encode(boxes[best_gt[fg]], anchors.boxes[fg])
