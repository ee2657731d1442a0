"""Mask head (Mask R-CNN): per-class mask logits for each ROI, its training targets, and pasting."""
from __future__ import annotations

import cv2
import numpy as np
from tensorpack.models import Conv2D, Conv2DTranspose
from tensorpack.tfutils.argscope import argscope

from training.compat import tf, tf1
from training.model import scopes
from training.data import packed_masks as packed_masks_lib
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


def mask_targets(packed_masks, mask_index, rois, *, size: int):
    """Soft ``[N, size, size]`` targets: each ROI's ground-truth mask sampled bilinearly at its bin centres.

    ``packed_masks``: ``[M, H, Wb]`` full-image masks of the batch, flattened over images, packed 8
    pixels a byte as the input pipeline feeds them (``training.data.packed_masks``; ``Wb`` a multiple
    of 4, as every padded width is a multiple of 32); ``mask_index``: ``[N]`` which of them each ROI
    matched. The targets are the bilinear samples themselves, not thresholded at 0.5: tensorpack's
    ``maskrcnn_loss`` trains on the soft values of its crop too. Samples beyond the first or last
    pixel centre read 0, as ``crop_and_resize`` does.

    Only the 4 neighbour pixels of each of the ``N x size x size`` samples are read, straight out
    of the packed bytes (seen as int32 words: GPU gathers have no uint8 kernel), so nothing of the
    full masks is unpacked or copied and every op has a GPU kernel.
    """
    with tf.name_scope(scopes.MASK_TARGETS):
        shape = tf.shape(packed_masks)
        words = tf.bitcast(tf.reshape(packed_masks, [shape[0], shape[1], shape[2] // 4, 4]), tf.int32)
        height, width = shape[1], shape[2] * packed_masks_lib.BITS
        x1, y1, x2, y2 = tf.unstack(tf.stop_gradient(rois), axis=1)
        centres = (tf.range(size, dtype=tf.float32) + 0.5) / size
        # sample positions in pixel-index coordinates (pixel k is centred at k + 0.5)
        ys = y1[:, None] + centres[None, :] * (y2 - y1)[:, None] - 0.5   # [N, S]
        xs = x1[:, None] + centres[None, :] * (x2 - x1)[:, None] - 0.5

        def corners(v, limit):
            inside = (v >= 0.0) & (v <= tf.cast(limit - 1, tf.float32))
            low = tf.floor(v)
            frac = v - low
            low = tf.clip_by_value(tf.cast(low, tf.int32), 0, limit - 1)
            return low, tf.minimum(low + 1, limit - 1), frac, inside

        y_lo, y_hi, fy, y_in = corners(ys, height)
        x_lo, x_hi, fx, x_in = corners(xs, width)
        n, s = tf.shape(rois)[0], size
        m = tf.broadcast_to(tf.cast(mask_index, tf.int32)[:, None, None], [n, s, s])

        def read(y, x):  # [N, S] rows, [N, S] columns -> [N, S, S] pixels of 0/1
            yy = tf.broadcast_to(y[:, :, None], [n, s, s])
            xx = tf.broadcast_to(x[:, None, :], [n, s, s])
            word = tf.gather_nd(words, tf.stack([m, yy, xx // 32], axis=-1))
            # byte k of a word holds pixels 8k..8k+7 of its 32 (little-endian), the first in the high bit
            shift = 8 * ((xx // 8) % 4) + 7 - xx % 8
            return tf.cast(tf.bitwise.bitwise_and(tf.bitwise.right_shift(word, shift), 1), tf.float32)

        fy3, fx3 = fy[:, :, None], fx[:, None, :]
        top = read(y_lo, x_lo) * (1.0 - fx3) + read(y_lo, x_hi) * fx3
        bottom = read(y_hi, x_lo) * (1.0 - fx3) + read(y_hi, x_hi) * fx3
        out = top * (1.0 - fy3) + bottom * fy3
        inside = tf.cast(y_in[:, :, None] & x_in[:, None, :], tf.float32)
        return tf.stop_gradient(out * inside)


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
