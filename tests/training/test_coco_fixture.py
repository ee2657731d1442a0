"""The COCO-realistic fixture has the properties of COCO 2017 it claims, and the reader maps them."""
from __future__ import annotations

import cv2
import numpy as np
import pytest
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO

import coco_fixture
from training.data.augment import resized_shape

SPEC = coco_fixture.CocoFixtureSpec(train=16, val=8, seed=1)


@pytest.fixture(scope="module")
def fixture_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("coco_fixture")
    coco_fixture.generate(out, SPEC)
    return out


def test_sizes_kinds_and_categories_are_cocos(fixture_dir):
    coco = COCO(str(fixture_dir / "annotations" / "instances_train2017.json"))
    images = coco.loadImgs(sorted(coco.getImgIds()))
    assert {(i["width"], i["height"]) for i in images} == set(coco_fixture.COCO_IMAGE_SIZES)
    assert any(i["width"] < i["height"] for i in images) and any(i["width"] > i["height"] for i in images)
    ids = [i["id"] for i in images]
    assert ids != list(range(1, len(ids) + 1)), "image ids should be sparse, as in COCO"
    cat_ids = sorted(coco.getCatIds())
    assert len(cat_ids) == 80 and cat_ids[0] == 1 and cat_ids[-1] == 90 and 12 not in cat_ids
    assert coco.cats[90]["name"] == "toothbrush" and coco.cats[1]["name"] == "person"

    grayscale = empty = 0
    for img in images:
        on_disk = cv2.imread(str(fixture_dir / "train2017" / img["file_name"]), cv2.IMREAD_UNCHANGED)
        assert on_disk.shape[:2] == (img["height"], img["width"])
        grayscale += on_disk.ndim == 2
        empty += not coco.getAnnIds(imgIds=img["id"])
    assert grayscale >= 2 and empty >= 2

    anns = coco.loadAnns(coco.getAnnIds())
    crowds = [a for a in anns if a["iscrowd"]]
    assert crowds and all(isinstance(a["segmentation"]["counts"], list) for a in crowds)  # uncompressed, as COCO
    plain = [a for a in anns if not a["iscrowd"]]
    assert all(isinstance(a["segmentation"], list) for a in plain)
    small = sum(a["area"] < coco_fixture.SMALL_AREA for a in plain) / len(plain)
    assert 0.3 <= small <= 0.8, small
    assert 4 <= len(plain) / (len(images) - empty) <= 10  # about COCO's 7 per annotated image
    for a in anns:  # area and bbox are what pycocotools computes from the segmentation
        rle = coco.annToRLE(a)
        assert abs(int(mask_utils.area(rle)) - a["area"]) <= max(3, 0.02 * a["area"])
        np.testing.assert_allclose(mask_utils.toBbox(rle), a["bbox"], atol=1.0)


def test_default_resize_gives_odd_stride_32_grids():
    odd = 0
    for width, height in coco_fixture.COCO_IMAGE_SIZES:
        h, w = resized_shape(height, width, 800, 1333)
        assert min(h, w) == 800 and max(h, w) <= 1333
        odd += (-(-h // 32)) % 2 == 1 or (-(-w // 32)) % 2 == 1
    assert odd == len(coco_fixture.COCO_IMAGE_SIZES)


def test_reader_maps_sparse_ids_and_keeps_crowds(fixture_dir):
    from training.data.coco import load_split
    split = load_split(fixture_dir, "train2017")
    assert split.num_classes == 80 and split.contiguous_to_coco_id[80] == 90
    assert split.class_names[1] == "person" and split.class_names[-1] == "toothbrush"
    assert len(split.training_roidb()) < len(split.roidb)  # unannotated images are not trained on
    crowd = [r for r in split.roidb if r["is_crowd"].any()]
    assert crowd and all(isinstance(r["segmentation"][int(np.argmax(r["is_crowd"]))], dict) for r in crowd)


def test_deterministic(fixture_dir, tmp_path):
    coco_fixture.generate(tmp_path, SPEC)
    for name in ("annotations/instances_train2017.json", "annotations/instances_val2017.json"):
        assert (tmp_path / name).read_bytes() == (fixture_dir / name).read_bytes()
    first = sorted((fixture_dir / "train2017").iterdir())[3]
    assert (tmp_path / "train2017" / first.name).read_bytes() == first.read_bytes()


def test_bad_options_are_refused(tmp_path):
    with pytest.raises(ValueError, match="max-objects"):
        coco_fixture.generate(tmp_path, coco_fixture.CocoFixtureSpec(min_objects=5, max_objects=2))
    assert not (tmp_path / "annotations").exists()
