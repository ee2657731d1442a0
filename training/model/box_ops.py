"""Box arithmetic shared by the anchors, the RPN and the Fast R-CNN head.

Boxes are ``x1, y1, x2, y2`` in absolute pixels of the network input, with continuous
coordinates (pixel ``k`` spans ``[k, k + 1)``), so a box's width is ``x2 - x1``. Every function
has a NumPy form (input pipeline, tests, post-processing) and a TensorFlow form (the graph);
they compute the same thing and are tested against each other.
"""
from __future__ import annotations

import math

import numpy as np

from training.model import scopes

# Deltas larger than this are clipped before exp(): a box can grow at most 1000/16 = 62x.
BBOX_DECODE_CLIP = math.log(1000.0 / 16.0)


def decode_clip(max_size: float) -> float:
    """tensorpack's clip of the log-size deltas (``decode_bbox_target``): a box may grow to the
    image's longest side (PREPROC.MAX_SIZE) from the smallest anchor stride's 16 px,
    log(1344 / 16) = log(84) for the default FPN model."""
    return math.log(max_size / 16.0)


# ---------------------------------------------------------------------------------------------- NumPy
def np_area(boxes: np.ndarray) -> np.ndarray:
    return np.clip(boxes[:, 2] - boxes[:, 0], 0, None) * np.clip(boxes[:, 3] - boxes[:, 1], 0, None)


def np_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pairwise IoU, ``[N, 4] x [M, 4] -> [N, M]``; empty boxes give 0."""
    a = np.asarray(a, np.float32).reshape(-1, 4)
    b = np.asarray(b, np.float32).reshape(-1, 4)
    x1 = np.maximum(a[:, None, 0], b[None, :, 0])
    y1 = np.maximum(a[:, None, 1], b[None, :, 1])
    x2 = np.minimum(a[:, None, 2], b[None, :, 2])
    y2 = np.minimum(a[:, None, 3], b[None, :, 3])
    inter = np.clip(x2 - x1, 0, None) * np.clip(y2 - y1, 0, None)
    union = np_area(a)[:, None] + np_area(b)[None, :] - inter
    return np.where(union > 0, inter / np.maximum(union, 1e-12), 0.0).astype(np.float32)


def np_ioa(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pairwise intersection over the area of the second box, ``[N, 4] x [M, 4] -> [N, M]``
    (how much of each ``b`` lies inside each ``a``); an empty ``b`` gives 0."""
    a = np.asarray(a, np.float32).reshape(-1, 4)
    b = np.asarray(b, np.float32).reshape(-1, 4)
    iw = np.clip(np.minimum(a[:, None, 2], b[None, :, 2]) - np.maximum(a[:, None, 0], b[None, :, 0]), 0, None)
    ih = np.clip(np.minimum(a[:, None, 3], b[None, :, 3]) - np.maximum(a[:, None, 1], b[None, :, 1]), 0, None)
    area = np_area(b)[None, :]
    return np.where(area > 0, iw * ih / np.maximum(area, 1e-12), 0.0).astype(np.float32)


def _centers(b):
    w, h = b[:, 2] - b[:, 0], b[:, 3] - b[:, 1]
    return b[:, 0] + 0.5 * w, b[:, 1] + 0.5 * h, w, h


def _encode(ops, boxes, anchors, weights):
    """The one box-coding formula for both forms; ``ops`` is ``numpy`` or ``_TfOps``."""
    ax, ay, aw, ah = _centers(anchors)
    bx, by, bw, bh = _centers(boxes)
    wx, wy, ww, wh = weights
    return ops.stack([wx * (bx - ax) / aw, wy * (by - ay) / ah,
                      ww * ops.log(bw / aw), wh * ops.log(bh / ah)], axis=1)


def _decode(ops, deltas, anchors, weights, clip):
    ax, ay, aw, ah = _centers(anchors)
    wx, wy, ww, wh = weights
    dx, dy = deltas[:, 0] / wx, deltas[:, 1] / wy
    dw = ops.minimum(deltas[:, 2] / ww, clip)
    dh = ops.minimum(deltas[:, 3] / wh, clip)
    cx, cy = ax + dx * aw, ay + dy * ah
    w, h = aw * ops.exp(dw), ah * ops.exp(dh)
    return ops.stack([cx - 0.5 * w, cy - 0.5 * h, cx + 0.5 * w, cy + 0.5 * h], axis=1)


def np_encode(boxes: np.ndarray, anchors: np.ndarray, weights=(1.0, 1.0, 1.0, 1.0)) -> np.ndarray:
    """Regression targets ``(dx, dy, dw, dh)`` that turn ``anchors`` into ``boxes``."""
    return _encode(np, boxes, anchors, weights).astype(np.float32)


def np_decode(deltas: np.ndarray, anchors: np.ndarray, weights=(1.0, 1.0, 1.0, 1.0),
              clip: float = BBOX_DECODE_CLIP) -> np.ndarray:
    return _decode(np, deltas, anchors, weights, clip).astype(np.float32)


def np_clip(boxes: np.ndarray, height: float, width: float) -> np.ndarray:
    out = boxes.copy()
    out[:, [0, 2]] = np.clip(out[:, [0, 2]], 0, width)
    out[:, [1, 3]] = np.clip(out[:, [1, 3]], 0, height)
    return out


# ---------------------------------------------------------------------------------------------- TensorFlow
def _tf():
    from training.compat import tf
    return tf


def tf_area(boxes):
    tf = _tf()
    x1, y1, x2, y2 = tf.split(boxes, 4, axis=1)
    return tf.squeeze(tf.maximum(x2 - x1, 0.0) * tf.maximum(y2 - y1, 0.0), axis=1)


def tf_iou(a, b):
    """Pairwise IoU of ``[N, 4]`` and ``[M, 4]`` float32 tensors -> ``[N, M]``."""
    tf = _tf()
    ax1, ay1, ax2, ay2 = tf.split(a, 4, axis=1)
    bx1, by1, bx2, by2 = tf.split(b, 4, axis=1)
    iw = tf.maximum(tf.minimum(ax2, tf.transpose(bx2)) - tf.maximum(ax1, tf.transpose(bx1)), 0.0)
    ih = tf.maximum(tf.minimum(ay2, tf.transpose(by2)) - tf.maximum(ay1, tf.transpose(by1)), 0.0)
    inter = iw * ih
    union = tf.expand_dims(tf_area(a), 1) + tf.expand_dims(tf_area(b), 0) - inter
    return tf.where(union > 0, inter / tf.maximum(union, 1e-12), tf.zeros_like(inter))


class _TfOps:
    """The few ops the shared formulas need, under NumPy's names."""

    def __init__(self, tf):
        self.stack, self.log, self.exp, self.minimum = tf.stack, tf.math.log, tf.exp, tf.minimum


def tf_encode(boxes, anchors, weights=(1.0, 1.0, 1.0, 1.0)):
    tf = _tf()
    with tf.name_scope(scopes.BOX_ENCODE):
        return _encode(_TfOps(tf), boxes, anchors, weights)


def tf_decode(deltas, anchors, weights=(1.0, 1.0, 1.0, 1.0), clip: float = BBOX_DECODE_CLIP):
    tf = _tf()
    with tf.name_scope(scopes.BOX_DECODE):
        return _decode(_TfOps(tf), deltas, anchors, weights, clip)


def tf_clip(boxes, image_hw):
    """Clip boxes to their image: ``[N, 4]`` boxes to one image of ``image_hw = [height, width]``,
    or ``[B, K, 4]`` boxes to each image's ``image_hw [B, 2]`` (a float tensor)."""
    tf = _tf()
    h, w = image_hw[..., 0, None], image_hw[..., 1, None]
    x1 = tf.clip_by_value(boxes[..., 0], 0.0, w)
    y1 = tf.clip_by_value(boxes[..., 1], 0.0, h)
    x2 = tf.clip_by_value(boxes[..., 2], 0.0, w)
    y2 = tf.clip_by_value(boxes[..., 3], 0.0, h)
    return tf.stack([x1, y1, x2, y2], axis=-1)
