"""Box encode/decode round trip, IoU and clipping, NumPy and TensorFlow forms."""
import numpy as np
import pytest

from training.model import box_ops


def _random_boxes(rng, n, size=200.0):
    xy = rng.uniform(0, size, (n, 2))
    wh = rng.uniform(2, size / 2, (n, 2))
    return np.concatenate([xy, xy + wh], axis=1).astype(np.float32)


@pytest.mark.parametrize("weights", [(1.0, 1.0, 1.0, 1.0), (10.0, 10.0, 5.0, 5.0)])
def test_encode_decode_round_trip_numpy(weights):
    rng = np.random.default_rng(0)
    boxes, anchors = _random_boxes(rng, 50), _random_boxes(rng, 50)
    deltas = box_ops.np_encode(boxes, anchors, weights)
    np.testing.assert_allclose(box_ops.np_decode(deltas, anchors, weights), boxes, rtol=1e-4, atol=1e-3)


def test_tf_matches_numpy(tf_session):
    tf, sess = tf_session
    rng = np.random.default_rng(1)
    boxes, anchors = _random_boxes(rng, 20), _random_boxes(rng, 20)
    w = (10.0, 10.0, 5.0, 5.0)
    enc, dec, iou, clip = sess.run([
        box_ops.tf_encode(tf.constant(boxes), tf.constant(anchors), w),
        box_ops.tf_decode(tf.constant(box_ops.np_encode(boxes, anchors, w)), tf.constant(anchors), w),
        box_ops.tf_iou(tf.constant(boxes), tf.constant(anchors)),
        box_ops.tf_clip(tf.constant(boxes), tf.constant([100.0, 150.0])),
    ])
    np.testing.assert_allclose(enc, box_ops.np_encode(boxes, anchors, w), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dec, boxes, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(iou, box_ops.np_iou(boxes, anchors), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(clip, box_ops.np_clip(boxes, 100.0, 150.0))


def test_iou_known_values():
    a = np.array([[0, 0, 10, 10]], np.float32)
    b = np.array([[0, 0, 10, 10], [5, 0, 15, 10], [20, 20, 30, 30], [0, 0, 0, 0]], np.float32)
    np.testing.assert_allclose(box_ops.np_iou(a, b), [[1.0, 50 / 150, 0.0, 0.0]], rtol=1e-6)


def test_decode_clips_huge_deltas():
    anchors = np.array([[0, 0, 16, 16]], np.float32)
    out = box_ops.np_decode(np.array([[0, 0, 100, 100]], np.float32), anchors)
    assert np.all(np.isfinite(out))
    assert out[0, 2] - out[0, 0] == pytest.approx(1000.0, rel=1e-4)  # 16 * 1000/16


def test_encode_known_values(tf_session):
    """By hand, tensorpack's encode_bbox_target convention (x1y1x2y2, width x2 - x1, no +1):
    anchor (0, 0, 10, 10) has centre (5, 5) and size 10; box (0, 0, 20, 20) centre (10, 10), size 20.
    With weights (10, 10, 5, 5): dx = dy = 10 * (10 - 5) / 10 = 5, dw = dh = 5 * ln(20 / 10) = 3.4657."""
    tf, sess = tf_session
    box = np.array([[0, 0, 20, 20]], np.float32)
    anchor = np.array([[0, 0, 10, 10]], np.float32)
    weights = (10.0, 10.0, 5.0, 5.0)
    expected = [[5.0, 5.0, 3.4657, 3.4657]]
    np.testing.assert_allclose(box_ops.np_encode(box, anchor, weights), expected, atol=1e-4)
    np.testing.assert_allclose(sess.run(box_ops.tf_encode(tf.constant(box), tf.constant(anchor), weights)),
                               expected, atol=1e-4)
