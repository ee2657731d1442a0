"""RPN proposals' box decoding as tensorpack's ``decode_bbox_target`` (examples/FasterRCNN/modeling/model_box.py):
the log-size deltas are clipped at log(MAX_SIZE / 16)."""
import numpy as np


def test_proposals_grow_at_most_to_max_size(tf_session):
    """One 16x16 anchor centred at (700, 700) with a log-size delta of 10 (e^10 = 22026 times wider):
    clipped at log(1344 / 16), the box is 16 * 1344 / 16 = 1344 px wide before clipping to the image,
    so its left edge lands at 700 - 672 = 28 and its right edge at 1372, clipped to the image's 1400."""
    tf, sess = tf_session
    from training.config import new_config
    from training.model.rpn import generate_proposals
    cfg = new_config()
    cfg.PREPROC.MAX_SIZE = 1344
    anchors = np.array([[692, 692, 708, 708]], np.float32)
    boxes, _, counts = generate_proposals([tf.constant([[1.0]])], [tf.constant([[[0.0, 0.0, 10.0, 10.0]]])],
                                          [tf.constant(anchors)], tf.constant([[1400, 1400]]), cfg=cfg, training=False)
    boxes, counts = sess.run([boxes, counts])
    assert counts.tolist() == [1]
    np.testing.assert_allclose(boxes[0, :1], [[28, 28, 1372, 1372]], atol=1e-2)
