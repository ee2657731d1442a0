"""Mask head (Mask R-CNN): per-class mask logits for each ROI, its training targets, and pasting."""
from __future__ import annotations

import cv2
import numpy as np
from tensorpack.models import Conv2D, Conv2DTranspose
from tensorpack.tfutils.argscope import argscope

from training.compat import tf, tf1
from training.model import scopes
from training.model.backbone import group_norm


def mask_head(pooled, *, num_classes: int, head_dim: int, num_conv: int, use_gn: bool, gn_groups: int = 32):
    """``pooled`` NHWC ``[N, S, S, C]`` -> mask logits ``[N, num_classes, 2S, 2S]``."""
    with tf1.variable_scope("maskrcnn"), \
            argscope([Conv2D, Conv2DTranspose], data_format="channels_last",
                     kernel_initializer=tf1.variance_scaling_initializer(scale=2.0, distribution="untruncated_normal")):
        x = pooled
        for i in range(num_conv):
            x = Conv2D(f"fcn{i}", x, head_dim, 3, use_bias=not use_gn)
            if use_gn:
                with tf1.variable_scope(f"fcn{i}"):
                    x = group_norm("gn", x, groups=gn_groups, data_format="NHWC")
            x = tf.nn.relu(x)
        x = Conv2DTranspose("deconv", x, head_dim, 2, strides=2, activation=tf.nn.relu)
        x = Conv2D("conv", x, num_classes, 1, kernel_initializer=tf1.random_normal_initializer(stddev=0.001))
        return tf.transpose(x, [0, 3, 1, 2])


def mask_targets(gt_masks, mask_index, rois, *, size: int):
    """Binary ``[N, size, size]`` targets: each ROI's ground-truth mask sampled at its bin centres.

    ``gt_masks``: ``[M, H, W]`` full-image masks (uint8) of the batch, flattened over images;
    ``mask_index``: ``[N]`` which of them each ROI matched.

    ``crop_and_resize`` reads each ROI's window straight out of the uint8 masks (``box_indices``
    picks the mask), so no ``[N, H, W]`` copy is made: gathering a float32 full-image mask per
    ROI took ~0.45 GB per 128 ROIs at 800x1088, growing with image area x ROIs. Placed on the
    CPU, where the masks arrive from the input pipeline (GPU CropAndResize has no uint8 kernel):
    only the small ``[N, size, size]`` targets travel to the GPU.
    """
    with tf.device("/cpu:0"), tf.name_scope(scopes.MASK_TARGETS):
        masks = tf.expand_dims(gt_masks, -1)  # [M, H, W, 1], still uint8
        shape = tf.shape(masks)
        x1, y1, x2, y2 = tf.unstack(rois, axis=1)
        bw, bh = x2 - x1, y2 - y1
        ax = x1 + 0.5 * bw / size - 0.5
        ay = y1 + 0.5 * bh / size - 0.5
        wn = tf.maximum(tf.cast(shape[2], tf.float32) - 1.0, 1.0)
        hn = tf.maximum(tf.cast(shape[1], tf.float32) - 1.0, 1.0)
        boxes = tf.stack([ay / hn, ax / wn, (ay + (size - 1) * bh / size) / hn, (ax + (size - 1) * bw / size) / wn],
                         axis=1)
        out = tf.image.crop_and_resize(masks, tf.stop_gradient(boxes), tf.cast(mask_index, tf.int32), [size, size],
                                       method="bilinear")
        return tf.stop_gradient(tf.cast(out[..., 0] >= 0.5, tf.float32))


def paste_mask(box, mask: np.ndarray, height: int, width: int, threshold: float = 0.5,
               accurate: bool = True) -> np.ndarray:
    """Paste a soft ``[S, S]`` ROI mask into a ``height x width`` uint8 image mask at ``box`` (x1y1x2y2).

    ``accurate`` (MRCNN.ACCURATE_PASTE) samples the mask at the centre of every covered image pixel
    with sub-pixel box coordinates; otherwise the mask is resized to the box rounded to pixels.
    """
    out = np.zeros((height, width), np.uint8)
    x1, y1, x2, y2 = [float(v) for v in box]
    if not accurate:
        rx1, ry1 = int(round(x1)), int(round(y1))
        rx2, ry2 = max(int(round(x2)), rx1 + 1), max(int(round(y2)), ry1 + 1)
        resized = cv2.resize(mask.astype(np.float32), (rx2 - rx1, ry2 - ry1), interpolation=cv2.INTER_LINEAR)
        cx1, cy1, cx2, cy2 = max(rx1, 0), max(ry1, 0), min(rx2, width), min(ry2, height)
        if cx2 > cx1 and cy2 > cy1:
            out[cy1:cy2, cx1:cx2] = resized[cy1 - ry1:cy2 - ry1, cx1 - rx1:cx2 - rx1] >= threshold
        return out
    ix1, iy1 = max(int(np.floor(x1)), 0), max(int(np.floor(y1)), 0)
    ix2, iy2 = min(int(np.ceil(x2)), width), min(int(np.ceil(y2)), height)
    if ix2 <= ix1 or iy2 <= iy1:
        return out
    # sample the ROI mask at the centres of the covered image pixels (mask bin j covers
    # x1 + [j, j+1) * w / S), with bilinear interpolation through cv2.remap
    s = mask.shape[0]
    xs = (np.arange(ix1, ix2, dtype=np.float32) + 0.5 - x1) / max(x2 - x1, 1e-6) * s - 0.5
    ys = (np.arange(iy1, iy2, dtype=np.float32) + 0.5 - y1) / max(y2 - y1, 1e-6) * s - 0.5
    mx, my = np.meshgrid(xs, ys)
    sampled = cv2.remap(mask.astype(np.float32), mx, my, interpolation=cv2.INTER_LINEAR,
                        borderMode=cv2.BORDER_CONSTANT, borderValue=0.0)
    out[iy1:iy2, ix1:ix2] = (sampled >= threshold).astype(np.uint8)
    return out
