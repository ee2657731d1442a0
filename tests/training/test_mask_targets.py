"""Mask targets (ground truth sampled inside each ROI) and pasting predicted masks back, the
latter against tensorpack's eval.py ``_paste_mask`` written here with SciPy and OpenCV."""
import cv2
import numpy as np
import pytest
from scipy.interpolate import RegularGridInterpolator

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


def tensorpack_accurate_paste(box, mask, height, width):
    """tensorpack's ACCURATE_PASTE: the mask padded with one zero bin each side, the box grown by
    (S + 2) / S about its centre, the padded mask's bin k centred at k + 0.5, sampled linearly
    (zero beyond the padded mask) at every pixel centre, kept where >= 0.5."""
    size = mask.shape[0]
    padded = np.pad(mask.astype(np.float64), 1)
    x1, y1, x2, y2 = [float(v) for v in box]
    grow = (size + 2) / size
    cx, cy, hw, hh = (x1 + x2) / 2, (y1 + y2) / 2, (x2 - x1) / 2 * grow, (y2 - y1) / 2 * grow
    x1, x2, y1, y2 = cx - hw, cx + hw, cy - hh, cy + hh
    centres = np.arange(size + 2) + 0.5
    sample = RegularGridInterpolator((centres, centres), padded, method="linear", bounds_error=False, fill_value=0.0)
    if x2 <= x1 or y2 <= y1:    # tensorpack divides by zero here; no pixel is in such a box
        return np.zeros((height, width), np.uint8)
    ys = (np.arange(height) + 0.5 - y1) / (y2 - y1) * (size + 2)
    xs = (np.arange(width) + 0.5 - x1) / (x2 - x1) * (size + 2)
    grid_y, grid_x = np.meshgrid(ys, xs, indexing="ij")
    return (sample(np.stack([grid_y, grid_x], -1)) >= 0.5).astype(np.uint8)


def tensorpack_fast_paste(box, mask, height, width):
    """tensorpack's fast paste: the box rounded to whole pixels with int(), the mask cv2.resize'd to
    it, kept where > 0.5 (clipped to the image here; tensorpack's slice assignment assumes it fits)."""
    x0, y0 = int(box[0] + 0.5), int(box[1] + 0.5)
    x1, y1 = max(x0, int(box[2] - 0.5)), max(y0, int(box[3] - 0.5))
    resized = (cv2.resize(mask.astype(np.float32), (x1 + 1 - x0, y1 + 1 - y0)) > 0.5).astype(np.uint8)
    out = np.zeros((height + 64, width + 64), np.uint8)    # room for a box past the image
    out[y0:y1 + 1, x0:x1 + 1] = resized
    return out[:height, :width]


def _random_cases(count, height, width, size, seed=0):
    rng = np.random.default_rng(seed)
    xy = rng.uniform(-10, 95, (count, 2))
    boxes = np.concatenate([xy, xy + rng.uniform(0.3, 50, (count, 2))], 1).astype(np.float32)
    boxes[:, [0, 2]] = boxes[:, [0, 2]].clip(0, width)
    boxes[:, [1, 3]] = boxes[:, [1, 3]].clip(0, height)
    grid = np.arange(size)
    masks = np.stack([1 / (1 + np.exp(-3 * (np.add.outer(np.sin(grid / (2 + i % 5)), np.cos(grid / (1.5 + i % 7))))))
                      for i in range(count)]).astype(np.float32)
    return boxes, masks


@pytest.mark.parametrize("accurate, reference", [(True, tensorpack_accurate_paste), (False, tensorpack_fast_paste)])
def test_pasting_is_tensorpacks(accurate, reference):
    height, width = 70, 90
    boxes, masks = _random_cases(40, height, width, 28)
    got = np.stack([paste_mask(b, m, height, width, accurate=accurate) for b, m in zip(boxes, masks)])
    want = np.stack([reference(b, m, height, width) for b, m in zip(boxes, masks)])
    assert want.sum() > 5000
    mismatched = [i for i in range(len(boxes)) if (got[i] != want[i]).any()]
    assert not mismatched, [(boxes[i].tolist(), int((got[i] != want[i]).sum())) for i in mismatched]


def test_a_box_without_width_pastes_no_pixel():
    ones = np.ones((28, 28), np.float32)
    assert not paste_mask([3.4, 2, 3.4, 8], ones, 10, 10).any()
    assert not paste_mask([2, 5, 8, 5], ones, 10, 10).any()
    assert paste_mask([2, 5, 8, 5.5], ones, 10, 10).sum() == 6     # half a pixel high: row 5's centres are in
