"""Split entries '<annotation file>:<image folder>': any COCO-format file and image folder, outside
the COCO layout, for training, evaluation and predict; malformed entries and missing files are one
clear error each."""
from __future__ import annotations

import json
import os
import re
import shutil

import pytest

from training.config import ConfigError, finalize, new_config
from training.data import coco, splits, synthetic


@pytest.fixture(scope="module")
def custom(tmp_path_factory):
    """A synthetic dataset moved out of the COCO layout: labels/{train,val}.json, photos/{train,val}/."""
    root = tmp_path_factory.mktemp("custom")
    generated = root / "generated"
    synthetic.generate(generated, synthetic.SyntheticSpec(train=12, val=4, size=96, max_object_size=48, seed=3))
    (root / "labels").mkdir()
    (root / "photos").mkdir()
    for split, name in (("train2017", "train"), ("val2017", "val")):
        os.replace(generated / "annotations" / f"instances_{split}.json", root / "labels" / f"{name}.json")
        os.replace(generated / split, root / "photos" / name)
    shutil.rmtree(generated)
    return root


def test_an_entry_reads_its_annotation_file_and_image_folder(custom):
    data = coco.load_split(custom, "labels/train.json:photos/train")
    assert data.annotation_file == (custom / "labels/train.json").resolve()
    assert data.image_dir == (custom / "photos/train").resolve()
    assert data.name == "labels/train.json:photos/train" and len(data.roidb) == 12
    assert all(r["file_name"].startswith(str((custom / "photos/train").resolve())) for r in data.roidb)
    assert data.class_names == ["BG", "circle", "square", "triangle"]


def test_absolute_paths_are_used_as_given(custom, tmp_path):
    entry = f"{custom / 'labels/val.json'}:{custom / 'photos/val'}"
    data = coco.load_split(tmp_path / "elsewhere", entry)   # the base directory plays no part
    assert data.image_dir == (custom / "photos/val").resolve() and len(data.roidb) == 4
    both = coco.load_splits(custom, ["labels/train.json:photos/train", entry])
    assert [len(s.roidb) for s in both] == [12, 4]


@pytest.mark.parametrize("entry, message", [
    ("labels/none.json:photos/train", r"annotation file .*labels/none\.json of split .* does not exist "
                                      r"\(relative paths are under DATA\.BASEDIR "),
    ("labels/train.json:photos/none", r"image folder .*photos/none of split .* does not exist"),
    ("labels/train.json:labels/val.json", r"image folder .*labels/val\.json of split .* is not a folder"),
    ("labels:photos/train", r"annotation file 'labels' is not a \.json file"),
    ("labels/train.json", r"names an annotation file without its image folder: write 'labels/train.json:<image folder>'"),
    ("labels/train.json:", r"needs both parts"),
    (":photos/train", r"needs both parts"),
])
def test_bad_entries_are_one_clear_error(custom, entry, message):
    with pytest.raises(coco.DatasetError, match=message):
        coco.load_split(custom, entry)


def test_a_directory_named_as_the_annotation_file_is_refused(custom, tmp_path):
    (tmp_path / "dir.json").mkdir()
    with pytest.raises(coco.DatasetError, match=r"dir\.json of split .* is not a file"):
        coco.resolve_split(tmp_path, f"dir.json:{custom / 'photos/val'}")


def test_split_names_keep_their_meaning():
    assert splits.parse("coco_train2017") is None and splits.parse("val2017") is None
    assert splits.parse(" labels/a.json : photos/a ") == splits.SplitFiles("labels/a.json", "photos/a")
    assert splits.parse("/data/x/A.JSON:/data/x/img") == splits.SplitFiles("/data/x/A.JSON", "/data/x/img")


def test_an_annotation_with_an_unknown_category_is_named(tmp_path):
    import cv2
    import numpy as np
    (tmp_path / "img").mkdir()
    cv2.imwrite(str(tmp_path / "img" / "a.png"), np.zeros((20, 20, 3), np.uint8))
    (tmp_path / "a.json").write_text(json.dumps({
        "images": [{"id": 1, "file_name": "a.png", "width": 20, "height": 20}],
        "annotations": [{"id": 4, "image_id": 1, "category_id": 9, "bbox": [1, 1, 5, 5],
                         "segmentation": [[1, 1, 6, 1, 6, 6]], "area": 12.5, "iscrowd": 0}],
        "categories": [{"id": 1, "name": "cat"}]}))
    with pytest.raises(coco.DatasetError, match=r"annotation 4 of image 1 has category_id 9, which 'categories' "
                                                r"does not list; `maskrcnn check-data --annotations "):
        coco.load_split(tmp_path, "a.json:img")


def _finalized(*overrides):
    cfg = new_config()
    cfg.update_args(list(overrides))
    return finalize(cfg, num_ranks=1, has_gpu=False)


def test_finalize_accepts_entries_and_names_a_malformed_one():
    cfg = _finalized("DATA.TRAIN=('labels/train.json:photos/train', 'coco_train2017')",
                     "DATA.VAL='labels/val.json:photos/val'")
    assert cfg.DATA.TRAIN == ("labels/train.json:photos/train", "coco_train2017")
    assert cfg.DATA.VAL == ("labels/val.json:photos/val",)
    with pytest.raises(ConfigError, match=r"^DATA\.TRAIN: split entry 'labels/train\.txt:photos': .* is not a \.json file"):
        _finalized("DATA.TRAIN=('labels/train.txt:photos',)")
    with pytest.raises(ConfigError, match=r"^DATA\.VAL: split entry 'val\.json' names an annotation file without"):
        _finalized("DATA.VAL=('val.json',)")


@pytest.mark.slow
def test_training_evaluation_and_predict_on_a_custom_layout(custom, tmp_path):
    from test_train_run import run_mains, run_module, train_args
    logdir = tmp_path / "log"
    entries = ["DATA.TRAIN=('labels/train.json:photos/train',)", "DATA.VAL=('labels/val.json:photos/val',)"]
    # one epoch of 2 steps, then the evaluation that ends training
    proc = run_module("training.train", *train_args(logdir, custom, 2, *entries, "TRAIN.LR_EPOCH_SCHEDULE=[(1, None)]"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (logdir / "model-2.index").exists()
    assert "evaluation of 4 images" in proc.stdout   # the validation entry's 4 images
    history = json.loads((logdir / "eval_results.json").read_text())
    assert history[-1]["global_step"] == 2
    (run,) = run_mains("training.predict", [
        ["--checkpoint", str(logdir), "--split", "labels/val.json:photos/val", "--output", str(tmp_path / "r.json"),
         "--evaluate"]])
    assert run["code"] == 0, run["stderr"][-3000:]
    assert re.search(r"^mAP\(bbox\)/IoU=0\.5: ", run["stdout"], re.M)
    val_ids = {i["id"] for i in json.loads((custom / "labels/val.json").read_text())["images"]}
    assert {r["image_id"] for r in json.loads((tmp_path / "r.json").read_text())} <= val_ids
