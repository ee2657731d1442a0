"""The COCO reader: split-name resolution, record format, and errors before training."""
from __future__ import annotations

import json

import cv2
import numpy as np
import pytest

from training.data import coco, synthetic


def _write_dataset(base, split="train2017", images=None, annotations=None, categories=None, files=None):
    images = images if images is not None else [{"id": 5, "file_name": "a.png", "height": 40, "width": 50}]
    categories = categories if categories is not None else [{"id": 3, "name": "cat"}, {"id": 9, "name": "dog"}]
    (base / "annotations").mkdir(parents=True, exist_ok=True)
    (base / "annotations" / f"instances_{split}.json").write_text(json.dumps(
        {"images": images, "annotations": annotations or [], "categories": categories}))
    (base / split).mkdir(exist_ok=True)
    for img in images if files is None else files:
        cv2.imwrite(str(base / split / img["file_name"]), np.zeros((img["height"], img["width"], 3), np.uint8))


def _ann(ann_id, cat, bbox, seg=None, iscrowd=0, area=100.0):
    x, y, w, h = bbox
    seg = seg if seg is not None else [[x, y, x + w, y, x + w, y + h, x, y + h]]
    return {"id": ann_id, "image_id": 5, "category_id": cat, "bbox": bbox, "segmentation": seg,
            "iscrowd": iscrowd, "area": area}


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    out = tmp_path_factory.mktemp("shapes")
    synthetic.generate(out, synthetic.SyntheticSpec(train=6, val=2, size=64, max_object_size=32, seed=1))
    return out


@pytest.mark.parametrize("split", ["coco_train2017", "train2017"])
def test_split_names_resolve(shapes, split):
    data = coco.load_split(shapes, split)
    assert data.annotation_file == (shapes / "annotations/instances_train2017.json").resolve()
    assert data.image_dir == (shapes / "train2017").resolve()
    assert len(data.roidb) == 6


def test_exact_name_wins_over_stripped_prefix(tmp_path):
    _write_dataset(tmp_path, split="coco_mine", annotations=[_ann(1, 3, [1, 1, 10, 10])])
    _write_dataset(tmp_path, split="mine", annotations=[_ann(1, 3, [1, 1, 10, 10])])
    assert coco.load_split(tmp_path, "coco_mine").annotation_file.name == "instances_coco_mine.json"


def test_record_format(shapes):
    data = coco.load_split(shapes, "coco_val2017")
    assert data.class_names == ["BG", "circle", "square", "triangle"] and data.num_classes == 3
    gt = data.coco
    for record in data.roidb:
        assert record["file_name"].startswith(str(shapes.resolve())) and record["height"] == 64
        n = len(record["boxes"])
        assert record["boxes"].dtype == np.float32 and record["boxes"].shape == (n, 4)
        assert record["class"].dtype == np.int32 and record["is_crowd"].dtype == np.int8
        assert len(record["class"]) == len(record["is_crowd"]) == len(record["segmentation"]) == n
        anns = gt.loadAnns(gt.getAnnIds(imgIds=record["image_id"]))
        expected = [[a["bbox"][0], a["bbox"][1], a["bbox"][0] + a["bbox"][2], a["bbox"][1] + a["bbox"][3]]
                    for a in anns]
        np.testing.assert_allclose(record["boxes"], expected)
        assert [data.contiguous_to_coco_id[int(c)] for c in record["class"]] == [a["category_id"] for a in anns]


def test_non_contiguous_ids_crowd_rle_and_degenerate_boxes(tmp_path):
    crowd_rle = {"size": [40, 50], "counts": [200, 30, 1770]}  # uncompressed, column-major runs
    anns = [
        _ann(1, 9, [10, 5, 20, 10]),
        _ann(2, 3, [0, 0, 0, 10]),                       # zero width: dropped
        _ann(3, 3, [45, 35, 20, 20]),                    # partly outside: clipped to the image
        _ann(4, 3, [2, 2, 5, 5], seg=[[1, 2, 3, 4]]),    # polygon of 2 points: dropped
        _ann(5, 9, [4, 0, 1, 30], seg=crowd_rle, iscrowd=1),
    ]
    _write_dataset(tmp_path, annotations=anns)
    data = coco.load_split(tmp_path, "train2017")
    assert data.coco_id_to_contiguous == {3: 1, 9: 2} and data.class_names == ["BG", "cat", "dog"]
    (record,) = data.roidb
    np.testing.assert_allclose(record["boxes"], [[10, 5, 30, 15], [45, 35, 50, 40], [4, 0, 5, 30]])
    assert record["class"].tolist() == [2, 1, 2] and record["is_crowd"].tolist() == [0, 0, 1]
    rle = record["segmentation"][2]
    assert rle["size"] == [40, 50] and isinstance(rle["counts"], bytes)
    polygon = record["segmentation"][0][0]
    assert polygon.dtype == np.float64 and polygon.tolist() == [10, 5, 30, 5, 30, 15, 10, 15]


def test_missing_annotation_file_names_paths_and_layout(tmp_path):
    (tmp_path / "annotations").mkdir()
    with pytest.raises(coco.DatasetError) as err:
        coco.load_split(tmp_path, "coco_train2017")
    message = str(err.value)
    assert "instances_coco_train2017.json" in message and "instances_train2017.json" in message
    assert "expected layout" in message
    with pytest.raises(coco.DatasetError, match="does not exist"):
        coco.load_split(tmp_path / "nowhere", "train2017")


def test_missing_images_are_named(tmp_path):
    images = [{"id": i, "file_name": f"{i}.png", "height": 8, "width": 8} for i in range(1, 9)]
    _write_dataset(tmp_path, images=images, files=images[:1],
                   annotations=[dict(_ann(1, 3, [1, 1, 4, 4]), image_id=1)])
    with pytest.raises(coco.DatasetError, match=r"7 image\(s\).*2\.png, 3\.png, 4\.png, 5\.png, 6\.png \.\.\."):
        coco.load_split(tmp_path, "train2017")
    assert len(coco.load_split(tmp_path, "train2017", validate=False).roidb) == 8  # only the first checked


def test_empty_splits_are_refused(tmp_path):
    _write_dataset(tmp_path, split="noimages", images=[])
    with pytest.raises(coco.DatasetError, match="lists no images"):
        coco.load_split(tmp_path, "noimages")
    _write_dataset(tmp_path, split="noanns", annotations=[])
    with pytest.raises(coco.DatasetError, match="nothing to train on"):
        coco.load_split(tmp_path, "noanns")
    assert len(coco.load_split(tmp_path, "noanns", require_annotations=False).roidb) == 1


def test_not_a_coco_file(tmp_path):
    (tmp_path / "annotations").mkdir()
    (tmp_path / "annotations/instances_x.json").write_text("{\"images\": 3}")
    with pytest.raises(coco.DatasetError, match="not a COCO instances file"):
        coco.load_split(tmp_path, "x")


def test_splits_must_share_categories(tmp_path, shapes):
    data = coco.load_splits(shapes, ("coco_train2017", "val2017"))
    assert [d.name for d in data] == ["coco_train2017", "val2017"]
    _write_dataset(tmp_path, annotations=[_ann(1, 3, [1, 1, 4, 4])])
    (tmp_path / "annotations/instances_val2017.json").write_text(
        (shapes / "annotations/instances_val2017.json").read_text())
    (tmp_path / "val2017").symlink_to(shapes / "val2017")
    with pytest.raises(coco.DatasetError, match="different categories"):
        coco.load_splits(tmp_path, ["train2017", "val2017"])


def test_the_trainer_keeps_the_training_annotations_once(shapes):
    """What training.train.load_data returns holds the records, not also pycocotools' COCO object
    of the parsed file (its annotation dicts, polygons as Python floats), and the records' polygons
    are compact arrays (8 bytes a number, not a 24-byte float and an 8-byte list slot)."""
    import gc
    import weakref

    from pycocotools.coco import COCO
    from training.config import new_config
    from training.train import load_data
    cfg = new_config()
    cfg.update_args([f"DATA.BASEDIR={str(shapes)!r}", "DATA.TRAIN=('train2017',)", "DATA.VAL=()"])
    gc.collect()
    existing = {id(o) for o in gc.get_objects() if isinstance(o, COCO)}
    kept = load_data(cfg)
    gc.collect()
    alive = [weakref.ref(o) for o in gc.get_objects() if isinstance(o, COCO) and id(o) not in existing]
    assert not alive, "a COCO object of the training annotations outlives load_data"
    roidb = kept[1]
    polygons = [p for r in roidb for segm in r["segmentation"] if isinstance(segm, list) for p in segm]
    assert polygons and all(isinstance(p, np.ndarray) and p.dtype == np.float64 for p in polygons)
