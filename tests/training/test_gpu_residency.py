"""The training step stays on the GPU: what a GPU rank's graph places on the host, and the model
parts rewritten for it (ROI sampling, proposals, the debug-only consistency checks).

The graph inspection runs in a subprocess under the CUDA build of TensorFlow that ``make install``
keeps in ``.venv/tf-gpu-build`` (as tests/training/test_mixed_precision.py does): only its kernel
registry says which ops have GPU kernels. The CPU build's registry lists none, so it could only
count the ops the model pins to the CPU; this test needs the real answer and fails without it.
"""
import sys
from pathlib import Path

import numpy as np

import coco_narrow

REPO = Path(__file__).resolve().parents[2]
TF_GPU_BUILD = REPO / ".venv" / "tf-gpu-build"
# The narrow COCO-shapes model at the default sizes, batch 4 per GPU, NCHW as on a GPU
STEP = [o for o in coco_narrow.OVERRIDES if not o.startswith(("DATA.", "BACKBONE.DATA_FORMAT"))]


def _inspect(*extra, amp=False):
    assert (TF_GPU_BUILD / "tensorflow").is_dir(), \
        f"{TF_GPU_BUILD} is missing: `make install` puts TensorFlow's CUDA build there for the graph inspection"
    sys.path.insert(0, str(REPO / "bench"))
    try:
        import gpu_readiness
    finally:
        sys.path.pop(0)
    return gpu_readiness.run_inspection([*STEP, *extra], amp=amp)


def test_the_training_step_places_no_op_on_the_host_and_copies_nothing_back():
    """No op of the step (input to optimizer update) lacks a GPU kernel or is pinned to the CPU,
    and no float tensor crosses to the host and back: a host-only op (RandomShuffle, a CPU crop
    of the masks) or an in-graph assert added to the step fails this with its name scope."""
    result = _inspect()
    assert result["gpu_build"]
    assert result["host_ops"] == {}, result["host_ops"]
    assert result["crossings"] == {}, result["crossings"]


def test_debug_checks_put_the_asserts_back_on_the_host():
    """TRAIN.DEBUG_CHECKS adds the consistency asserts, each a copy to the host and a wait; the
    inspection sees them (so the test above would see any that slipped into the default step)."""
    result = _inspect("TRAIN.DEBUG_CHECKS=True")
    assert any("check_anchor_targets" in k for k in result["crossings"]), result["crossings"]
    assert any("check_sampled_rois" in k for k in result["crossings"]), result["crossings"]


def test_sample_rois_draws_a_uniform_subset_with_gpu_ops(tf_session):
    tf, sess = tf_session
    from training.model.frcnn_head import sample_rois
    gt = np.array([[0, 0, 10, 10], [50, 50, 60, 60]], np.float32)
    # 20 proposals equal to a ground-truth box (foreground), 100 far away (background)
    fg = np.repeat(gt, 10, axis=0)
    bg = np.tile(np.array([[200, 200, 210, 210]], np.float32), (100, 1))
    rois, labels, fg_gt, num_fg = sample_rois(tf.constant(np.concatenate([fg, bg])), tf.constant(gt),
                                              tf.constant([3, 7]), batch_per_im=16, fg_ratio=0.25, fg_thresh=0.5)
    ops = {op.type for op in tf.compat.v1.get_default_graph().get_operations()}
    assert "RandomShuffle" not in ops
    for _ in range(50):
        r, lab, g, n = sess.run([rois, labels, fg_gt, num_fg])
        assert n == 4 and len(r) == 16  # 22 foreground candidates (with the 2 gt boxes), quota 16 x 0.25
        assert (lab[:4] > 0).all() and (lab[4:] == 0).all()
        np.testing.assert_array_equal(lab[:4], np.array([3, 7])[g])
    # every foreground candidate equally likely: 11 of the 22 are the first box (p = 0.5; 1200
    # picks: standard deviation 0.0144, so 0.44..0.56 is over 4 of them)
    picked = np.concatenate([r[:n] for r, n in (sess.run([rois, num_fg]) for _ in range(300))])
    share_first = np.mean(np.all(picked == gt[0], axis=1))
    assert 0.44 < share_first < 0.56, share_first


def test_proposals_drop_boxes_clipped_to_zero_area(tf_session):
    """Anchors in a batch's padding, right of a narrower image, clip to zero-width boxes at its
    edge. They must not take proposal slots (detectron2's ``nonempty`` after clipping)."""
    tf, sess = tf_session
    from training.config import new_config
    from training.model.rpn import generate_proposals
    cfg = new_config()
    # one level: 10 boxes inside a 64x64 image, 30 in the padding to its right (x >= 70), scored higher
    inside = np.array([[6 * i, 6 * i, 6 * i + 5, 6 * i + 5] for i in range(10)], np.float32)
    outside = np.array([[70 + 2 * i, 5, 80 + 2 * i, 15] for i in range(30)], np.float32)
    anchors = np.concatenate([inside, outside])
    scores = np.concatenate([np.zeros(10), np.ones(30)]).astype(np.float32)
    boxes, _, counts = generate_proposals([tf.constant(scores[None])], [tf.zeros([1, 40, 4])], [tf.constant(anchors)],
                                          tf.constant([[64, 64]]), cfg=cfg, training=True)
    b, n = sess.run([boxes, counts])
    assert n.tolist() == [10]
    b = b[0, :10]
    assert ((b[:, 2] - b[:, 0] > 0) & (b[:, 3] - b[:, 1] > 0)).all()
    np.testing.assert_allclose(np.sort(b[:, 0]), inside[:, 0])


def test_cudnn_autotune_follows_the_short_edge_range():
    """tensorpack's rule: no cuDNN autotuning when training short edges span more than 100 px."""
    from training.config import finalize, new_config, gpu_environment

    def env(short):
        cfg = new_config()
        cfg.update_args([f"PREPROC.TRAIN_SHORT_EDGE_SIZE={short}"])
        return gpu_environment(finalize(cfg, num_ranks=1, class_names=["BG", "a"], has_gpu=False))
    assert "TF_CUDNN_USE_AUTOTUNE" not in env([800, 800])
    assert "TF_CUDNN_USE_AUTOTUNE" not in env([700, 800])
    assert env([640, 800])["TF_CUDNN_USE_AUTOTUNE"] == "0"


def test_xla_compiles_static_shaped_training_parts_only(monkeypatch):
    """TRAIN.XLA on a GPU marks the training tower's backbone, FPN, RPN and box head for XLA; not ROI
    pooling, the mask head (a new row count almost every step), nor the evaluation tower. Built as a
    GPU rank builds it: the device probe says GPU (no GPU is needed to build the graph)."""
    from training.compat import tf1
    from training.config import finalize, new_config
    from training.model import generalized_rcnn
    from training.model.tower import build_towers
    monkeypatch.setattr(generalized_rcnn, "_has_gpu", lambda: True)
    cfg = new_config()
    cfg.update_args([*STEP, "BACKBONE.DATA_FORMAT='NHWC'", "TRAIN.XLA=True", "MODE_MASK=True"])
    cfg = finalize(cfg, num_ranks=1, class_names=["BG", "a", "b"], has_gpu=False)
    graph = tf1.Graph()
    with graph.as_default():
        build_towers(cfg, predict=True)
    compiled_ops = [op for op in graph.get_operations()
                    if "_XlaCompile" in op.node_def.attr and op.get_attr("_XlaCompile")]
    compiled = [op.name for op in compiled_ops]
    assert any(n.startswith("group0/") for n in compiled) and any(n.startswith("fastrcnn/") for n in compiled)
    assert not [n for n in compiled if n.startswith(("pred/", "maskrcnn/", "multilevel_roi_align", "roi_align"))]
    assert not [op.name for op in compiled_ops if op.type in ("CropAndResize", "NonMaxSuppressionV3")]
