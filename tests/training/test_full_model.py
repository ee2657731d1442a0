"""The FULL default model, as users train it on COCO: ResNet-50-FPN with P2-P6, short edge 800 /
max 1333, FreezeBN with FREEZE_AT=2 on a random file in ImageNet-R50-AlignPadding.npz's format
(tensorpack's `conv0/W:0` keys, the classifier too; every backbone variable restored), mask head
on, TRAIN.BATCH_SIZE_PER_GPU=2 on COCO-size images.

One graph, built once: a real training step, then prediction and COCO evaluation with the same
weights. Slow on CPU (one step is tens of seconds on 2 cores; docs/training.md has the figure).
"""
import time

import numpy as np
import pytest

from training.config import finalize, new_config


@pytest.fixture(scope="module")
def coco_like(tmp_path_factory):
    from training.data.coco import load_split
    from coco_fixture import CocoFixtureSpec, generate
    out = tmp_path_factory.mktemp("coco_like")
    generate(out, CocoFixtureSpec(train=2, val=1, seed=5))
    return out, load_split(out, "train2017"), load_split(out, "val2017")


@pytest.fixture
def session():
    """A graph and session of its own, configured as training.predict's (no grappler warnings)."""
    from training.compat import tf, tf1
    from training.predict import predict_session_config
    graph = tf.Graph()
    with graph.as_default(), tf1.Session(graph=graph, config=predict_session_config()) as sess:
        yield tf, sess


@pytest.mark.slow
def test_full_default_model_trains_a_step_predicts_and_evaluates(session, coco_like, tmp_path, capsys):
    tf, sess = session
    from training import evaluation
    from training.callbacks import predict_split
    from training.data.pipeline import TrainingBatches
    from training.model.tower import build_towers
    from training.model.weights import strict_backbone_init
    from tensorpack_weights import R50, write_imagenet_resnet

    basedir, train, val = coco_like
    weights = tmp_path / "ImageNet-R50-AlignPadding.npz"
    values = write_imagenet_resnet(weights, R50, seed=0)  # as tensorpack writes it: `conv0/W:0` keys
    cfg = new_config()
    # only what a COCO user sets: the data, the weights, the batch size (everything else: defaults)
    cfg.update_args([f"DATA.BASEDIR={str(basedir)!r}", "DATA.TRAIN=('train2017',)", "DATA.VAL=('val2017',)",
                     f"BACKBONE.WEIGHTS={str(weights)!r}", "TRAIN.BATCH_SIZE_PER_GPU=2"])
    finalize(cfg, num_ranks=1, class_names=train.class_names, has_gpu=False)
    assert (cfg.MODE_FPN, cfg.MODE_MASK, cfg.BACKBONE.NORM, cfg.BACKBONE.FREEZE_AT) == (True, True, "FreezeBN", 2)
    assert cfg.BACKBONE.RESNET_NUM_BLOCKS == [3, 4, 6, 3] and cfg.FPN.ANCHOR_STRIDES == (4, 8, 16, 32, 64)
    assert (cfg.PREPROC.TRAIN_SHORT_EDGE_SIZE, cfg.PREPROC.MAX_SIZE) == ([800, 800], 1344)   # 1333 rounded up

    towers = build_towers(cfg, predict=True)
    model, inputs, cost, train_op = towers.model, towers.inputs, towers.cost, towers.train_op
    init = strict_backbone_init(str(weights), norm=cfg.BACKBONE.NORM)
    init._setup_graph()
    sess.run(tf.compat.v1.global_variables_initializer())
    init._run_init(sess)
    assert len(init.restored) == 265   # every variable of ImageNet-R50-AlignPadding.npz
    trainable = {v.op.name for v in tf.compat.v1.trainable_variables()}
    assert "conv0/W" not in trainable and "group0/block2/conv3/W" not in trainable and "group1/block0/conv1/W" in trainable

    # one real step at batch 2 on COCO-size images (800 px short edge, an odd number of stride-32 cells)
    batch = next(iter(TrainingBatches(train.training_roidb(), cfg, seed=0)))
    assert batch[0].shape[0] == 2 and batch[0].shape[1:3] in ((800, 1216), (1216, 800), (800, 1088), (1216, 1216))
    start = time.perf_counter()
    _, loss, stats = sess.run([train_op, cost, model.stats], dict(zip(inputs, batch)))
    step_seconds = time.perf_counter() - start
    with capsys.disabled():
        print(f"\nfull default model: one training step (batch 2, {batch[0].shape[1]}x{batch[0].shape[2]}) "
              f"took {step_seconds:.1f} s")
    assert np.isfinite(loss) and all(np.isfinite(v) for v in stats.values()), stats
    assert stats["maskrcnn_loss/maskrcnn_loss"] > 0 and stats["fastrcnn_losses/num_fg_label"] > 0
    # the frozen stem kept its ImageNet weights
    stem = next(v for v in tf.compat.v1.global_variables() if v.op.name == "conv0/W")
    np.testing.assert_array_equal(sess.run(stem), values["conv0/W:0"])

    # prediction and COCO evaluation with the same weights
    feeds, outputs = towers.pred_inputs, towers.pred_outputs
    results = predict_split(lambda images, hw: sess.run(outputs, {feeds[0]: images, feeds[1]: hw}), val, cfg)
    assert all(len(r["segmentation"]["size"]) == 2 for r in results)
    metrics = evaluation.evaluate(val, results, iou_types=("bbox", "segm"), image_ids=[r["image_id"] for r in val.roidb])
    assert len(metrics) == 12 and all(-1.0 <= v <= 1.0 for v in metrics.values())
