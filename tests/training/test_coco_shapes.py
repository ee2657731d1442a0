"""The graph at COCO's shapes: 800 px short edge, P2-P6, batch 2, images whose stride-32 cell
count is odd (COCO's 640x480 -> 800x1067, padded 800x1088: 25 x 34 cells at stride 32).

A narrow backbone keeps these fast; the full default model is trained in test_full_model.py.
"""
import numpy as np
import pytest

from training.config import finalize, new_config
import coco_narrow

# The default model's image sizes, levels (P2-P6), anchors and samplers; only the widths shrink.
NARROW = coco_narrow.OVERRIDES + [
    "DATA.NUM_WORKERS=1", "TRAIN.BATCH_SIZE_PER_GPU=2", "TRAIN.IMAGES_PER_EPOCH=8",
    "TRAIN.LR_EPOCH_SCHEDULE=[(1, None)]", "PREPROC.HORIZONTAL_FLIP=False",
    "TRAIN.DEBUG_CHECKS=True",  # the misalignment tests below stop the step with these checks
]


@pytest.fixture(scope="module")
def coco_like(tmp_path_factory):
    from training.data.coco import load_split
    from coco_fixture import CocoFixtureSpec, generate
    out = tmp_path_factory.mktemp("coco_like")
    generate(out, CocoFixtureSpec(train=8, val=2, seed=3))
    return load_split(out, "train2017")


def _cfg(split, *extra):
    cfg = new_config()
    cfg.update_args(NARROW + list(extra))
    return finalize(cfg, num_ranks=1, class_names=split.class_names, has_gpu=False)


def _odd_cell_batch(split, cfg):
    """A batch of 2 prepared COCO-size images (640x480 -> 800x1067 and 640x427 -> 800x1199, padded
    together to 800x1216: 25 x 38 cells at stride 32, an odd count) and the pipeline's targets."""
    from training.data.pipeline import collate_training_batch, prepare_training_example
    by_size = {(r["width"], r["height"]): r for r in split.training_roidb()}
    records = [by_size[(640, 480)], by_size[(640, 427)]]
    rng = np.random.default_rng(0)
    return collate_training_batch([prepare_training_example(r, cfg, rng) for r in records], cfg, rng)


@pytest.fixture(scope="module")
def narrow_graph(coco_like):
    """The training graph of the narrow model, built once: (graph, session, cfg, inputs, cost, train_op)."""
    from training.compat import tf1
    from training.model.tower import build_towers
    cfg = _cfg(coco_like)
    graph = tf1.Graph()
    with graph.as_default():
        towers = build_towers(cfg)
        sess = tf1.Session(graph=graph)
        sess.run(tf1.global_variables_initializer())
    yield graph, sess, cfg, towers.inputs, towers.cost, towers.train_op
    sess.close()


def test_coco_sized_batch_has_odd_stride32_cells(coco_like):
    cfg = _cfg(coco_like)
    images = _odd_cell_batch(coco_like, cfg)[0]
    assert images.shape[:3] == (2, 800, 1216)   # 800 / 32 = 25 cells; P6: 12.5 -> 13 in the graph


def test_rpn_anchor_labels_line_up_with_the_graph_per_image_and_level(coco_like, narrow_graph):
    graph, sess, cfg, inputs, cost, train_op = narrow_graph
    batch = _odd_cell_batch(coco_like, cfg)
    # the RPN's objectness maps, one per level (P2..P6), as the graph computes them
    level_logits = sorted((op.outputs[0] for op in graph.get_operations()
                           if op.name.split("/")[0].startswith("rpn") and op.name.endswith("class/output")),
                          key=lambda t: t.name)
    assert len(level_logits) == 5
    shapes = sess.run([tf_shape for tf_shape in [t for t in level_logits]], dict(zip(inputs, batch)))
    per_image = sum(int(np.prod(s.shape[1:])) for s in shapes)
    num_anchors = batch[6]
    assert np.all(num_anchors == per_image), "pipeline anchors per image != RPN logits per image"
    _, loss = sess.run([train_op, cost], dict(zip(inputs, batch)))
    assert np.isfinite(loss)


def test_misaligned_anchor_labels_stop_the_step(coco_like, narrow_graph):
    from training.compat import tf
    graph, sess, cfg, inputs, cost, train_op = narrow_graph
    batch = _odd_cell_batch(coco_like, cfg)
    # what the old pipeline produced: P6 counted with floor (12 x 19 cells instead of 13 x 19)
    batch[6] = batch[6] - 19 * 3
    with pytest.raises(tf.errors.InvalidArgumentError, match="input pipeline counts a different number of anchors per image than the RPN"):
        sess.run(cost, dict(zip(inputs, batch)))


def test_sampled_anchor_outside_the_image_anchors_stops_the_step(coco_like, narrow_graph):
    from training.compat import tf
    graph, sess, cfg, inputs, cost, train_op = narrow_graph
    batch = _odd_cell_batch(coco_like, cfg)
    batch[7] = batch[7].copy()
    batch[7][1, 0] = batch[6][1]   # one past the last anchor of image 1
    with pytest.raises(tf.errors.InvalidArgumentError, match="sampled RPN anchor index lies outside"):
        sess.run(cost, dict(zip(inputs, batch)))


def test_sampled_roi_check_names_the_problem(tf_session):
    tf, sess = tf_session
    from training.model.consistency import checked_sampled_rois
    rois = tf.zeros([6, 4])
    labels = tf.constant([3, 1, 0, 2, 0, 0])   # a foreground label after a background one
    out = checked_sampled_rois(rois, labels, tf.constant([0, 1]), tf.constant(2), batch_per_im=8, fg_ratio=0.5, image=1)
    with pytest.raises(tf.errors.InvalidArgumentError, match="image 1: sampled ROI labels are not foreground first"):
        sess.run(out)
    too_many = checked_sampled_rois(tf.zeros([9, 4]), tf.zeros([9], tf.int32), tf.zeros([0], tf.int32),
                                    tf.constant(0), batch_per_im=8, fg_ratio=0.5, image=0)
    with pytest.raises(tf.errors.InvalidArgumentError, match="more sampled ROIs than FRCNN.BATCH_PER_IM=8"):
        sess.run(too_many)


def test_mask_target_check_names_the_problem(tf_session):
    tf, sess = tf_session
    from training.model.consistency import checked_mask_targets
    logits = tf.zeros([3, 5, 28, 28])
    ok = checked_mask_targets(logits, tf.zeros([3, 28, 28]), tf.constant([1, 2, 5]), num_classes=5)
    assert [o.shape for o in sess.run(ok)] == [(3, 5, 28, 28), (3, 28, 28)]
    bad = checked_mask_targets(logits, tf.zeros([3, 14, 14]), tf.constant([1, 2, 5]), num_classes=5)
    with pytest.raises(tf.errors.InvalidArgumentError, match="mask targets are not"):
        sess.run(bad)


def test_c4_inference_graph_builds_on_its_own(tf_session, coco_like):
    """training.predict builds only the inference graph: the C4 res5 head runs twice (box head on
    proposals, mask head on detections) and must share its variables without an outer reuse."""
    tf, sess = tf_session
    from tensorpack.tfutils.tower import TowerContext
    from training.model.generalized_rcnn import INPUT_NAMES_TRAIN, OUTPUT_NAMES, MaskRCNN
    cfg = _cfg(coco_like, "MODE_FPN=False", "RPN.ANCHOR_SIZES=(32, 64)", "RPN.HEAD_DIM=16",
               "PREPROC.TRAIN_SHORT_EDGE_SIZE=[128, 128]", "PREPROC.TEST_SHORT_EDGE_SIZE=128", "PREPROC.MAX_SIZE=200")
    model = MaskRCNN(cfg)
    images = tf.compat.v1.placeholder(tf.float32, [None, None, None, 3], "images")
    image_hw = tf.compat.v1.placeholder(tf.int32, [None, 2], "image_hw")
    with TowerContext("", is_training=False):
        model.build_graph(images, image_hw, *[None] * (len(INPUT_NAMES_TRAIN) - 2))
    names = [v.op.name for v in tf.compat.v1.global_variables()]
    assert len(names) == len(set(names)) and "group3/block0/conv1/W" in names
    sess.run(tf.compat.v1.global_variables_initializer())
    outputs = [tf.compat.v1.get_default_graph().get_tensor_by_name(f"{n}:0") for n in OUTPUT_NAMES]
    out = sess.run(outputs, {images: np.zeros((1, 128, 192, 3), np.float32), image_hw: [[128, 180]]})
    assert out[3].shape[1:] == (14, 14) or len(out[3]) == 0


def test_images_and_pixel_statistics_are_both_bgr(tf_session, tmp_path):
    """tensorpack's ImageNet weights take BGR input normalised with BGR statistics; their conv0 is
    frozen, so a swapped channel order could never be trained away."""
    import cv2
    tf, sess = tf_session
    from training.data.pipeline import read_image
    from training.model.generalized_rcnn import MaskRCNN
    cfg = new_config()
    pure_blue = np.zeros((8, 8, 3), np.uint8)
    pure_blue[..., 0] = 255                                   # OpenCV writes BGR: channel 0 is blue
    cv2.imwrite(str(tmp_path / "blue.png"), pure_blue)
    image = read_image(str(tmp_path / "blue.png"))
    assert image[0, 0].tolist() == [255, 0, 0]
    # ImageNet's blue mean/std is 103.53/57.375 (red 123.675/58.395): blue comes first here too
    assert cfg.PREPROC.PIXEL_MEAN == [103.53, 116.28, 123.675] and cfg.PREPROC.PIXEL_STD == [57.375, 57.12, 58.395]
    model = MaskRCNN(finalize(cfg, num_ranks=1, class_names=["BG", "a"], has_gpu=False))
    normalised = sess.run(model._preprocess(tf.constant(image[None])))
    np.testing.assert_allclose(normalised[0, 0, 0], [(255 - 103.53) / 57.375, -116.28 / 57.12, -123.675 / 58.395],
                               rtol=1e-5)


def test_xla_training_batches_come_in_a_few_fixed_shapes(coco_like):
    """With TRAIN.XLA, every batch is padded to one of {S, L} x {S, L} (S = 800, L = 1344 here):
    XLA compiles once per input shape, so free shapes (800x1088, 800x1216, 1216x800, ...) would
    recompile at almost every step."""
    from training.data.pipeline import TrainingBatches
    from training.model.anchors import all_anchors
    cfg = _cfg(coco_like, "TRAIN.XLA=True", "PREPROC.TRAIN_SHORT_EDGE_SIZE=[640, 800]", "PREPROC.HORIZONTAL_FLIP=True")
    batches = iter(TrainingBatches(coco_like.training_roidb(), cfg, seed=1))
    shapes = set()
    for _ in range(6):
        images, _, _, _, _, _, num_anchors, *_ = next(batches)
        shapes.add(images.shape[1:3])
        assert np.all(num_anchors == sum(len(a) for a in all_anchors(cfg, *images.shape[1:3])))
    assert shapes <= {(800, 1344), (1344, 800), (1344, 1344), (800, 800)}, shapes
