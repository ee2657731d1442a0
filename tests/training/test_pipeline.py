"""The training input pipeline: padding, ground truth, masks and RPN targets line up."""
import itertools

import numpy as np
import pytest

from training.config import finalize, new_config
from training.configs.cpu_synthetic import OVERRIDES


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    from training.data.coco import load_split
    from training.data.synthetic import SyntheticSpec, generate
    out = tmp_path_factory.mktemp("shapes")
    generate(out, SyntheticSpec(train=6, val=1, size=80, min_object_size=16, max_object_size=40, seed=2))
    return load_split(out, "train2017")


def _cfg(split, *extra):
    cfg = new_config()
    cfg.update_args(OVERRIDES + ["PREPROC.TRAIN_SHORT_EDGE_SIZE=[72, 88]", "PREPROC.TEST_SHORT_EDGE_SIZE=80",
                     "PREPROC.MAX_SIZE=100", *extra])
    return finalize(cfg, num_ranks=1, class_names=split.class_names, has_gpu=False)


def test_batches_are_padded_and_consistent(split):
    from training.data import packed_masks
    from training.data.pipeline import TrainingBatches
    from training.model.anchors import all_anchors
    cfg = _cfg(split, "TRAIN.BATCH_SIZE_PER_GPU=3")
    for batch in itertools.islice(iter(TrainingBatches(split.training_roidb(), cfg, seed=0)), 4):
        images, image_hw, gt_boxes, gt_labels, num_gt, gt_masks, num_anchors, anchor_index, anchor_labels, _ = batch
        b, hp, wp, _ = images.shape
        assert b == 3 and hp % 32 == 0 and wp % 32 == 0
        assert np.all(image_hw[:, 0] <= hp) and np.all(image_hw[:, 1] <= wp)
        assert np.all((image_hw >= 72) & (image_hw <= 100))
        assert np.all(num_anchors == sum(len(a) for a in all_anchors(cfg, hp, wp)))
        assert anchor_labels.shape == anchor_index.shape == (3, cfg.RPN.BATCH_PER_IM)
        assert images.dtype == np.uint8 and gt_masks.dtype == np.uint8
        assert gt_masks.shape == (3, gt_boxes.shape[1], hp, wp // 8)  # 8 pixels a byte
        gt_masks = packed_masks.unpack(gt_masks)
        for i in range(b):
            h, w = image_hw[i]
            assert not images[i, h:].any() and not images[i, :, w:].any()
            n = num_gt[i]
            assert np.all(gt_labels[i, :n] >= 1) and not gt_labels[i, n:].any()
            for box, mask in zip(gt_boxes[i, :n], gt_masks[i, :n]):
                ys, xs = np.nonzero(mask)
                assert len(ys)
                # the box is the tight box of the (resized, maybe flipped) mask, within a pixel
                np.testing.assert_allclose([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], box, atol=1.5)
            assert (anchor_labels[i] == 1).any()
            used = anchor_labels[i] >= 0
            assert len(set(anchor_index[i][used])) == used.sum()  # each anchor sampled once
            assert np.all(anchor_index[i][used] < num_anchors[i])


def test_sampled_rows_overwrite_a_reused_slot_with_padding(split):
    """With fewer candidate anchors than rows, the rows after the sampled ones are padding (label -1,
    index 0, target 0) whatever the reused buffer held before."""
    from training.data.rpn_sampling import AnchorSet, sample_rpn_targets
    cfg = _cfg(split)
    anchors = AnchorSet.build(cfg, 64, 64)
    rows = len(anchors) + 8   # more rows than anchors: padding is certain
    index, labels, targets = np.full(rows, 7, np.int32), np.full(rows, 1, np.int32), np.ones((rows, 4), np.float32)
    # a box that no anchor matches exactly, so its foreground rows carry non-zero targets
    sample_rpn_targets(anchors, np.array([[9, 7, 43, 41]], np.float32), np.zeros(1, bool), (64, 64),
                       rng=np.random.default_rng(0), index_out=index, labels_out=labels, targets_out=targets,
                       batch_per_im=rows, fg_ratio=1.0)
    used = labels >= 0
    assert 0 < used.sum() < rows and np.all(used[:used.sum()])          # sampled rows first
    assert np.all(labels[~used] == -1) and not index[~used].any() and not targets[~used].any()
    assert not targets[labels == 0].any() and targets[labels == 1].any()
    assert len(set(index[used])) == used.sum()


def test_same_seed_same_batches(split):
    from training.data.pipeline import TrainingBatches
    cfg = _cfg(split)
    a = list(itertools.islice(iter(TrainingBatches(split.training_roidb(), cfg, seed=7)), 3))
    b = list(itertools.islice(iter(TrainingBatches(split.training_roidb(), cfg, seed=7)), 3))
    for x, y in zip(a, b):
        for u, v in zip(x, y):
            np.testing.assert_array_equal(u, v)


def _copies(batches, n):
    return [[a.copy() for a in batch] for batch in itertools.islice(batches, n)]


def test_a_resumed_pipeline_starts_at_the_batch_of_that_step(split):
    """Started at step S, the first batch is the uninterrupted run's batch S (0-based), draws
    included (short edges in [72, 88], flips, RPN samples), not the run's first batch again."""
    from training.data.pipeline import TrainingBatches
    cfg = _cfg(split, "TRAIN.BATCH_SIZE_PER_GPU=2", "DATA.NUM_WORKERS=0")
    roidb = split.training_roidb()
    assert len(roidb) == 6  # 3 batches a pass over the data: step 4 is in the second pass, step 7 in the third
    uninterrupted = _copies(iter(TrainingBatches(roidb, cfg, seed=3, rank=1)), 9)
    for step in (1, 4, 7):
        resumed = _copies(iter(TrainingBatches(roidb, cfg, seed=3, rank=1, start_step=step)), 2)
        for want, got in zip(uninterrupted[step] + uninterrupted[step + 1], resumed[0] + resumed[1]):
            np.testing.assert_array_equal(want, got)
        first, now = uninterrupted[0], resumed[0]
        assert first[0].shape != now[0].shape or np.any(first[0] != now[0])   # images
        assert np.any(first[7] != now[7])                                      # sampled anchors


def test_missing_image_is_a_clear_error(split, tmp_path):
    from training.data.pipeline import ImageReadError, read_image
    with pytest.raises(ImageReadError, match="cannot read image"):
        read_image(str(tmp_path / "nope.png"))
