"""Mask targets (ground truth sampled inside each ROI) and pasting predicted masks back."""
import numpy as np
import pytest

from training.data.packed_masks import pack
from training.model.mask_head import mask_targets, paste_mask


def _targets(tf, sess, masks, index, rois, size):
    """mask_targets as the model calls it: on the packed masks the pipeline feeds."""
    return sess.run(mask_targets(tf.constant(pack(masks)), tf.constant(index), tf.constant(rois, tf.float32), size=size))


def test_mask_targets_sample_the_box_interior(tf_session):
    tf, sess = tf_session
    masks = np.zeros((2, 40, 64), np.uint8)  # padded widths are multiples of 32
    masks[0, 10:30, 10:30] = 1          # a 20x20 square
    masks[1, 0:40, 0:20] = 1            # left half of the image
    rois = np.array([[10, 10, 30, 30],   # exactly the square -> all ones
                     [0, 0, 40, 40],     # whole image on mask 1 -> left half ones
                     [30, 30, 40, 40]],  # outside the square -> zeros
                    np.float32)
    out = _targets(tf, sess, masks, [0, 1, 0], rois, 8)
    assert out.shape == (3, 8, 8)
    np.testing.assert_array_equal(out[0], np.ones((8, 8)))
    expected = np.zeros((8, 8))
    expected[:, :4] = 1
    np.testing.assert_array_equal(out[1], expected)
    np.testing.assert_array_equal(out[2], np.zeros((8, 8)))


def test_mask_targets_shift_with_the_box(tf_session):
    tf, sess = tf_session
    masks = np.zeros((1, 32, 32), np.uint8)
    masks[0, 8:16, 8:24] = 1
    out = _targets(tf, sess, masks, [0], [[8.0, 8.0, 24.0, 24.0]], 4)
    np.testing.assert_array_equal(out[0], [[1, 1, 1, 1], [1, 1, 1, 1], [0, 0, 0, 0], [0, 0, 0, 0]])


def test_mask_targets_are_the_soft_bilinear_crop(tf_session):
    """tensorpack trains on crop_and_resize's soft values (no 0.5 threshold): the targets read from
    the packed bits equal TensorFlow's bilinear crop_and_resize of the unpacked masks, whose sample
    grid puts sample (i, j) at the centre of bin (i, j) of the box."""
    tf, sess = tf_session
    rng = np.random.default_rng(0)
    masks = (rng.random((3, 37, 96)) < 0.5).astype(np.uint8)
    masks[1, 5:30, 10:70] = 1
    size = 7
    x1, y1 = rng.uniform(-10, 60, 20), rng.uniform(-10, 25, 20)
    rois = np.stack([x1, y1, x1 + rng.uniform(1, 40, 20), y1 + rng.uniform(1, 20, 20)], 1).astype(np.float32)
    index = rng.integers(0, 3, 20).astype(np.int32)
    out = _targets(tf, sess, masks, index, rois, size)
    h, w = masks.shape[1:]
    bw, bh = rois[:, 2] - rois[:, 0], rois[:, 3] - rois[:, 1]
    first_x = rois[:, 0] + 0.5 * bw / size - 0.5
    first_y = rois[:, 1] + 0.5 * bh / size - 0.5
    last_x, last_y = first_x + (size - 1) * bw / size, first_y + (size - 1) * bh / size
    boxes = np.stack([first_y / (h - 1), first_x / (w - 1), last_y / (h - 1), last_x / (w - 1)], 1)
    ref = sess.run(tf.image.crop_and_resize(masks[..., None].astype(np.float32), boxes, index, [size, size]))[..., 0]
    np.testing.assert_allclose(out, ref, atol=1e-5)
    assert ((out > 0.01) & (out < 0.99)).any()  # soft values at mask edges, not a thresholded 0/1


def test_mask_targets_run_on_gpu_kernels_and_unpack_nothing(tf_session):
    """No op pinned to the CPU, no crop of whole masks: only the sampled pixels are read."""
    tf, sess = tf_session
    packed = tf.compat.v1.placeholder(tf.uint8, [None, None, None], "gt_masks")
    mask_targets(packed, tf.constant([0, 1]), tf.constant([[0., 0., 8., 8.]] * 2), size=4)
    ops = tf.compat.v1.get_default_graph().get_operations()
    assert not [op.name for op in ops if "CPU" in op.device.upper()]
    assert not [op.type for op in ops if op.type in ("CropAndResize", "RandomShuffle")]


@pytest.mark.parametrize("accurate", [True, False])
def test_paste_mask_round_trip(accurate):
    roi_mask = np.zeros((14, 14), np.float32)
    roi_mask[:, :7] = 1.0               # left half of the box
    pasted = paste_mask([10, 20, 38, 48], roi_mask, 60, 50, accurate=accurate)
    assert pasted.shape == (60, 50) and pasted.dtype == np.uint8
    assert pasted[20:48, 10:23].all() and not pasted[20:48, 25:38].any()
    assert not pasted[:20].any() and not pasted[48:].any()


@pytest.mark.parametrize("accurate", [True, False])
def test_paste_mask_clips_to_image(accurate):
    pasted = paste_mask([-5, -5, 10, 10], np.ones((7, 7), np.float32), 8, 8, accurate=accurate)
    assert pasted.shape == (8, 8)
    assert pasted[:8, :8].all()
