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


def test_rpn_targets_label_only_anchors_wholly_inside_the_image():
    anc = A.grid_anchors(8, (16,), (1.0,), 8, 8)  # covers a 64x64 padded input; the image is 32x32
    box = np.array([[4, 4, 20, 20]], np.float32)
    labels, _ = A.rpn_targets(anc, box, np.zeros(1, bool), (32, 32), rng=np.random.default_rng(0), batch_per_im=1000)
    inside = (anc[:, 0] >= 0) & (anc[:, 1] >= 0) & (anc[:, 2] <= 32) & (anc[:, 3] <= 32)
    # centres 8, 16 and 24 on each axis (x1 >= 0, x2 <= 32): 9 anchors
    assert inside.sum() == 9
    assert np.all(labels[~inside] == -1)
    # the anchor centred at (0, 0) has its centre in the image but spans -8..8: ignored
    assert labels[0] == -1
    low = np_iou(anc, box)[:, 0] < 0.3
    assert np.all(labels[inside & low] == 0) and np.all(labels[inside & ~low] == 1)
    # a crowd box is never a foreground target
    labels, _ = A.rpn_targets(anc, box, np.ones(1, bool), (64, 64), rng=np.random.default_rng(0))
    assert not np.any(labels == 1)


def test_a_boxs_best_anchor_below_the_negative_threshold_is_background():
    """A 4x4 box among 16x16 anchors: its best IoU is 16 / 256 = 0.0625 < 0.3, so tensorpack's
    get_anchor_labels makes that anchor background (the negative rule is applied last)."""
    anc = A.grid_anchors(8, (16,), (1.0,), 8, 8)
    box = np.array([[14, 14, 18, 18]], np.float32)  # inside the anchor centred at (16, 16)
    labels, _ = A.rpn_targets(anc, box, np.zeros(1, bool), (64, 64), rng=np.random.default_rng(0), batch_per_im=1000)
    best = np_iou(anc, box)[:, 0].argmax()
    assert np_iou(anc, box)[best, 0] == np.float32(16 / 256)
    assert labels[best] == 0 and not np.any(labels == 1)


def test_crowd_boxes_ignore_candidates_by_intersection_over_the_anchor():
    """A 48x48 crowd box covering a 16x16 anchor whole: IoA(crowd, anchor) = 1 > 0.7 ignores the
    anchor, though its IoU is only 256 / 2304 = 0.11; a foreground anchor inside it is ignored too."""
    anc = A.grid_anchors(8, (16,), (1.0,), 8, 8)
    crowd = [8, 8, 56, 56]
    gt = np.array([[16, 16, 32, 32], crowd], np.float32)  # the box matches the anchor centred at (24, 24)
    labels, _ = A.rpn_targets(anc, gt, np.array([False, True]), (64, 64), rng=np.random.default_rng(0),
                              batch_per_im=1000, crowd_overlap_thresh=0.7)
    covered = (anc[:, 0] >= 8) & (anc[:, 1] >= 8) & (anc[:, 2] <= 56) & (anc[:, 3] <= 56)
    assert covered.sum() == 25 and np.all(labels[covered] == -1)
    assert not np.any(labels == 1)  # the box's only foreground anchor lies in the crowd
    # half inside (IoA 0.5 <= 0.7): still background
    half = (anc[:, 0] == 0) & (anc[:, 1] == 16)   # x 0..16 against the crowd's 8..56
    assert labels[half] == 0


def tensorpack_anchor_labels(anchors, image_hw, gt_boxes, crowd_boxes, *, positive, negative, crowd_thresh):
    """tensorpack examples/FasterRCNN: ``filter_boxes_inside_shape`` (common.py), then
    ``TrainingDataPreprocessor.get_anchor_labels`` (data.py) before its subsampling, ported to NumPy.
    Returns labels per anchor, -1 for anchors not inside the image."""
    h, w = image_hw
    inside = np.where((anchors[:, 0] >= 0) & (anchors[:, 1] >= 0) & (anchors[:, 2] <= w) & (anchors[:, 3] <= h))[0]
    out = -np.ones(len(anchors), np.int32)
    a = anchors[inside]
    if len(gt_boxes) == 0:
        out[inside] = 0
        return out
    ious = np_iou(a, gt_boxes)
    max_per_anchor = ious.max(axis=1)
    labels = -np.ones(len(a), np.int32)
    labels[np.where(ious == ious.max(axis=0, keepdims=True))[0]] = 1
    labels[max_per_anchor >= positive] = 1
    labels[max_per_anchor < negative] = 0
    if crowd_boxes.size > 0:
        cand = np.where(labels >= 0)[0]
        ix = np.clip(np.minimum(crowd_boxes[:, None, 2], a[None, cand, 2]) - np.maximum(crowd_boxes[:, None, 0], a[None, cand, 0]), 0, None)
        iy = np.clip(np.minimum(crowd_boxes[:, None, 3], a[None, cand, 3]) - np.maximum(crowd_boxes[:, None, 1], a[None, cand, 1]), 0, None)
        area = (a[cand, 2] - a[cand, 0]) * (a[cand, 3] - a[cand, 1])
        ioa = ix * iy / area[None, :]   # utils/np_box_ops.py ioa(crowd, anchors): over the anchors' areas
        labels[cand[ioa.max(axis=0) > crowd_thresh]] = -1
    out[inside] = labels
    return out


def _scene(rng, h, w, n):
    xy = rng.uniform(-10, [w - 8, h - 8], (n, 2))
    wh = rng.uniform(6, 70, (n, 2))
    boxes = np.concatenate([xy, xy + wh], axis=1)
    return np.clip(boxes, 0, [w, h, w, h]).astype(np.float32)


def _fpn_cfg():
    from types import SimpleNamespace
    return SimpleNamespace(MODE_FPN=True, FPN=SimpleNamespace(ANCHOR_STRIDES=(4, 8, 16)),
                           RPN=SimpleNamespace(ANCHOR_SIZES=(16, 32, 64), ANCHOR_RATIOS=(0.5, 1.0, 2.0)))


def test_anchor_labels_equal_tensorpacks_get_anchor_labels():
    """Before subsampling, both the dense rules and the pipeline's banded ones give tensorpack's labels."""
    from training.data.rpn_sampling import AnchorSet, classify_anchors
    rng = np.random.default_rng(5)
    anchors = AnchorSet.build(_fpn_cfg(), 128, 160)
    checked_crowd = 0
    for trial in range(24):
        h, w = int(rng.integers(80, 129)), int(rng.integers(100, 161))
        boxes = _scene(rng, h, w, int(rng.integers(0, 6)))
        is_crowd = rng.random(len(boxes)) < 0.3
        for crowd_thresh in (9.99, 0.7):
            expected = tensorpack_anchor_labels(anchors.boxes, (h, w), boxes[~is_crowd], boxes[is_crowd],
                                                positive=0.7, negative=0.3, crowd_thresh=crowd_thresh)
            dense, _ = A.rpn_targets(anchors.boxes, boxes, is_crowd, (h, w), rng=rng, batch_per_im=len(anchors),
                                     fg_ratio=1.0, crowd_overlap_thresh=crowd_thresh)
            fg, bg, _ = classify_anchors(anchors, boxes, is_crowd, (h, w), positive_thresh=0.7,
                                         negative_thresh=0.3, crowd_overlap_thresh=crowd_thresh)
            np.testing.assert_array_equal(dense, expected)
            np.testing.assert_array_equal(fg, expected == 1)
            np.testing.assert_array_equal(bg, expected == 0)
            checked_crowd += int(crowd_thresh < 1 and is_crowd.any() and (~is_crowd).any())
    assert checked_crowd >= 3


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
