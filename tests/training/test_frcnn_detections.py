"""frcnn_head.detections against tensorpack's fastrcnn_predictions and decode_bbox_target, with
hand-derived boxes: the log-size clip follows PREPROC.MAX_SIZE, and boxes that clipping to the
image leaves without width are kept."""
import numpy as np
import pytest

from training.model import box_ops, frcnn_head


def _detect(tf, sess, rois, logits, deltas, image_hw, max_size):
    out = frcnn_head.detections(tf.constant(rois, tf.float32), tf.constant(logits, tf.float32),
                                tf.constant(deltas, tf.float32), tf.constant(image_hw, tf.int32),
                                weights=(1.0, 1.0, 1.0, 1.0), score_thresh=0.05, nms_thresh=0.5, max_dets=100,
                                decode_clip=box_ops.decode_clip(max_size))
    return sess.run(out)


def test_decode_clip_is_log_of_max_size_over_16(tf_session):
    tf, sess = tf_session
    assert box_ops.decode_clip(1344) == pytest.approx(np.log(84.0))
    # A 16 px ROI centred at (1000, 1000) asked to grow e^10 times: tensorpack clips the log-size
    # delta at log(1344 / 16), so it grows 84 times, to 1344 px: [1000 -/+ 672].
    rois = [[992, 992, 1008, 1008]]
    logits = [[0.0, 5.0]]
    deltas = [[[0.0, 0.0, 10.0, 10.0]]]
    boxes, scores, labels = _detect(tf, sess, rois, logits, deltas, [3000, 3000], max_size=1344)
    np.testing.assert_allclose(boxes, [[328, 328, 1672, 1672]], rtol=1e-6)
    assert labels.tolist() == [1]


def test_a_box_left_without_width_by_clipping_is_kept(tf_session):
    tf, sess = tf_session
    # A ROI right of a 10x10 image: clipped, x1 = x2 = 10. tensorpack keeps it (it filters by
    # score alone); so does this model, in its place by score.
    rois = [[12, 2, 14, 6], [1, 1, 5, 5]]
    logits = [[0.0, 4.0], [0.0, 2.0]]
    deltas = np.zeros((2, 1, 4))
    boxes, scores, labels = _detect(tf, sess, rois, logits, deltas, [10, 10], max_size=1344)
    np.testing.assert_allclose(boxes, [[10, 2, 10, 6], [1, 1, 5, 5]])
    np.testing.assert_allclose(scores, [1 / (1 + np.exp(-4.0)), 1 / (1 + np.exp(-2.0))], rtol=1e-6)
