"""Resize and flip move image, boxes and masks together; masks rasterise to the polygon's area."""
from __future__ import annotations

import math

import numpy as np
import pytest
from pycocotools import mask as mask_utils

from training.data import augment, coco, synthetic


def _shoelace(poly):
    xy = np.asarray(poly).reshape(-1, 2)
    x, y = xy[:, 0], xy[:, 1]
    return 0.5 * abs(np.dot(x, np.roll(y, 1)) - np.dot(y, np.roll(x, 1)))


@pytest.mark.parametrize("hw, short, max_size, expected", [
    ((100, 200), 50, 1000, (50, 100)),
    ((200, 100), 50, 1000, (100, 50)),
    ((100, 400), 100, 200, (50, 200)),     # the longer side caps the scale
    ((97, 131), 64, 1333, (64, 86)),
    # A side at exactly .5 rounds up, as tensorpack's CustomResize (int(x + 0.5)) does: 5 * 5/2 =
    # 12.5 -> 13 and 5 * 3/2 = 7.5 -> 8 (round half to even would give 12 and 8).
    ((2, 5), 5, 0, (5, 13)),
    ((5, 2), 5, 0, (13, 5)),
    ((2, 3), 5, 0, (5, 8)),
    # Capped: tensorpack scales the already-scaled sides again: 1333 x 800 * 0.5 -> 666.5 -> 667.
    ((800, 1333), 800, 666.5, (400, 667)),
])
def test_resized_shape(hw, short, max_size, expected):
    assert augment.resized_shape(*hw, short, max_size) == expected
    image, scale = augment.resize_shorter_side(np.zeros(hw + (3,), np.uint8), short, max_size)
    assert image.shape[:2] == expected
    assert scale == (expected[1] / hw[1], expected[0] / hw[0])


def test_box_after_resize_is_scaled_exactly_and_matches_the_pixels():
    image = np.zeros((97, 131, 3), np.uint8)
    image[20:60, 30:90] = 255                      # box [30, 20, 90, 60]
    resized, (sx, sy) = augment.resize_shorter_side(image, 194, 1000, interpolation=0)  # nearest
    box = augment.scale_boxes(np.array([[30, 20, 90, 60]]), (sx, sy))
    np.testing.assert_allclose(box, [[30 * sx, 20 * sy, 90 * sx, 60 * sy]], rtol=1e-6)
    assert (sx, sy) == (262 / 131, 194 / 97) == (2.0, 2.0)
    ys, xs = np.nonzero(resized[:, :, 0])
    np.testing.assert_allclose([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], box[0])


def test_flip_twice_is_identity():
    rng = np.random.default_rng(0)
    image = rng.integers(0, 255, (30, 41, 3), dtype=np.uint8)
    boxes = np.array([[0, 1, 10, 12], [3.5, 2.25, 41, 30]], np.float32)
    polys = [rng.uniform(0, 30, 10).tolist()]
    np.testing.assert_array_equal(augment.flip_image(augment.flip_image(image)), image)
    np.testing.assert_allclose(augment.flip_boxes(augment.flip_boxes(boxes, 41), 41), boxes)
    np.testing.assert_allclose(augment.flip_polygons(augment.flip_polygons(polys, 41), 41), polys)
    np.testing.assert_allclose(augment.flip_boxes(boxes, 41)[0], [31, 1, 41, 12])
    masks = rng.integers(0, 2, (2, 30, 41), dtype=np.uint8)
    np.testing.assert_array_equal(augment.flip_masks(masks)[1], augment.flip_image(masks[1]))


def test_mask_area_matches_polygon_area():
    rng = np.random.default_rng(1)
    for _ in range(20):
        r, cx, cy = rng.uniform(8, 25), rng.uniform(30, 70), rng.uniform(30, 50)
        k = int(rng.integers(3, 40))
        angles = np.sort(rng.uniform(0, 2 * math.pi, k)) if k < 32 else np.linspace(0, 2 * math.pi, k, endpoint=False)
        poly = np.stack([cx + r * np.cos(angles), cy + r * np.sin(angles)], 1).reshape(-1).tolist()
        mask = augment.segmentation_to_mask([poly], 80, 100)
        area = _shoelace(poly)
        perimeter_px = 2 * math.pi * r
        assert mask.dtype == np.uint8 and mask.shape == (80, 100)
        assert abs(int(mask.sum()) - area) <= 0.5 * perimeter_px + 2  # boundary pixels only


def test_flipped_polygon_mask_is_the_flipped_mask():
    # Axis-aligned integer rectangles rasterise identically either way.
    rect = [[10, 5, 30, 5, 30, 15, 10, 15]]
    mask = augment.segmentation_to_mask(rect, 40, 50)
    assert mask.sum() == 200
    np.testing.assert_array_equal(augment.flip_image(mask),
                                  augment.segmentation_to_mask(augment.flip_polygons(rect, 50), 40, 50))


def test_rle_and_polygon_masks_agree():
    poly = [[12.0, 4.0, 40.0, 9.0, 30.0, 33.0]]
    rle = mask_utils.merge(mask_utils.frPyObjects(poly, 36, 48))
    np.testing.assert_array_equal(augment.segmentation_to_mask(rle, 36, 48),
                                  augment.segmentation_to_mask(poly, 36, 48))
    with pytest.raises(ValueError, match="RLE of size"):
        augment.segmentation_to_mask(rle, 40, 48)
    assert augment.instance_masks([], 5, 6).shape == (0, 5, 6)


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    out = tmp_path_factory.mktemp("shapes")
    synthetic.generate(out, synthetic.SyntheticSpec(train=8, val=1, size=80, max_object_size=40, seed=4))
    return coco.load_split(out, "train2017")


@pytest.mark.parametrize("flip", [False, True])
def test_augment_record_keeps_boxes_and_masks_together(shapes, flip):
    import cv2
    kinds = set()
    for record in shapes.roidb:
        image = cv2.imread(record["file_name"])
        out = augment.augment_record(image, record, short_size=120, max_size=1000, flip=flip)
        assert out["image"].shape == (120, 120, 3) and out["scale"] == (1.5, 1.5)
        assert out["masks"].shape == (len(record["boxes"]), 120, 120)
        for box, mask, seg in zip(out["boxes"], out["masks"], record["segmentation"]):
            kinds.add(type(seg).__name__)
            ys, xs = np.nonzero(mask)
            # The mask's extent is the box's, to within the resampling of one source pixel.
            np.testing.assert_allclose([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], box, atol=1.6)
        original = augment.instance_masks(record["segmentation"], record["height"], record["width"])
        expected = np.stack([cv2.resize(m, (120, 120), interpolation=cv2.INTER_NEAREST) for m in original])
        if flip:
            expected = augment.flip_masks(expected)
        inter = np.logical_and(out["masks"], expected).sum()
        union = np.logical_or(out["masks"], expected).sum()
        assert inter / union > 0.93
    assert kinds == {"list", "dict"}  # polygons and RLE both went through


def test_sample_short_size_in_range():
    rng = np.random.default_rng(0)
    sizes = {augment.sample_short_size(rng, [96, 100]) for _ in range(200)}
    assert sizes == {96, 97, 98, 99, 100}
    assert augment.sample_short_size(rng, [128, 128]) == 128
