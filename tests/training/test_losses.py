"""The loss terms against tensorpack's definitions (examples/FasterRCNN), ported to NumPy here.

tensorpack trains one image per GPU and averages the losses over GPUs; a batch of B images here
must give the mean over the images of tensorpack's per-image losses.
"""
import numpy as np
import pytest

RPN_BATCH_PER_IM = 256


def _sigmoid_cross_entropy(labels, logits):
    # the numerically stable form TensorFlow documents for sigmoid_cross_entropy_with_logits
    return np.maximum(logits, 0) - logits * labels + np.log1p(np.exp(-np.abs(logits)))


def _huber_sum(labels, predictions, delta):
    # tf.losses.huber_loss with Reduction.SUM, as its documentation defines it
    error = np.abs(predictions - labels)
    quadratic = np.minimum(error, delta)
    return np.sum(0.5 * quadratic ** 2 + delta * (error - quadratic))


def tensorpack_rpn_losses(anchor_labels, anchor_boxes, label_logits, box_logits, batch_per_im):
    """examples/FasterRCNN/modeling/model_rpn.py, ``rpn_losses``, for one image (all FPN levels:
    ``multilevel_rpn_losses`` sums the levels' losses, each divided by the same BATCH_PER_IM)."""
    valid = anchor_labels != -1
    pos = anchor_labels == 1
    if valid.sum() == 0:
        label_loss = 0.0
    else:
        label_loss = np.sum(_sigmoid_cross_entropy(anchor_labels[valid].astype(np.float64), label_logits[valid]))
        label_loss *= 1.0 / batch_per_im
    delta = 1.0 / 9
    if pos.sum() == 0:
        box_loss = 0.0
    else:
        box_loss = _huber_sum(anchor_boxes[pos], box_logits[pos], delta) / delta * (1.0 / batch_per_im)
    return label_loss, box_loss


def tensorpack_fastrcnn_losses(labels, label_logits, fg_boxes, fg_box_logits):
    """examples/FasterRCNN/modeling/model_frcnn.py, ``fastrcnn_losses``, for one image."""
    shifted = label_logits - label_logits.max(axis=1, keepdims=True)
    log_softmax = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    label_loss = np.mean(-log_softmax[np.arange(len(labels)), labels])
    box_loss = np.sum(np.abs(fg_boxes - fg_box_logits)) / len(labels)
    return label_loss, box_loss


def test_fastrcnn_box_loss_is_l1_over_all_sampled_rois_by_hand(tf_session):
    """One foreground ROI among 4 sampled, off by 0.5 on every coordinate: L1 sums 4 x 0.5 = 2,
    over 4 ROIs = 0.5 (smooth-L1 with beta 1 would give 4 x 0.125 / 4 = 0.125)."""
    tf, sess = tf_session
    from training.model.losses import fastrcnn_losses
    labels = np.array([3, 0, 0, 0], np.int32)
    logits = np.zeros((4, 5), np.float32)
    target = np.zeros((1, 4), np.float32)
    pred = np.full((1, 4), 0.5, np.float32)
    label_loss, box_loss, _ = sess.run(fastrcnn_losses(tf.constant(labels), tf.constant(logits),
                                                       tf.constant(target), tf.constant(pred)))
    assert box_loss == pytest.approx(0.5)
    assert label_loss == pytest.approx(np.log(5.0))  # uniform logits over 5 classes


def test_fastrcnn_losses_equal_tensorpacks_mean_over_images(tf_session):
    tf, sess = tf_session
    from training.model.losses import fastrcnn_losses
    rng = np.random.default_rng(0)
    classes = 4
    per_image = []
    for rois, fg in ((12, 3), (7, 5)):  # images with different numbers of sampled ROIs
        labels = np.concatenate([rng.integers(1, classes + 1, fg), np.zeros(rois - fg, int)]).astype(np.int32)
        logits = rng.normal(size=(rois, classes + 1)).astype(np.float32)
        target = rng.normal(size=(fg, 4)).astype(np.float32)
        pred = (target + rng.normal(scale=1.5, size=(fg, 4))).astype(np.float32)  # errors above and below 1
        per_image.append((labels, logits, target, pred))
    expected = np.mean([tensorpack_fastrcnn_losses(*image) for image in per_image], axis=0)
    cat = [np.concatenate(parts) for parts in zip(*per_image)]
    roi_image = np.concatenate([np.full(len(p[0]), i, np.int32) for i, p in enumerate(per_image)])
    fg_image = np.concatenate([np.full(len(p[2]), i, np.int32) for i, p in enumerate(per_image)])
    label_loss, box_loss, _ = sess.run(fastrcnn_losses(
        *map(tf.constant, cat), roi_image=tf.constant(roi_image), fg_image=tf.constant(fg_image), num_images=2))
    np.testing.assert_allclose([label_loss, box_loss], expected, rtol=1e-5)


def _sampled_anchors(rng, rows, used, fg, anchors):
    index = np.zeros(rows, np.int32)
    labels = np.full(rows, -1, np.int32)
    targets = np.zeros((rows, 4), np.float32)
    index[:used] = rng.choice(anchors, used, replace=False)
    labels[:used] = [1] * fg + [0] * (used - fg)
    targets[:fg] = rng.normal(scale=0.2, size=(fg, 4))
    return index, labels, targets


def test_rpn_losses_equal_tensorpacks_mean_over_images(tf_session):
    """Sums over the sampled anchors divided by RPN.BATCH_PER_IM, not by the anchors sampled:
    image 1 samples only 40 of 256 (a small image with few background anchors)."""
    tf, sess = tf_session
    from training.model.losses import sampled_rpn_losses
    rng = np.random.default_rng(1)
    anchors, rows = 600, 300
    index, labels, targets = zip(*[_sampled_anchors(rng, rows, used, fg, anchors)
                                   for used, fg in ((256, 100), (40, 6))])
    index, labels, targets = np.stack(index), np.stack(labels), np.stack(targets)
    logits = rng.normal(size=(2, anchors)).astype(np.float32)
    # deltas near the targets: errors on both sides of the Huber knee at 1/9
    deltas = rng.normal(scale=0.2, size=(2, anchors, 4)).astype(np.float32)
    per_image = []
    for i in range(2):
        dense_labels = np.full(anchors, -1, np.int32)
        dense_targets = np.zeros((anchors, 4), np.float32)
        used = labels[i] >= 0
        dense_labels[index[i][used]] = labels[i][used]
        dense_targets[index[i][used]] = targets[i][used]
        per_image.append(tensorpack_rpn_losses(dense_labels, dense_targets, logits[i], deltas[i], RPN_BATCH_PER_IM))
    expected = np.mean(per_image, axis=0)
    got = sess.run(sampled_rpn_losses(*map(tf.constant, (index, labels, targets, logits, deltas)),
                                      batch_per_im=RPN_BATCH_PER_IM))
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    errors = np.abs(deltas[0][index[0][:100]] - targets[0][:100])
    assert (errors < 1 / 9).any() and (errors > 1 / 9).any()


def test_rpn_box_loss_by_hand(tf_session):
    """One foreground anchor off by 1 on each coordinate, 256 anchors an image: smooth-L1 with beta
    1/9 gives 1 - 1/18 per coordinate, 4 x (17/18) / 256 in all."""
    tf, sess = tf_session
    from training.model.losses import sampled_rpn_losses
    index = np.arange(256, dtype=np.int32)[None]
    labels = np.zeros((1, 256), np.int32)
    labels[0, 0] = 1
    targets = np.zeros((1, 256, 4), np.float32)
    deltas = np.zeros((1, 256, 4), np.float32)
    deltas[0, 0] = 1.0
    logits = np.zeros((1, 256), np.float32)
    label_loss, box_loss = sess.run(sampled_rpn_losses(*map(tf.constant, (index, labels, targets, logits, deltas)),
                                                       batch_per_im=256))
    assert box_loss == pytest.approx(4 * (17 / 18) / 256)
    assert label_loss == pytest.approx(np.log(2.0))  # logit 0: log 2 for every anchor, 256 / 256


def tensorpack_maskrcnn_loss(mask_logits, fg_labels, fg_target_masks):
    """examples/FasterRCNN/modeling/model_mrcnn.py, ``maskrcnn_loss``, for one image: the logits
    of each ROI's own class (labels 1-based), mean sigmoid cross-entropy over ROIs and pixels."""
    own = mask_logits[np.arange(len(fg_labels)), fg_labels - 1]
    return np.mean(_sigmoid_cross_entropy(fg_target_masks, own))


def test_mask_loss_equals_tensorpacks_for_one_image(tf_session):
    tf, sess = tf_session
    from training.model.losses import maskrcnn_loss
    rng = np.random.default_rng(2)
    fg, classes, size = 5, 3, 7
    logits = rng.normal(scale=2.0, size=(fg, classes, size, size)).astype(np.float32)
    labels = rng.integers(1, classes + 1, fg).astype(np.int32)
    targets = (rng.random((fg, size, size)) > 0.6).astype(np.float32)
    loss, _ = sess.run(maskrcnn_loss(tf.constant(logits), tf.constant(labels), tf.constant(targets)))
    assert loss == pytest.approx(tensorpack_maskrcnn_loss(logits, labels, targets), rel=1e-5)
