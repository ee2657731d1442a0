"""The input pipeline at COCO's shapes: 800 px short edge, max 1333, P2-P6 default anchors, batch 4,
on the COCO-realistic fixture (COCO image sizes, grayscale and crowd images, small objects)."""
from __future__ import annotations

import itertools

import cv2
import numpy as np
import pytest

from training.config import finalize, new_config

COCO_BATCH = ["DATA.TRAIN=('train2017',)", "DATA.VAL=('val2017',)", "TRAIN.BATCH_SIZE_PER_GPU=4",
              "DATA.NUM_WORKERS=2"]


@pytest.fixture(scope="module")
def coco_split(tmp_path_factory):
    from training.data.coco import load_split
    from coco_fixture import CocoFixtureSpec, generate
    out = tmp_path_factory.mktemp("coco_pipeline")
    generate(out, CocoFixtureSpec(train=16, val=1, seed=4))
    return load_split(out, "train2017")


def _cfg(split, *extra):
    cfg = new_config()
    cfg.update_args(COCO_BATCH + list(extra))
    return finalize(cfg, num_ranks=1, class_names=split.class_names, has_gpu=False)


def test_packed_masks_round_trip_in_numpy_and_tensorflow(tf_session):
    from training.data import packed_masks
    tf, sess = tf_session
    masks = (np.random.default_rng(0).random((3, 5, 40)) < 0.3).astype(np.uint8)
    packed = packed_masks.pack(masks)
    assert packed.shape == (3, 5, 5) and packed.dtype == np.uint8
    np.testing.assert_array_equal(packed_masks.unpack(packed), masks)
    np.testing.assert_array_equal(sess.run(packed_masks.tf_unpack(tf.constant(packed))), masks)


def test_windowed_polygon_raster_matches_the_full_image_raster(coco_split):
    from training.data import augment, packed_masks
    from training.data.pipeline import _packed_polygon_mask
    checked = 0
    for record in coco_split.roidb:
        h, w = record["height"], record["width"]
        for segm, crowd in zip(record["segmentation"], record["is_crowd"]):
            if crowd:
                continue
            for flip in (False, True):
                polygons = augment.scale_polygons(segm, (1.7, 1.7))
                if flip:
                    polygons = augment.flip_polygons(polygons, round(w * 1.7))
                full = augment.segmentation_to_mask(polygons, round(h * 1.7), round(w * 1.7))
                y0, xb0, packed = _packed_polygon_mask(polygons, round(h * 1.7), round(w * 1.7))
                placed = np.zeros((full.shape[0], -(-full.shape[1] // 64) * 8), np.uint8)
                placed[y0:y0 + packed.shape[0], xb0:xb0 + packed.shape[1]] = packed
                windowed = packed_masks.unpack(placed, full.shape[1])
                # pycocotools' vertex rounding can flip an edge pixel after the window's integer shift
                assert np.sum(windowed != full) <= max(3, 0.01 * full.sum())
                checked += 1
    assert checked > 50


def test_banded_rpn_labels_equal_the_dense_rules(coco_split):
    """Before sampling, the pipeline's labels are exactly those of anchors.rpn_targets (dense IoU)."""
    from training.data.pipeline import draw_augmentation, padded_size
    from training.data import augment
    from training.data.rpn_sampling import AnchorSet, classify_anchors
    from training.model.anchors import rpn_targets
    cfg = _cfg(coco_split)
    rng = np.random.default_rng(0)
    records = [r for r in coco_split.training_roidb()][:6]
    for crowd_thresh in (9.99, 0.5):
        for record in records:
            aug = draw_augmentation(record, cfg, rng)
            boxes = augment.scale_boxes(record["boxes"], (aug.width / record["width"], aug.height / record["height"]))
            anchors = AnchorSet.build(cfg, *padded_size(aug.height + 32, aug.width))  # padded beyond the image
            fg, bg, _ = classify_anchors(anchors, boxes, record["is_crowd"], (aug.height, aug.width),
                                         positive_thresh=0.7, negative_thresh=0.3, crowd_overlap_thresh=crowd_thresh)
            dense, _ = rpn_targets(anchors.boxes, boxes, record["is_crowd"], (aug.height, aug.width), rng=rng,
                                   batch_per_im=len(anchors), fg_ratio=1.0, crowd_overlap_thresh=crowd_thresh)
            np.testing.assert_array_equal(fg, dense == 1)
            np.testing.assert_array_equal(bg, dense == 0)


def test_coco_scale_batches(coco_split):
    from training.data import packed_masks
    from training.data.pipeline import TrainingBatches, read_image
    from training.model.anchors import all_anchors
    from training.model.box_ops import np_decode, np_iou
    cfg = _cfg(coco_split)
    seen_portrait = seen_landscape = seen_gray = 0
    for batch in itertools.islice(iter(TrainingBatches(coco_split.training_roidb(), cfg, seed=1)), 3):
        (images, image_hw, gt_boxes, gt_labels, num_gt, gt_masks, num_anchors, anchor_index, anchor_labels,
         anchor_targets) = batch
        b, hp, wp, _ = images.shape
        assert b == 4 and images.dtype == np.uint8 and hp % 32 == 0 and wp % 32 == 0
        anchors = np.concatenate(all_anchors(cfg, hp, wp))
        assert np.all(num_anchors == len(anchors))
        assert anchor_labels.shape == (4, cfg.RPN.BATCH_PER_IM) and anchor_targets.shape == (4, cfg.RPN.BATCH_PER_IM, 4)
        assert gt_masks.shape == (4, gt_boxes.shape[1], hp, wp // 8)
        masks = packed_masks.unpack(gt_masks)
        for i in range(b):
            h, w = image_hw[i]
            assert min(h, w) == 800 and max(h, w) <= 1333
            seen_portrait += h > w
            seen_landscape += w > h
            seen_gray += bool(np.all(images[i, :h, :w, 0] == images[i, :h, :w, 2]))
            assert not images[i, h:].any() and not images[i, :, w:].any()
            n = num_gt[i]
            assert np.all(gt_labels[i, :n] >= 1) and np.all(gt_labels[i, :n] <= 80) and not gt_labels[i, n:].any()
            assert not masks[i, n:].any() and not masks[i, :, h:].any() and not masks[i, :, :, w:].any()
            for box, mask in zip(gt_boxes[i, :n], masks[i, :n]):
                ys, xs = np.nonzero(mask)
                assert len(ys)
                # the annotation's box is the raster's at the original size, upscaled up to 2.13x (500x375 ->
                # 1067x800), where a polygon's thin tip can gain or lose a few pixels: aligned, not identical
                tight = np.array([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], np.float32)
                side = np.array([box[2] - box[0], box[3] - box[1]] * 2)
                assert np.all(np.abs(tight - box) <= 2.5 + 0.04 * side), (tight, box)
            labels, index = anchor_labels[i], anchor_index[i]
            assert 1 <= (labels == 1).sum() <= 128 and (labels >= 0).sum() <= 256
            assert not anchor_targets[i][labels != 1].any()
            # each foreground row's target, decoded from the anchor its index names, is one of the image's boxes
            fg = labels == 1
            decoded = np_decode(anchor_targets[i][fg], anchors[index[fg]])
            nearest = np.abs(decoded[:, None] - gt_boxes[i, :n][None]).max(axis=2).min(axis=1)
            assert np.all(nearest < 0.05), nearest.max()
            # and a background row's anchor overlaps no box much (IoU < 0.3, the negative threshold)
            assert np.all(np_iou(anchors[index[labels == 0]], gt_boxes[i, :n]).max(axis=1, initial=0) < 0.3)
    assert seen_portrait and seen_landscape and seen_gray
    # BGR, as decoded: a flip-free, resize-free check on the first record's pixels
    record = coco_split.training_roidb()[0]
    assert np.array_equal(read_image(record["file_name"]), cv2.imread(record["file_name"], cv2.IMREAD_COLOR))


def test_grouped_batches_hold_one_orientation(coco_split):
    """By default landscape and portrait images (the fixture's COCO sizes: 4 landscape, 2 portrait)
    never share a batch, so a batch is padded along its long side only; DATA.ASPECT_RATIO_GROUPING=False
    mixes them (same seed)."""
    from training.data.pipeline import TrainingBatches
    small = ["PREPROC.TRAIN_SHORT_EDGE_SIZE=[64, 64]", "PREPROC.TEST_SHORT_EDGE_SIZE=64", "PREPROC.MAX_SIZE=128",
             "DATA.NUM_WORKERS=0"]
    mixed = {}
    for grouping in (True, False):
        cfg = _cfg(coco_split, *small, f"DATA.ASPECT_RATIO_GROUPING={grouping}")
        mixed[grouping] = 0
        for batch in itertools.islice(iter(TrainingBatches(coco_split.training_roidb(), cfg, seed=1)), 10):
            images, image_hw = batch[0], batch[1]
            landscape = image_hw[:, 1] > image_hw[:, 0]
            if landscape.all() or not landscape.any():
                # padded to the images' own orientation: 64 px short side, up to 96 px long side
                assert images.shape[1:3] == ((64, 96) if landscape.all() else (96, 64))
            else:
                mixed[grouping] += 1
    assert mixed == {True: 0, False: mixed[False]} and mixed[False] > 0


def test_host_memory_per_batch_is_bounded(coco_split):
    """uint8 images and packed masks: a COCO batch of 4 is a fraction of the float32 / byte-mask form."""
    from training.data.pipeline import TrainingBatches
    cfg = _cfg(coco_split)
    batch = next(iter(TrainingBatches(coco_split.training_roidb(), cfg, seed=2)))
    images, gt_masks = batch[0], batch[5]
    assert images.nbytes == images.size and gt_masks.nbytes * 8 == gt_masks.size * 8
    unpacked_float_form = images.size * 4 + gt_masks.size * 8
    assert sum(x.nbytes for x in batch) < 0.45 * unpacked_float_form
    # the RPN's sampled anchor rows, not a label and target per anchor (~370k an image here: ~30 MB a batch)
    assert sum(x.nbytes for x in batch[6:]) <= 4 * (4 + cfg.RPN.BATCH_PER_IM * 24)
