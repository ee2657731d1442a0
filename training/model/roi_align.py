"""ROIAlign (He et al., 2017) on top of ``tf.image.crop_and_resize``.

Each output bin averages 2x2 bilinear samples placed at the centres of its four sub-bins, with
no rounding of the box. Feature cell ``i`` of a map with stride ``s`` is centred at image
coordinate ``(i + 0.5) * s`` (see anchors.py), which fixes the mapping from image boxes to the
normalised coordinates that crop_and_resize samples at.

As in tensorpack's ``crop_and_resize(pad_border=True)`` (examples/FasterRCNN/modeling/model_box.py),
samples up to one cell outside the first and last cell centres (where a box reaching the image
border puts its outer samples) read the edge cells rather than fading to zero: the map is padded by
one edge-replicated cell on each side before sampling. Samples further out (boxes past the image)
read zero.
"""
from __future__ import annotations

import math

from training.compat import tf
from training.model import scopes


# one edge-replicated cell on each side of the feature map (tensorpack's pad_border)
BORDER = 1


def _pad_border(features):
    """``[B, H, W, C]`` -> ``[B, H + 2, W + 2, C]``; with a pad of one, SYMMETRIC repeats the edge cell."""
    return tf.pad(features, [[0, 0], [BORDER, BORDER], [BORDER, BORDER], [0, 0]], mode="SYMMETRIC")


def _sampling_boxes(boxes, stride: float, samples: int, padded_h, padded_w):
    """Normalised crop_and_resize boxes on the border-padded map whose ``samples x samples`` grid
    hits the sub-bin centres."""
    with tf.name_scope(scopes.ROI_BOXES):
        x1, y1, x2, y2 = tf.unstack(boxes, axis=1)
        bw, bh = x2 - x1, y2 - y1
        # first sample centre and spacing, in index coordinates of the padded map
        # (cell k of the unpadded map is centred at image (k + 0.5) * stride and is padded cell k + 1)
        ax = (x1 + 0.5 * bw / samples) / stride - 0.5 + BORDER
        ay = (y1 + 0.5 * bh / samples) / stride - 0.5 + BORDER
        dx = bw / (samples * stride)
        dy = bh / (samples * stride)
        # crop_and_resize maps normalised 0..1 to index 0..size-1 (size >= 3 after padding)
        wn = tf.cast(padded_w, tf.float32) - 1.0
        hn = tf.cast(padded_h, tf.float32) - 1.0
        return tf.stack([ay / hn, ax / wn, (ay + (samples - 1) * dy) / hn, (ax + (samples - 1) * dx) / wn], axis=1)


def roi_align(features, boxes, box_indices, *, stride: float, output_size: int):
    """``features`` NHWC ``[B, H, W, C]``; ``boxes`` ``[N, 4]`` in image pixels; ``box_indices`` ``[N]``.

    Returns ``[N, output_size, output_size, C]``.
    """
    padded = _pad_border(features)
    shape = tf.shape(padded)
    crop = 2 * output_size
    norm_boxes = tf.stop_gradient(_sampling_boxes(boxes, stride, crop, shape[1], shape[2]))
    # samples outside the padded map (boxes past the image) read 0, as in tensorpack
    sampled = tf.image.crop_and_resize(padded, norm_boxes, tf.cast(box_indices, tf.int32), [crop, crop],
                                       method="bilinear", extrapolation_value=0.0)
    return tf.nn.avg_pool2d(sampled, 2, 2, padding="VALID")


def fpn_level_of(boxes, *, canonical_size: float, num_levels: int = 4):
    """FPN paper eq. 1: level ``k = 4 + log2(sqrt(area) / canonical)``, as 0..num_levels-1 for P2.."""
    with tf.name_scope(scopes.ROI_BOXES):
        area = tf.maximum((boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1]), 1e-6)
        k = tf.floor(4.0 + tf.math.log(tf.sqrt(area) / canonical_size + 1e-6) / math.log(2.0))
        return tf.cast(tf.clip_by_value(k, 2.0, 1.0 + num_levels), tf.int32) - 2


def multilevel_roi_align(features, boxes, box_indices, *, output_size: int, canonical_size: float,
                         strides=(4, 8, 16, 32)):
    """ROIAlign each box on the FPN level its size selects; output in the order of ``boxes``."""
    levels = fpn_level_of(boxes, canonical_size=canonical_size, num_levels=len(features))
    # one stable sort groups the boxes by level and one split cuts the groups (a single count read
    # on the host), instead of a tf.where per level (a wait for the GPU each)
    order = tf.argsort(levels, stable=True)
    counts = tf.reduce_sum(tf.cast(tf.equal(levels[None, :], tf.range(len(features))[:, None]), tf.int32), axis=1)
    grouped_boxes = tf.split(tf.gather(boxes, order), counts, num=len(features))
    grouped_indices = tf.split(tf.gather(box_indices, order), counts, num=len(features))
    pooled = [roi_align(feat, b, i, stride=stride, output_size=output_size)
              for feat, stride, b, i in zip(features, strides, grouped_boxes, grouped_indices)]
    # undo the grouping by level
    return tf.gather(tf.concat(pooled, axis=0), tf.math.invert_permutation(order))
