"""Instance masks packed 8 pixels to a byte: the form the input pipeline queues and feeds.

Full-resolution masks are the bulk of a Mask R-CNN batch: at COCO scale (800x1344 padded, up to
~90 instances an image) a batch of 4 holds up to ~390 MB of one-byte-per-pixel masks, in every
queued batch on every rank. Packed along the width (``np.packbits``, first pixel in the most
significant bit) they take an eighth of that, on the host and over the host-to-device copy; the
graph unpacks them (:func:`tf_unpack`). Padded widths are multiples of 32, so a packed row is a
whole number of bytes and an image's packed rows are a prefix of the batch's.
"""
from __future__ import annotations

import numpy as np

BITS = 8
_SHIFTS = np.arange(BITS - 1, -1, -1, dtype=np.uint8)  # 7..0: the first pixel is the high bit


def pack(masks: np.ndarray) -> np.ndarray:
    """``[..., W]`` 0/1 masks -> ``[..., ceil(W / 8)]`` uint8."""
    return np.packbits(np.asarray(masks, np.uint8) != 0, axis=-1)


def unpack(packed: np.ndarray, width: int | None = None) -> np.ndarray:
    """NumPy inverse of :func:`pack` (``width`` trims the zero bits of a partial last byte)."""
    masks = np.unpackbits(np.asarray(packed, np.uint8), axis=-1)
    return masks if width is None else masks[..., :width]


def tf_unpack(packed):
    """TensorFlow form of :func:`unpack`: ``[..., Wb]`` uint8 -> ``[..., 8 * Wb]`` uint8 of 0/1."""
    from training.compat import tf
    bits = tf.bitwise.bitwise_and(tf.bitwise.right_shift(packed[..., None], tf.constant(_SHIFTS)), 1)
    shape = tf.concat([tf.shape(packed)[:-1], [tf.shape(packed)[-1] * BITS]], axis=0)
    return tf.reshape(bits, shape)
