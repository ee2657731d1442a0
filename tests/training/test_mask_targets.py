"""Mask targets (ground truth sampled inside each ROI) and pasting predicted masks back."""
import numpy as np
import pytest

from training.model.mask_head import mask_targets, paste_mask


def test_mask_targets_sample_the_box_interior(tf_session):
    tf, sess = tf_session
    masks = np.zeros((2, 40, 40), np.uint8)
    masks[0, 10:30, 10:30] = 1          # a 20x20 square
    masks[1, 0:40, 0:20] = 1            # left half of the image
    rois = np.array([[10, 10, 30, 30],   # exactly the square -> all ones
                     [0, 0, 40, 40],     # whole image on mask 1 -> left half ones
                     [30, 30, 40, 40]],  # outside the square -> zeros
                    np.float32)
    out = sess.run(mask_targets(tf.constant(masks), tf.constant([0, 1, 0]), tf.constant(rois), size=8))
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
    out = sess.run(mask_targets(tf.constant(masks), tf.constant([0]), tf.constant([[8.0, 8.0, 24.0, 24.0]]), size=4))
    np.testing.assert_array_equal(out[0], [[1, 1, 1, 1], [1, 1, 1, 1], [0, 0, 0, 0], [0, 0, 0, 0]])


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
