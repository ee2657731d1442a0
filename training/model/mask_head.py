"""Mask head (Mask R-CNN): per-class mask logits for each ROI, its training targets, and pasting."""
from __future__ import annotations

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


def paste_masks_graph(boxes, masks, height, width, *, accurate: bool, threshold: float = 0.5):
    """Paste soft ``[N, S, S]`` ROI masks into ``height x width`` uint8 masks at ``boxes`` [N, 4]
    (x1y1x2y2 in the image's pixels): ``[N, height, width]`` of 0/1, as tensorpack's eval.py
    ``_paste_mask`` defines it, with exact bilinear interpolation in float64.

    ``accurate`` (MRCNN.ACCURATE_PASTE): the mask, padded with a border of zeros, is sampled at
    the centre of every image pixel, mask bin j spanning ``x1 + [j, j + 1) * (x2 - x1) / S``;
    pixels scoring at least ``threshold`` are in. A box without width or height covers no pixel.
    Otherwise (tensorpack's fast path, after Detectron): the box is rounded to whole pixels
    (``int(x1 + 0.5)`` to ``int(x2 - 0.5)`` inclusive, at least one), the mask resized to it as
    cv2.resize's INTER_LINEAR does (half-pixel centres, edges clamped), pixels above
    ``threshold`` in.

    Built on the CPU: ``maskrcnn predict`` (:class:`MaskPaster`) and the exported model, on any
    device, run these very ops and get the same bits. Bilinear sampling on a grid is separable:
    each mask is ``rows [h, S] @ mask [S, S] @ cols [w, S]^T`` over the ``h x w`` pixels its box
    can reach, padded to the image.
    """
    size = int(masks.shape[-1])
    with tf.device("/cpu:0"), tf.name_scope("paste_masks"):
        height = tf.cast(height, tf.int32)
        width = tf.cast(width, tf.int32)

        def axis(lo, hi, extent):
            """(first pixel, pixel count, [count, S] interpolation weights) along one axis."""
            extent_f = tf.cast(extent, tf.float64)
            if accurate:
                span = hi - lo
                valid = span > 0
                span = tf.where(valid, span, tf.ones_like(span))
                # a pixel's sample is non-zero only within one mask bin of the box
                first = tf.clip_by_value(tf.floor(lo - span / size), 0.0, extent_f)
                end = tf.clip_by_value(tf.math.ceil(hi + span / size), first, extent_f)
                end = tf.where(valid, end, first)
                pixels = tf.range(first, end, dtype=tf.float64)
                coords = (pixels + 0.5 - lo) / span * size - 0.5
                weights = _interpolation_matrix(coords, size, clamp=False)
            else:
                # Python's int() truncates toward zero
                start = _trunc(lo + 0.5)
                last = tf.maximum(start, _trunc(hi - 0.5))
                count = last + 1 - start
                first = tf.clip_by_value(start, 0.0, extent_f)
                end = tf.clip_by_value(last + 1, first, extent_f)
                pixels = tf.range(first, end, dtype=tf.float64)
                coords = (pixels - start + 0.5) * (size / count) - 0.5
                weights = _interpolation_matrix(coords, size, clamp=True)
            return tf.cast(first, tf.int32), tf.cast(end - first, tf.int32), weights

        def one(args):
            box, mask = args
            box = tf.cast(box, tf.float64)
            col0, ncols, cols = axis(box[0], box[2], width)
            row0, nrows, rows = axis(box[1], box[3], height)
            sampled = tf.matmul(tf.matmul(rows, tf.cast(mask, tf.float64)), cols, transpose_b=True)
            inside = sampled >= threshold if accurate else sampled > threshold
            pasted = tf.cast(inside, tf.uint8)
            return tf.pad(pasted, [[row0, height - row0 - nrows], [col0, width - col0 - ncols]])

        def pasted():
            out = tf.map_fn(one, (boxes, masks), fn_output_signature=tf.TensorSpec([None, None], tf.uint8))
            return tf.reshape(out, tf.stack([tf.shape(boxes)[0], height, width]))

        # map_fn cannot stack zero masks of a shape known only at run time
        return tf.cond(tf.shape(boxes)[0] > 0, pasted, lambda: tf.zeros(tf.stack([0, height, width]), tf.uint8))


def _trunc(x):
    return tf.where(x < 0, tf.math.ceil(x), tf.floor(x))


def _interpolation_matrix(coords, size: int, *, clamp: bool):
    """``[L, size]`` weights that sample a length-``size`` signal at ``coords`` [L] linearly: row i
    has 1 - f at floor(c) and f at floor(c) + 1. Outside the signal the weight is dropped (a zero
    border: tensorpack pads the mask with zeros), or with ``clamp`` the position is clamped (cv2.resize)."""
    if clamp:
        coords = tf.clip_by_value(coords, 0.0, float(size - 1))
    left = tf.floor(coords)
    frac = (coords - left)[:, None]
    left = tf.cast(left, tf.int32)
    # one_hot of an index outside [0, size) is a zero row: exactly the dropped border sample
    return (tf.one_hot(left, size, dtype=tf.float64) * (1.0 - frac)
            + tf.one_hot(left + 1, size, dtype=tf.float64) * frac)


class MaskPaster:
    """:func:`paste_masks_graph` for NumPy arrays, in a CPU session of its own (it creates no GPU
    device, so it can run inside a training process): what ``maskrcnn predict`` and the in-training
    evaluation paste with."""

    def __init__(self, mask_size: int, *, accurate: bool, threshold: float = 0.5):
        from training.collectives import cpu_only_session_config
        self.graph = tf.Graph()
        with self.graph.as_default():
            self.boxes = tf1.placeholder(tf.float32, [None, 4])
            self.masks = tf1.placeholder(tf.float32, [None, mask_size, mask_size])
            self.hw = tf1.placeholder(tf.int32, [2])
            self.pasted = paste_masks_graph(self.boxes, self.masks, self.hw[0], self.hw[1], accurate=accurate,
                                            threshold=threshold)
        self.session = tf1.Session(graph=self.graph, config=cpu_only_session_config())

    def __call__(self, boxes, masks, height: int, width: int) -> np.ndarray:
        return self.session.run(self.pasted, {self.boxes: np.asarray(boxes, np.float32).reshape(-1, 4),
                                              self.masks: np.asarray(masks, np.float32), self.hw: [height, width]})


_PASTERS: dict = {}


def mask_paster(mask_size: int, *, accurate: bool, threshold: float = 0.5) -> MaskPaster:
    """One :class:`MaskPaster` per setting for the process (its graph is built once)."""
    key = (mask_size, accurate, threshold)
    if key not in _PASTERS:
        _PASTERS[key] = MaskPaster(mask_size, accurate=accurate, threshold=threshold)
    return _PASTERS[key]


def paste_mask(box, mask: np.ndarray, height: int, width: int, threshold: float = 0.5,
               accurate: bool = True) -> np.ndarray:
    """One soft ``[S, S]`` mask pasted at ``box`` into a ``height x width`` uint8 mask (:func:`paste_masks_graph`)."""
    mask = np.asarray(mask, np.float32)
    return mask_paster(mask.shape[0], accurate=accurate, threshold=threshold)([box], mask[None], height, width)[0]
