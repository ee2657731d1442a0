"""The RPN's proposals for a batch of images in one NMS call equal tensorpack's per-image, per-level
steps (examples/FasterRCNN/modeling/model_rpn.py ``generate_rpn_proposals`` and model_fpn.py
``generate_fpn_proposals``), written here image by image with ``tf.image.non_max_suppression``:
for each level the best PER_LEVEL_NMS_TOPK logits, their boxes clipped to the image, boxes no wider
or taller than RPN.MIN_SIZE removed (``boolean_mask``), NMS at PROPOSAL_NMS_THRESH keeping
PER_LEVEL_NMS_TOPK boxes with their logits; then the best POST_NMS_TOPK over the image's levels."""
import numpy as np
import pytest

# A COCO batch of 4 padded to 800x1344 (the default short edge and MAX_SIZE), each image its own size
PADDED = (800, 1344)
IMAGE_HW = [[800, 1344], [800, 1067], [640, 1333], [533, 800]]


NMS = pytest.mark.parametrize("nms", ["padded", "greedy"])  # RPN.PROPOSAL_NMS: a GPU's and a CPU's way


def _config(nms="padded", **overrides):
    from training.config import finalize, new_config
    cfg = new_config()
    cfg.update_args([f"{k}={v!r}" for k, v in {"RPN.PROPOSAL_NMS": nms, **overrides}.items()])
    return finalize(cfg, num_ranks=1, class_names=["BG", "a"], has_gpu=False)


def _levels(cfg, rng, *, delta_scale):
    from training.model.anchors import all_anchors
    anchors = all_anchors(cfg, *PADDED)
    logits = [rng.normal(size=(len(IMAGE_HW), len(a))).astype(np.float32) for a in anchors]
    deltas = [(rng.normal(size=(len(IMAGE_HW), len(a), 4)) * delta_scale).astype(np.float32) for a in anchors]
    return logits, deltas, anchors


def _reference(tf, cfg, logits, deltas, anchors, *, training):
    """tensorpack's steps for each image on its own (one NMS call per image and level): each
    image's boxes, logits, and on each level how many boxes passed the size rule and how many NMS kept."""
    from training.model.box_ops import decode_clip, tf_clip, tf_decode
    r = cfg.RPN
    topk = r.TRAIN_PER_LEVEL_NMS_TOPK if training else r.TEST_PER_LEVEL_NMS_TOPK
    post = r.TRAIN_POST_NMS_TOPK if training else r.TEST_POST_NMS_TOPK
    out = []
    for i, hw in enumerate(IMAGE_HW):
        level_boxes, level_scores, level_sizes = [], [], []
        for lg, dl, an in zip(logits, deltas, anchors):
            boxes = tf_decode(tf.constant(dl[i]), tf.constant(an), clip=decode_clip(cfg.PREPROC.MAX_SIZE))
            scores, idx = tf.nn.top_k(tf.constant(lg[i]), k=min(topk, len(an)), sorted=True)
            boxes = tf_clip(tf.gather(boxes, idx), tf.constant(hw, tf.float32))
            valid = (boxes[:, 2] - boxes[:, 0] > r.MIN_SIZE) & (boxes[:, 3] - boxes[:, 1] > r.MIN_SIZE)
            boxes, scores = tf.boolean_mask(boxes, valid), tf.boolean_mask(scores, valid)
            keep = tf.image.non_max_suppression(boxes, scores, topk, iou_threshold=r.PROPOSAL_NMS_THRESH)
            level_boxes.append(tf.gather(boxes, keep))
            level_scores.append(tf.gather(scores, keep))
            level_sizes.append((tf.size(scores), tf.size(keep)))
        boxes, scores = tf.concat(level_boxes, 0), tf.concat(level_scores, 0)
        scores, idx = tf.nn.top_k(scores, k=tf.minimum(post, tf.size(scores)), sorted=True)
        out.append((tf.gather(boxes, idx), scores, level_sizes))
    return out


def _batched(tf, cfg, logits, deltas, anchors, *, training):
    from training.model.rpn import generate_proposals
    return generate_proposals([tf.constant(x) for x in logits], [tf.constant(x) for x in deltas],
                              [tf.constant(x) for x in anchors], tf.constant(IMAGE_HW), cfg=cfg, training=training)


def _assert_same(sess, batched, reference):
    (boxes, scores, counts), expected = sess.run([batched, reference])
    for i, (exp_boxes, exp_scores, _) in enumerate(expected):
        assert counts[i] == len(exp_scores), (i, counts[i], len(exp_scores))
        np.testing.assert_array_equal(scores[i, :counts[i]], exp_scores)
        # the same boxes: decoding the top-k anchors only (here: all of them, then top-k) can round
        # exp() one float32 step apart (vectorised and scalar exp differ in the last bit), which
        # x1 = cx - w / 2 carries as an absolute error of a step of the box's size (< 1344 px)
        np.testing.assert_allclose(boxes[i, :counts[i]], exp_boxes, rtol=0, atol=np.spacing(np.float32(2048)))
        assert (scores[i, counts[i]:] == -np.inf).all() and (boxes[i, counts[i]:] == 0).all()
    return counts, expected


@NMS
@pytest.mark.parametrize("training", [True, False], ids=["training", "test"])
def test_batched_proposals_equal_per_image_nms_at_coco_shapes(tf_session, training, nms):
    """Default config (PER_LEVEL_NMS_TOPK 2000 / 1000, POST_NMS_TOPK 2000 / 1000), P2-P6 anchors of
    an 800x1344 batch, four images of different sizes (anchors in the padding clip to nothing)."""
    tf, sess = tf_session
    cfg = _config(nms)
    logits, deltas, anchors = _levels(cfg, np.random.default_rng(0), delta_scale=0.3)
    counts, _ = _assert_same(sess, _batched(tf, cfg, logits, deltas, anchors, training=training),
                             _reference(tf, cfg, logits, deltas, anchors, training=training))
    assert (counts == (2000 if training else 1000)).all()


@NMS
def test_batched_proposals_equal_per_image_nms_with_many_overlapping_boxes(tf_session, nms):
    """The best logits of every level in one cluster around a point (a logit falls with the anchor
    centre's distance from it, in steps of 0.1: many equal logits, whose lower index goes first),
    boxes close to their anchors: neighbouring anchors overlap at IoU up to 0.78, and NMS removes
    most of each level's best boxes."""
    tf, sess = tf_session
    cfg = _config(nms)
    rng = np.random.default_rng(1)
    _, deltas, anchors = _levels(cfg, rng, delta_scale=0.02)
    logits = []
    for an in anchors:
        centre = (an[:, :2] + an[:, 2:]) / 2
        distance = np.hypot(centre[:, 0] - 300, centre[:, 1] - 250)
        logits.append(np.stack([np.round(-distance / 20 + rng.normal(0, 0.05, len(an)), 1) for _ in IMAGE_HW])
                      .astype(np.float32))
    _, expected = _assert_same(sess, _batched(tf, cfg, logits, deltas, anchors, training=True),
                               _reference(tf, cfg, logits, deltas, anchors, training=True))
    # NMS removed more than half of the 2000 boxes of P2-P5 (819 on P6) of every image
    kept = np.array([[k for _, k in e[2]] for e in expected])
    assert (kept[:, :4] < 1000).all() and (kept[:, 4] < 819 / 2).all(), kept


@NMS
def test_batched_proposals_equal_per_image_nms_with_boxes_below_the_min_size(tf_session, nms):
    """RPN.MIN_SIZE=16 and log-size deltas down to -4 (boxes shrunk e^4 = 55 times): many boxes of
    every level are no wider or taller than 16 px and are removed before NMS."""
    tf, sess = tf_session
    cfg = _config(nms, **{"RPN.MIN_SIZE": 16})
    rng = np.random.default_rng(2)
    logits, deltas, anchors = _levels(cfg, rng, delta_scale=0.1)
    for d in deltas:
        d[..., 2:] = rng.uniform(-4.0, 0.5, size=d[..., 2:].shape)
    _, expected = _assert_same(sess, _batched(tf, cfg, logits, deltas, anchors, training=True),
                               _reference(tf, cfg, logits, deltas, anchors, training=True))
    out_boxes, out_counts = sess.run(_batched(tf, cfg, logits, deltas, anchors, training=True)[::2])
    for b, n in zip(out_boxes, out_counts):
        assert (b[:n, 2] - b[:n, 0] > 16).all() and (b[:n, 3] - b[:n, 1] > 16).all()
    # the rule removed at least a fifth of the 2000 best boxes of P2-P5 of every image
    passed = np.array([[v for v, _ in e[2]] for e in expected])
    assert (passed[:, :4] < 1600).all(), passed


@NMS
def test_a_box_at_iou_exactly_the_threshold_stays_as_nms_keeps_it(tf_session, nms):
    """tf.image.non_max_suppression removes a box whose IoU with a better one is above the
    threshold: [0, 0, 10, 7] inside [0, 0, 10, 10] has IoU 70 / 100 = 0.7 exactly and stays
    (non_max_suppression_padded alone would remove it, at IoU >= threshold). Equal logits keep
    the lower index first."""
    tf, sess = tf_session
    from training.model.rpn import generate_proposals
    cfg = _config(nms, **{"MODE_FPN": False})
    anchors = np.array([[0, 0, 10, 10], [0, 0, 10, 7], [0, 0, 10, 7.5], [20, 20, 30, 30], [20, 20, 30, 30]],
                       np.float32)
    logits = np.array([[2.0, 1.0, 0.5, 1.0, 1.0]], np.float32)
    boxes, scores, counts = sess.run(generate_proposals(
        [tf.constant(logits)], [tf.zeros([1, 5, 4])], [tf.constant(anchors)], tf.constant([[64, 64]]),
        cfg=cfg, training=True))
    # [0, 0, 10, 7.5] has IoU 0.75 with the first box: removed; the two equal boxes at 1.0: the first stays
    assert counts[0] == 3
    np.testing.assert_array_equal(boxes[0, :3], anchors[[0, 1, 3]])
    np.testing.assert_array_equal(scores[0, :3], [2.0, 1.0, 1.0])


def test_roi_sampling_never_takes_the_padding_rows_of_an_image(tf_session):
    """Proposals arrive padded to one size for the batch: rows past the image's count are zeros
    (background by IoU) and must not be sampled; the count of background candidates follows the
    real rows only."""
    tf, sess = tf_session
    from training.model.frcnn_head import sample_rois
    gt = np.array([[0, 0, 10, 10]], np.float32)
    real = np.array([[0, 0, 10, 10], [0, 0, 10, 9], [40, 40, 50, 50], [60, 60, 70, 70]], np.float32)
    padded = np.concatenate([real, np.zeros((96, 4), np.float32)])
    rois, labels, _, num_fg = sample_rois(tf.constant(padded), tf.constant(gt), tf.constant([1]), batch_per_im=64,
                                          fg_ratio=0.25, fg_thresh=0.5, num_proposals=tf.constant(4))
    for _ in range(20):
        r, lab, n = sess.run([rois, labels, num_fg])
        # 3 foreground (two proposals and the ground-truth box), 2 background: nothing else exists
        assert n == 3 and len(r) == 5, (n, r)
        assert not (r == 0).all(axis=1).any()
        np.testing.assert_array_equal(np.sort(r[3:, 0]), [40, 60])


def test_proposal_nms_is_padded_on_a_gpu_and_greedy_on_a_cpu():
    from training.config import finalize, new_config
    chosen = {gpu: finalize(new_config(), num_ranks=1, class_names=["BG", "a"], has_gpu=gpu).RPN.PROPOSAL_NMS
              for gpu in (True, False)}
    assert chosen == {True: "padded", False: "greedy"}
    cfg = new_config()
    cfg.update_args(["RPN.PROPOSAL_NMS='tiled'"])
    with pytest.raises(ValueError, match=r"RPN.PROPOSAL_NMS must be one of \('padded', 'greedy', 'auto'\), got 'tiled'"):
        finalize(cfg, num_ranks=1, class_names=["BG", "a"], has_gpu=False)
