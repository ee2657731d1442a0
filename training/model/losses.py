"""Losses of the three heads, with the training statistics SageMaker's metric names refer to.

Each function adds scalar summaries under the exact names of the metric definitions of AWS's
SageMaker example notebook "Distributed Training of Mask-RCNN in Amazon SageMaker using EFS"
(``fastrcnn_losses/box_loss``, ``maskrcnn_loss/accuracy`` ...); the progress logger prints them
through :func:`training.metrics.format_metric`.
"""
from __future__ import annotations

from training.compat import tf
from training.model import scopes


def _named(value, name):
    return tf.identity(value, name=name)


def rpn_losses(anchor_labels, anchor_deltas_target, logits, deltas, *, normaliser):
    """``anchor_labels [N]`` (1/0/-1), targets ``[N, 4]``, ``logits [N]``, ``deltas [N, 4]`` (all images).

    As tensorpack's ``rpn_losses`` (modeling/model_rpn.py): both terms are sums over the sampled
    anchors divided by a fixed count, RPN.BATCH_PER_IM per image (``normaliser``), not by the
    anchors an image happened to sample; the box term is smooth-L1 with beta 1/9 over the
    foreground anchors (tensorpack: Huber with delta 1/9, divided by delta).
    """
    with tf.name_scope(scopes.RPN_LOSSES):
        valid = tf.reshape(tf.where(anchor_labels >= 0), [-1])
        fg = tf.reshape(tf.where(tf.equal(anchor_labels, 1)), [-1])
        valid_labels = tf.cast(tf.gather(anchor_labels, valid), tf.float32)
        valid_logits = tf.gather(logits, valid)
        normaliser = tf.cast(normaliser, tf.float32)
        label_loss = tf.reduce_sum(tf.nn.sigmoid_cross_entropy_with_logits(labels=valid_labels, logits=valid_logits)) / normaliser
        diff = tf.abs(tf.gather(deltas, fg) - tf.gather(anchor_deltas_target, fg))
        beta = 1.0 / 9
        box_loss = tf.reduce_sum(tf.where(diff < beta, 0.5 * diff ** 2 / beta, diff - 0.5 * beta)) / normaliser
        return _named(label_loss, "label_loss"), _named(box_loss, "box_loss")


def sampled_rpn_losses(anchor_index, anchor_labels, anchor_targets, logits, deltas, *, batch_per_im: int):
    """The RPN losses over each image's sampled anchors.

    ``anchor_index`` / ``anchor_labels [B, K]`` (1/0, -1 for a padding row) and ``anchor_targets
    [B, K, 4]`` from the pipeline; ``logits [B, N]`` and ``deltas [B, N, 4]`` over all anchors of
    each image. Each image's rows pick from that image's anchors only (``batch_dims=1``). The
    losses are the mean over the B images of tensorpack's per-image losses (one image per GPU
    there, averaged over GPUs): the sums over all images divided by ``B * batch_per_im``.
    """
    rows = tf.maximum(anchor_index, 0)  # a padding row reads anchor 0; its label -1 keeps it out of both losses
    return rpn_losses(tf.reshape(anchor_labels, [-1]), tf.reshape(anchor_targets, [-1, 4]),
                      tf.reshape(tf.gather(logits, rows, batch_dims=1), [-1]),
                      tf.reshape(tf.gather(deltas, rows, batch_dims=1), [-1, 4]),
                      normaliser=tf.shape(anchor_labels)[0] * batch_per_im)


def fastrcnn_losses(labels, logits, box_target, box_pred_fg, *, roi_image=None, fg_image=None, num_images: int = 1):
    """``labels [R]``, ``logits [R, C+1]``, ``box_target``/``box_pred_fg`` ``[F, 4]`` (foreground ROIs).

    As tensorpack's ``fastrcnn_losses`` (modeling/model_frcnn.py), per image: the label loss is the
    mean cross-entropy over the image's sampled ROIs; the box loss is L1, the sum of ``|delta|``
    over the 4 coordinates of the foreground ROIs, divided by all sampled ROIs (foreground and
    background). tensorpack trains one image per GPU and averages over GPUs; here the losses are
    the mean over ``num_images`` images, ``roi_image [R]`` / ``fg_image [F]`` naming each ROI's
    image (None: one image).
    """
    with tf.name_scope(scopes.FASTRCNN_LOSSES):
        if roi_image is None:
            roi_image = tf.zeros_like(labels)
            fg_image = tf.zeros([tf.shape(box_target)[0]], labels.dtype)
            num_images = 1
        rois_of_image = tf.math.unsorted_segment_sum(tf.ones_like(labels, tf.float32), roi_image, num_images)
        # each ROI weighs 1 / (rois of its image * images): per-image means, averaged over images
        roi_weight = 1.0 / (tf.gather(rois_of_image, roi_image) * num_images)
        fg_weight = 1.0 / (tf.gather(rois_of_image, fg_image) * num_images)
        cross_entropy = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
        label_loss = tf.reduce_sum(cross_entropy * roi_weight)
        box_loss = tf.reduce_sum(tf.reduce_sum(tf.abs(box_pred_fg - box_target), axis=1) * fg_weight)
        with tf.name_scope("label_metrics"):
            pred = tf.argmax(logits, axis=1, output_type=tf.int32)
            correct = tf.cast(tf.equal(pred, labels), tf.float32)
            accuracy = _named(tf.reduce_mean(correct), "accuracy")
            is_fg = labels > 0
            num_fg = tf.reduce_sum(tf.cast(is_fg, tf.float32))
            safe_fg = tf.maximum(num_fg, 1.0)
            false_negative = _named(tf.reduce_sum(tf.cast(is_fg & tf.equal(pred, 0), tf.float32)) / safe_fg,
                                    "false_negative")
            fg_accuracy = _named(tf.reduce_sum(tf.cast(is_fg, tf.float32) * correct) / safe_fg, "fg_accuracy")
        num_fg_label = _named(num_fg, "num_fg_label")
        stats = {"fastrcnn_losses/label_metrics/accuracy": accuracy,
                 "fastrcnn_losses/label_metrics/false_negative": false_negative,
                 "fastrcnn_losses/label_metrics/fg_accuracy": fg_accuracy,
                 "fastrcnn_losses/num_fg_label": num_fg_label}
        return _named(label_loss, "label_loss"), _named(box_loss, "box_loss"), stats


def maskrcnn_loss(mask_logits, fg_labels, mask_targets):
    """``mask_logits [F, C, S, S]``; the channel of each ROI's class is trained against the soft
    ``mask_targets [F, S, S]`` (0..1); accuracy and the pixel ratio count target pixels above 0.5."""
    with tf.name_scope(scopes.MASK_LOSS):
        idx = tf.stack([tf.range(tf.size(fg_labels)), fg_labels - 1], axis=1)
        logits = tf.gather_nd(mask_logits, idx)  # [F, S, S]
        num = tf.size(fg_labels)
        loss = tf.nn.sigmoid_cross_entropy_with_logits(labels=mask_targets, logits=logits)
        loss = tf.where(num > 0, tf.reduce_mean(loss), 0.0)
        pred = tf.cast(logits > 0, tf.float32)
        truth = tf.cast(mask_targets > 0.5, tf.float32)  # the targets are soft; the metrics count pixels
        accuracy = tf.where(num > 0, tf.reduce_mean(tf.cast(tf.equal(pred, truth), tf.float32)), 0.0)
        pos = tf.reduce_sum(truth)
        pos_accuracy = tf.reduce_sum(pred * truth) / tf.maximum(pos, 1.0)
        fg_pixel_ratio = tf.where(num > 0, tf.reduce_mean(truth), 0.0)
        stats = {"maskrcnn_loss/accuracy": _named(accuracy, "accuracy"),
                 "maskrcnn_loss/pos_accuracy": _named(pos_accuracy, "pos_accuracy"),
                 "maskrcnn_loss/fg_pixel_ratio": _named(fg_pixel_ratio, "fg_pixel_ratio")}
        return _named(loss, "maskrcnn_loss"), stats
