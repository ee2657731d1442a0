"""maskrcnn check-data: a dataset with one of every defect, written by hand, is reported
kind by kind with the counts derived below; a synthetic dataset passes; samples are drawn."""
from __future__ import annotations

import json
import re

import cv2
import numpy as np
import pytest
from pycocotools import mask as mask_utils

from training.data import check, synthetic

H, W = 30, 40   # the good image: 30 rows, 40 columns


def _polygon(x, y, w, h):
    return [[x, y, x + w, y, x + w, y + h, x, y + h]]


def _ann(ann_id, bbox=(2, 2, 10, 10), *, image_id=1, category_id=1, **fields):
    ann = {"id": ann_id, "image_id": image_id, "category_id": category_id, "bbox": list(bbox),
           "area": 100.0, "iscrowd": 0}
    if "segmentation" not in fields:
        ann["segmentation"] = _polygon(*bbox)
    ann.update(fields)
    return {k: v for k, v in ann.items() if v is not None}


def _crowd_rle() -> dict:
    mask = np.zeros((H, W), np.uint8, order="F")
    mask[5:15, 20:30] = 1
    rle = mask_utils.encode(mask)
    return {"size": rle["size"], "counts": rle["counts"].decode("ascii")}


@pytest.fixture(scope="module")
def broken(tmp_path_factory):
    """Every defect the check knows, each exactly as often as EXPECTED says."""
    root = tmp_path_factory.mktemp("broken")
    photos = root / "photos"
    photos.mkdir()
    rng = np.random.default_rng(0)
    cv2.imwrite(str(photos / "ok.png"), rng.integers(0, 255, (H, W, 3), dtype=np.uint8))
    (photos / "corrupt.png").write_bytes(b"this is text, not a PNG")
    cv2.imwrite(str(photos / "small.png"), np.zeros((10, 20, 3), np.uint8))       # JSON says 40 x 30
    cv2.imwrite(str(photos / "whole.jpg"), rng.integers(0, 255, (H, W, 3), dtype=np.uint8))
    whole = (photos / "whole.jpg").read_bytes()
    (photos / "cut.jpg").write_bytes(whole[:len(whole) // 2])                      # a download cut short
    cv2.imwrite(str(photos / "whole.png"), rng.integers(0, 255, (H, W, 3), dtype=np.uint8))
    whole = (photos / "whole.png").read_bytes()
    (photos / "cut.png").write_bytes(whole[:len(whole) // 2])

    def image(i, name):
        return {"id": i, "file_name": name, "width": W, "height": H}

    good_rle = _crowd_rle()
    images = [image(1, "ok.png"), image(2, "missing.png"), image(3, "corrupt.png"), image(4, "small.png"),
              image(5, "cut.jpg"), image(6, "cut.png"), image(1, "again.png"),
              {"id": 7, "file_name": "ok.png", "width": 0, "height": H}]
    categories = [{"id": 1, "name": "cat"}, {"id": 2, "name": "dog"}, {"id": 2, "name": "dog again"},
                  {"id": 3, "name": "bird"}]
    annotations = [
        _ann(1),                                                   # fine
        _ann(2, (0, 0, 0, 5), category_id=2, segmentation=_polygon(0, 0, 4, 5)),   # zero width
        _ann(3, (50, 40, 5, 5)),                                   # wholly right of and below the image
        _ann(4, (35, 25, 10, 10)),                                 # 5 px past the right and bottom edges
        _ann(5, segmentation=[[1, 1, 2, 2]]),                      # a polygon of 2 points
        _ann(6, segmentation=[[0, 0, 5, 5, 10, 10]]),              # 3 points on a line
        _ann(7, segmentation=[]),                                  # no polygon at all
        _ann(8, segmentation={"size": [10, 10], "counts": [100]}),            # RLE for a 10 x 10 image
        _ann(9, segmentation={"size": [H, W], "counts": [100, 50]}),          # covers 150 of 1200 pixels
        _ann(10, iscrowd=1, segmentation=good_rle),                # fine: compressed RLE of the right size
        _ann(11, iscrowd=1, segmentation={**good_rle, "counts": good_rle["counts"][:-1]}),  # a run lost
        _ann(1, (3, 3, 5, 5)),                                     # fine, but annotation id 1 again
        _ann(12, image_id=99),                                     # no such image
        _ann(13, category_id=7),                                   # no such category
        _ann(14, area=0),
        _ann(15, segmentation=None),                               # no mask for a non-crowd instance
        _ann(16, bbox="abc", segmentation=_polygon(2, 2, 4, 4)),
    ]
    (root / "labels").mkdir()
    ann_file = root / "labels" / "train.json"
    ann_file.write_text(json.dumps({"images": images, "annotations": annotations, "categories": categories}))
    return root, ann_file, photos


EXPECTED = {  # by hand from the fixture above
    "duplicate_image_id": 1, "duplicate_annotation_id": 1, "duplicate_category_id": 1,
    "bad_image_entry": 1, "missing_image": 1, "unreadable_image": 3, "size_mismatch": 1,
    "unknown_image": 1, "unknown_category": 1, "bad_box": 1, "box_non_positive": 1,
    "box_outside_image": 1, "zero_area": 1, "missing_segmentation": 1, "degenerate_polygon": 3,
    "rle_wrong_size": 1, "bad_rle": 2, "box_exceeds_image": 1, "category_without_instances": 1,
}


def test_every_defect_is_found_and_counted(broken):
    _, ann_file, photos = broken
    report = check.check(ann_file, photos)
    assert {k: len(v) for k, v in report.problems.items() if v} == EXPECTED
    assert set(EXPECTED) == set(check.KINDS)   # the fixture covers every kind the check knows
    assert report.errors == 22 and report.warnings == 2
    assert not report.usable
    assert report.counts == {"images": 8, "annotations": 17, "categories": 4,
                             "images_without_annotations": 6}   # images 2..7; 1 has them


def test_offenders_name_ids_and_files(broken):
    _, ann_file, photos = broken
    report = check.check(ann_file, photos)
    first = {k: v[0] for k, v in report.problems.items()}
    assert first["missing_image"]["image_id"] == 2 and first["missing_image"]["file_name"] == "missing.png"
    assert [o["file_name"] for o in report.problems["unreadable_image"]] == ["corrupt.png", "cut.jpg", "cut.png"]
    assert "20 x 10 on disk, 40 x 30" in first["size_mismatch"]["detail"]
    assert first["box_outside_image"]["annotation_id"] == 3
    assert [o["annotation_id"] for o in report.problems["degenerate_polygon"]] == [5, 6, 7]
    assert [o["annotation_id"] for o in report.problems["bad_rle"]] == [9, 11]
    assert first["duplicate_category_id"]["category_id"] == 2
    assert first["category_without_instances"] == {"category_id": 3, "name": "bird"}
    text = report.text()
    assert "error: box_outside_image: 1" in text
    assert "annotation 3 of image 1 (ok.png): bbox [50, 40, 5, 5]" in text
    assert "warning: category_without_instances: 1" in text and "category 3 (bird)" in text
    assert text.splitlines()[-1].startswith("summary: 8 images, 17 annotations, 4 categories; 22 error(s), "
                                            "2 warning(s): NOT usable")


def test_command_exit_status_and_json(broken, capsys):
    root, ann_file, photos = broken
    assert check.main(["--annotations", str(ann_file), "--images", str(photos), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["usable"] is False and out["errors"] == 22
    assert {k: v["count"] for k, v in out["problems"].items()} == EXPECTED
    assert len(out["problems"]["degenerate_polygon"]["first"]) == 3
    # the split-entry form, relative to --basedir, finds the same files
    assert check.main(["--basedir", str(root), "--split", "labels/train.json:photos", "--json"]) == 1
    again = json.loads(capsys.readouterr().out)["problems"]
    assert {k: v["count"] for k, v in again.items()} == EXPECTED
    assert again["box_outside_image"] == out["problems"]["box_outside_image"]


def test_warnings_alone_leave_the_dataset_usable(tmp_path, capsys):
    cv2.imwrite(str(tmp_path / "a.png"), np.zeros((H, W, 3), np.uint8))
    (tmp_path / "ann.json").write_text(json.dumps({
        "images": [{"id": 1, "file_name": "a.png", "width": W, "height": H}],
        "annotations": [_ann(1, (35, 25, 10, 10))],
        "categories": [{"id": 1, "name": "cat"}, {"id": 2, "name": "dog"}]}))
    assert check.main(["--annotations", str(tmp_path / "ann.json"), "--images", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "warning: box_exceeds_image: 1" in out and "warning: category_without_instances: 1" in out
    assert out.splitlines()[-1].endswith("0 error(s), 2 warning(s): usable")


@pytest.mark.parametrize("content, message", [
    (None, "annotation file .* does not exist"),
    ("{not json", "is not JSON"),
    ('{"images": [], "categories": []}', "no 'annotations' list"),
])
def test_a_file_that_is_no_instances_file_is_one_error_line(tmp_path, capsys, content, message):
    ann = tmp_path / "ann.json"
    if content is not None:
        ann.write_text(content)
    assert check.main(["--annotations", str(ann), "--images", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ")
    assert re.search(message, err), err


def test_bad_arguments_exit_2(tmp_path, capsys):
    for argv in (["--annotations", "a.json"], ["--annotations", "a.json", "--images", "d", "--split", "x"],
                 ["--basedir", str(tmp_path), "--split", "x", "--samples", "2"]):
        with pytest.raises(SystemExit) as exit_:
            check.main(argv)
        assert exit_.value.code == 2


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    out = tmp_path_factory.mktemp("shapes")
    synthetic.generate(out, synthetic.SyntheticSpec(train=8, val=3, size=64, max_object_size=32, seed=4))
    return out


def test_a_synthetic_dataset_passes_without_a_warning(shapes, capsys):
    rles = 0
    for split in ("train2017", "val2017"):
        assert check.main(["--basedir", str(shapes), "--split", split, "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["usable"] and out["errors"] == 0 and out["warnings"] == 0 and out["problems"] == {}
        dataset = json.loads((shapes / "annotations" / f"instances_{split}.json").read_text())
        rles += sum(isinstance(a["segmentation"], dict) for a in dataset["annotations"])
    # its occluded shapes are compressed RLE: their counts were decoded and found to cover 64 x 64
    assert rles > 0


def test_samples_are_drawn_at_the_images_size_over_their_boxes(shapes, tmp_path):
    look = tmp_path / "look"
    assert check.main(["--basedir", str(shapes), "--split", "train2017", "--samples", "3",
                       "--render-dir", str(look)]) == 0
    dataset = json.loads((shapes / "annotations" / "instances_train2017.json").read_text())
    by_id = {i["id"]: i for i in dataset["images"]}
    drawn = sorted(look.glob("*.png"))
    assert [p.name for p in drawn] == ["1_000000000001.png", "2_000000000002.png", "3_000000000003.png"]
    for path in drawn:
        image = by_id[int(path.name.split("_")[0])]
        source = cv2.imread(str(shapes / "train2017" / image["file_name"]))
        rendered = cv2.imread(str(path))
        assert rendered.shape == source.shape == (image["height"], image["width"], 3)
        changed = (rendered != source).any(axis=2)
        for ann in (a for a in dataset["annotations"] if a["image_id"] == image["id"]):
            x, y, w, h = (int(v) for v in ann["bbox"])
            # the box's left and right sides are drawn, and every pixel of the object is tinted
            assert changed[y:y + h, x].all() and changed[y:y + h, x + w - 1].all()
            seg = ann["segmentation"]
            rle = seg if isinstance(seg, dict) else mask_utils.merge(mask_utils.frPyObjects(seg, 64, 64))
            mask = mask_utils.decode(rle).astype(bool)
            assert mask[y:y + h, x:x + w].sum() == mask.sum() > 0
            assert changed[mask].all()
