"""Anchors: layout, NumPy/TensorFlow agreement, and the RPN's training targets."""
import numpy as np

from training.model import anchors as A
from training.model.box_ops import np_decode, np_iou


def test_grid_anchor_layout_and_centres():
    anc = A.grid_anchors(8, (32,), (0.5, 1.0, 2.0), 3, 4)
    assert anc.shape == (3 * 4 * 3, 4)
    grid = anc.reshape(3, 4, 3, 4)
    centres = 0.5 * (grid[..., :2] + grid[..., 2:])
    # tensorpack's get_all_anchors: cell (row 1, column 2) of stride 8 is centred at x = 2 * 8, y = 1 * 8
    np.testing.assert_allclose(centres[1, 2, 0], [16.0, 8.0])
    np.testing.assert_allclose(grid[0, 0, 1], [-16.0, -16.0, 16.0, 16.0])  # ratio 1 at the origin
    # every ratio keeps the area size**2; ratio = height / width
    w = grid[0, 0, :, 2] - grid[0, 0, :, 0]
    h = grid[0, 0, :, 3] - grid[0, 0, :, 1]
    np.testing.assert_allclose(w * h, 32 * 32, rtol=1e-5)
    np.testing.assert_allclose(h / w, [0.5, 1.0, 2.0], rtol=1e-5)


def test_tf_anchors_match_numpy(tf_session):
    tf, sess = tf_session
    out = sess.run(A.tf_grid_anchors(16, (64, 128), (1.0, 2.0), tf.constant(5), tf.constant(3)))
    np.testing.assert_allclose(out, A.grid_anchors(16, (64, 128), (1.0, 2.0), 5, 3), rtol=1e-6)


def test_rpn_targets_label_best_anchor_and_encode_box():
    anc = A.grid_anchors(8, (16, 32), (1.0,), 8, 8)
    gt = np.array([[20, 20, 52, 52], [0, 0, 10, 10]], np.float32)
    labels, targets = A.rpn_targets(anc, gt, np.zeros(2, bool), (64, 64), rng=np.random.default_rng(0),
                                    batch_per_im=64, fg_ratio=0.5)
    iou = np_iou(anc, gt)
    fg = labels == 1
    assert fg.any()
    for g in range(len(gt)):  # each box's best anchor is foreground
        assert labels[iou[:, g].argmax()] == 1
    assert np.all(iou.max(axis=1)[labels == 0] < 0.3)
    assert (labels >= 0).sum() <= 64 and fg.sum() <= 32
    # foreground targets decode back to their box
    decoded = np_decode(targets[fg], anc[fg])
    matched = gt[iou[fg].argmax(axis=1)]
    np.testing.assert_allclose(decoded, matched, atol=1e-3)
    assert np.all(targets[~fg] == 0)


def test_rpn_targets_ignore_anchors_outside_image_and_crowds():
    anc = A.grid_anchors(8, (16,), (1.0,), 8, 8)  # covers a 64x64 padded input
    labels, _ = A.rpn_targets(anc, np.array([[4, 4, 20, 20]], np.float32), np.zeros(1, bool), (32, 32),
                              rng=np.random.default_rng(0), batch_per_im=1000)
    centres = 0.5 * (anc[:, :2] + anc[:, 2:])
    outside = (centres[:, 0] >= 32) | (centres[:, 1] >= 32)
    assert np.all(labels[outside] == -1)
    low = np_iou(anc, np.array([[4, 4, 20, 20]], np.float32))[:, 0] < 0.3
    assert np.all(labels[~outside & low] == 0)
    # a crowd box is never a foreground target
    labels, _ = A.rpn_targets(anc, np.array([[4, 4, 20, 20]], np.float32), np.ones(1, bool), (64, 64),
                              rng=np.random.default_rng(0))
    assert not np.any(labels == 1)


def test_sampling_caps_and_is_deterministic():
    anc = A.grid_anchors(4, (16,), (0.5, 1.0, 2.0), 32, 32)
    gt = np.array([[10, 10, 60, 60], [70, 70, 120, 120]], np.float32)
    a = A.rpn_targets(anc, gt, np.zeros(2, bool), (128, 128), rng=np.random.default_rng(3), batch_per_im=32)
    b = A.rpn_targets(anc, gt, np.zeros(2, bool), (128, 128), rng=np.random.default_rng(3), batch_per_im=32)
    np.testing.assert_array_equal(a[0], b[0])
    assert (a[0] >= 0).sum() == 32


def test_sampled_rpn_losses_equal_the_losses_over_every_anchor(tf_session):
    """The pipeline sends each image's sampled anchors as rows (index, label, target); the loss over
    them must be the loss over a dense label per anchor, each image's rows picking its own anchors."""
    tf, sess = tf_session
    from training.model.losses import rpn_losses, sampled_rpn_losses
    rng = np.random.default_rng(0)
    batch, anchors, rows = 2, 50, 8
    logits = rng.normal(size=(batch, anchors)).astype(np.float32)
    deltas = rng.normal(size=(batch, anchors, 4)).astype(np.float32)
    index = np.zeros((batch, rows), np.int32)
    labels = np.full((batch, rows), -1, np.int32)
    targets = np.zeros((batch, rows, 4), np.float32)
    dense_labels = np.full((batch, anchors), -1, np.int32)
    dense_targets = np.zeros((batch, anchors, 4), np.float32)
    for i, used in enumerate((8, 5)):  # image 1 has 3 padding rows
        index[i, :used] = rng.choice(anchors, used, replace=False)
        labels[i, :used] = [1, 1, 0, 1, 0, 0, 0, 0][:used]
        targets[i, :used] = rng.normal(size=(used, 4)) * (labels[i, :used, None] == 1)
        dense_labels[i, index[i, :used]] = labels[i, :used]
        dense_targets[i, index[i, :used]] = targets[i, :used]
    sparse = sess.run(sampled_rpn_losses(tf.constant(index), tf.constant(labels), tf.constant(targets),
                                         tf.constant(logits), tf.constant(deltas), batch_per_im=rows))
    dense = sess.run(rpn_losses(tf.constant(dense_labels.reshape(-1)), tf.constant(dense_targets.reshape(-1, 4)),
                                tf.constant(logits.reshape(-1)), tf.constant(deltas.reshape(-1, 4)),
                                normaliser=batch * rows))
    np.testing.assert_allclose(sparse, dense, rtol=1e-6)
    assert dense[0] > 0 and dense[1] > 0
