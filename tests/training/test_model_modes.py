"""Every model variant builds, trains a step and predicts: Mask R-CNN and Faster R-CNN, FPN and C4."""
import os

import numpy as np
import pytest

from onednn import run_with_onednn
from training.config import finalize, new_config
from training.configs.cpu_synthetic import OVERRIDES


@pytest.fixture(scope="module")
def tiny_split(tmp_path_factory):
    from training.data.coco import load_split
    from training.data.synthetic import SyntheticSpec, generate
    out = tmp_path_factory.mktemp("shapes")
    generate(out, SyntheticSpec(train=4, val=1, size=64, min_object_size=12, max_object_size=32, seed=1))
    return load_split(out, "train2017")


# *_nchw: the GPU data format, so the NCHW plumbing is checked here too. On a CPU it needs oneDNN's
# kernels, which the suite keeps off (tests/conftest.py): test_nchw_variants_under_onednn runs them.
NCHW_MODES = ["fpn_mask_nchw", "c4_mask_nchw"]
ONEDNN = os.environ.get("TF_ENABLE_ONEDNN_OPTS") == "1"


@pytest.mark.parametrize("mode", ["fpn_mask", "c4_mask", "fpn_box_only", "c4_box_only"] + (NCHW_MODES if ONEDNN else []))
def test_variant_trains_and_predicts(tf_session, tiny_split, mode):
    tf, sess = tf_session
    from training.data.pipeline import TrainingBatches, prepare_test_image
    from training.model.tower import build_towers

    cfg = new_config()
    cfg.update_args(OVERRIDES + [
        f"MODE_FPN={mode.startswith('fpn')}", f"MODE_MASK={'mask' in mode}",
        f"BACKBONE.DATA_FORMAT={'NCHW' if mode.endswith('nchw') else 'NHWC'!r}",
        "PREPROC.TRAIN_SHORT_EDGE_SIZE=[64, 64]", "PREPROC.TEST_SHORT_EDGE_SIZE=64", "PREPROC.MAX_SIZE=64",
        "RPN.ANCHOR_SIZES=(16, 32, 64, 128)" if mode.startswith("fpn") else "RPN.ANCHOR_SIZES=(16, 32)",
        "RPN.HEAD_DIM=32", "FRCNN.BATCH_PER_IM=16", "TRAIN.IMAGES_PER_EPOCH=4",
        "TRAIN.LR_EPOCH_SCHEDULE=[(1, None)]"])
    finalize(cfg, num_ranks=1, class_names=tiny_split.class_names, has_gpu=False)
    towers = build_towers(cfg, predict=True)
    sess.run(tf.compat.v1.global_variables_initializer())
    batches = iter(TrainingBatches(tiny_split.training_roidb(), cfg, seed=0))
    losses = [sess.run([towers.train_op, towers.cost], towers.feed(next(batches)))[1] for _ in range(2)]
    assert all(np.isfinite(losses))
    assert ("maskrcnn_loss/maskrcnn_loss" in towers.model.stats) == cfg.MODE_MASK
    from training.data.pipeline import read_image
    image = read_image(tiny_split.roidb[0]["file_name"])
    batch, hw, _ = prepare_test_image(image, cfg)
    boxes, scores, labels, masks, counts = sess.run(towers.pred_outputs,
                                                    dict(zip(towers.pred_inputs, (batch, hw))))
    assert counts.tolist() == [len(boxes)]   # a batch of one image: every detection is its
    assert boxes.shape[1:] == (4,) and len(boxes) == len(scores) == len(labels) == len(masks)
    assert np.all((labels >= 1) & (labels <= cfg.DATA.NUM_CATEGORY))
    if cfg.MODE_MASK and len(masks):
        size = cfg.MRCNN.MASK_SIZE if cfg.MODE_FPN else 2 * cfg.FRCNN.POOLED_SIZE
        assert masks.shape[1:] == (size, size) and masks.min() >= 0 and masks.max() <= 1


if not ONEDNN:  # with oneDNN on in this process the NCHW variants are parametrized above
    @pytest.mark.slow
    def test_nchw_variants_under_onednn():
        run = run_with_onednn(__file__, "nchw")
        assert f"{len(NCHW_MODES)} passed" in run.stdout, run.stdout[-2000:]
