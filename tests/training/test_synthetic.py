"""The synthetic dataset is real COCO, deterministic, and its masks are exactly what is painted."""
from __future__ import annotations

import json

import cv2
import numpy as np
import pytest
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO

from training.data import synthetic

SMALL = synthetic.SyntheticSpec(train=12, val=4, size=96, max_objects=4, min_object_size=16,
                                max_object_size=48, seed=7)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    out = tmp_path_factory.mktemp("synthetic")
    synthetic.generate(out, SMALL)
    return out


def _read(path):
    return path.read_bytes()


def test_layout_and_coco_loadable(dataset):
    for split, count in (("train2017", 12), ("val2017", 4)):
        coco = COCO(str(dataset / "annotations" / f"instances_{split}.json"))
        assert len(coco.getImgIds()) == count
        assert [c["name"] for c in coco.loadCats(coco.getCatIds())] == ["circle", "square", "triangle"]
        for img in coco.loadImgs(coco.getImgIds()):
            pixels = cv2.imread(str(dataset / split / img["file_name"]))
            assert pixels.shape == (96, 96, 3) and (img["height"], img["width"]) == (96, 96)
            n = len(coco.getAnnIds(imgIds=img["id"]))
            assert 1 <= n <= 4
        ids = coco.getAnnIds()
        assert min(ids) == 1 and len(set(ids)) == len(ids)  # COCOeval treats id 0 as "unmatched"


def test_same_seed_same_bytes_other_seed_differs(dataset, tmp_path):
    synthetic.generate(tmp_path / "again", SMALL)
    for split in synthetic.SPLITS:
        name = f"annotations/instances_{split}.json"
        assert _read(tmp_path / "again" / name) == _read(dataset / name)
    assert _read(tmp_path / "again/train2017/000000000003.png") == _read(dataset / "train2017/000000000003.png")
    other = synthetic.SyntheticSpec(**{**SMALL.__dict__, "seed": 8})
    synthetic.generate(tmp_path / "other", other)
    assert (_read(tmp_path / "other/annotations/instances_train2017.json")
            != _read(dataset / "annotations/instances_train2017.json"))


def _assert_masks_boxes_and_areas_exact(annotations, image_dir):
    coco = COCO(str(annotations))
    palette = {tuple(c) for c in synthetic.PALETTE}
    kinds = set()
    for img in coco.loadImgs(coco.getImgIds()):
        rgb = cv2.imread(str(image_dir / img["file_name"]))[:, :, ::-1]
        anns = coco.loadAnns(coco.getAnnIds(imgIds=img["id"]))
        masks = [coco.annToMask(a).astype(bool) for a in anns]
        union = np.zeros(rgb.shape[:2], bool)
        for ann, mask in zip(anns, masks):
            kinds.add("rle" if isinstance(ann["segmentation"], dict) else "polygon")
            assert not (union & mask).any(), "visible masks of one image overlap"
            union |= mask
            colours = np.unique(rgb[mask], axis=0)
            assert len(colours) == 1 and tuple(colours[0]) in palette, "a mask covers more than its shape"
            ring = cv2.dilate(mask.astype(np.uint8), np.ones((3, 3), np.uint8)).astype(bool) & ~mask
            outside = ring & ~np.any([m for m in masks if m is not mask] or [np.zeros_like(mask)], axis=0)
            assert not np.all(rgb[outside] == colours[0], axis=1).any(), "the shape extends past its mask"
            rle = mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))
            assert ann["area"] == mask.sum() == mask_utils.area(rle)
            assert ann["bbox"] == pytest.approx(mask_utils.toBbox(rle).tolist())
            assert ann["iscrowd"] == 0
        # Nothing outside the annotated masks has a shape colour.
        background = {tuple(c) for c in np.unique(rgb[~union], axis=0)}
        assert not background & palette
    return kinds




def test_masks_boxes_and_areas_are_exact(dataset):
    kinds = _assert_masks_boxes_and_areas_exact(dataset / "annotations" / "instances_train2017.json",
                                                dataset / "train2017")
    assert kinds == {"rle", "polygon"}  # both fully visible and occluded shapes occur


OTHER = synthetic.SyntheticSpec(train=10, val=3, size=96, max_objects=4, min_object_size=24, max_object_size=48,
                                seed=5, categories=("star", "cross", "hexagon"), layout="files")


def _shoelace(xy):
    x, y = xy[:, 0], xy[:, 1]
    return 0.5 * abs(np.dot(x, np.roll(y, 1)) - np.dot(y, np.roll(x, 1)))


def test_other_shapes_in_a_dataset_s_own_layout(tmp_path):
    synthetic.generate(tmp_path, OTHER)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["images", "train.json", "val.json"]
    for split, count in (("train", 10), ("val", 3)):
        data = json.loads((tmp_path / f"{split}.json").read_text())
        # catalogue ids, in the order asked for: not 1..C
        assert [(c["id"], c["name"]) for c in data["categories"]] == [(5, "star"), (6, "cross"), (4, "hexagon")]
        assert len(data["images"]) == count
        assert all((tmp_path / "images" / split / i["file_name"]).is_file() for i in data["images"])
    _assert_masks_boxes_and_areas_exact(tmp_path / "train.json", tmp_path / "images" / "train")
    # Each fully visible shape's polygon has its shape's area, from its circumradius R (the farthest
    # vertex from the centre): a five-pointed star 5 R r sin 36 deg with r = 0.45 R; a regular hexagon
    # 3 sqrt(3) / 2 R^2; a plus sign of extent 2a (R^2 = a^2 + b^2, arms 2b = 2a / 3) 4 a^2 - 4 (a - b)^2.
    data = json.loads((tmp_path / "train.json").read_text())
    seen = set()
    for ann in data["annotations"]:
        if isinstance(ann["segmentation"], dict):
            continue
        xy = np.array(ann["segmentation"][0]).reshape(-1, 2)
        radius = np.linalg.norm(xy - xy.mean(axis=0), axis=1).max()
        name = {4: "hexagon", 5: "star", 6: "cross"}[ann["category_id"]]
        if name == "star":
            expected = 5 * radius * 0.45 * radius * np.sin(np.radians(36))
        elif name == "hexagon":
            expected = 3 * np.sqrt(3) / 2 * radius ** 2
        else:
            a = radius / np.sqrt(1 + 1 / 9)
            expected = 4 * a ** 2 - 4 * (a - a / 3) ** 2
        assert _shoelace(xy) == pytest.approx(expected, rel=1e-3), name
        assert len(xy) == {"star": 10, "hexagon": 6, "cross": 12}[name]
        seen.add(name)
    assert seen == {"star", "cross", "hexagon"}


def test_bad_options_are_refused(tmp_path):
    with pytest.raises(ValueError, match="max-object-size"):
        synthetic.generate(tmp_path, synthetic.SyntheticSpec(size=64, max_object_size=100))
    with pytest.raises(ValueError, match="--train"):
        synthetic.generate(tmp_path, synthetic.SyntheticSpec(train=0))
    with pytest.raises(ValueError, match="--categories must name distinct shapes among circle"):
        synthetic.generate(tmp_path, synthetic.SyntheticSpec(categories=("circle", "blob")))
    with pytest.raises(ValueError, match="--layout"):
        synthetic.generate(tmp_path, synthetic.SyntheticSpec(layout="voc"))
    assert not (tmp_path / "annotations").exists()


def test_command_line(tmp_path, capsys):
    assert synthetic.main(["--output", str(tmp_path), "--train", "2", "--val", "1", "--size", "64",
                           "--max-object-size", "32", "--format", "jpg", "--seed", "3"]) == 0
    data = json.loads((tmp_path / "annotations/instances_val2017.json").read_text())
    assert data["images"][0]["file_name"].endswith(".jpg")
    assert (tmp_path / "val2017" / data["images"][0]["file_name"]).is_file()
    assert "train2017: 2 images" in capsys.readouterr().out
