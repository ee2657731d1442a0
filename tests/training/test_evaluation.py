"""COCO evaluation: perfect predictions score 1.0, worse ones less, and ranks' lists gather."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from training import evaluation, metrics
from training.data import coco, synthetic


@pytest.fixture(scope="module")
def val_split(tmp_path_factory):
    out = tmp_path_factory.mktemp("shapes")
    synthetic.generate(out, synthetic.SyntheticSpec(train=1, val=6, size=96, min_object_size=12,
                                                    max_object_size=48, seed=5))
    return coco.load_split(out, "val2017")


def _ground_truth_as_detections(split, shift=0.0):
    gt = split.coco
    detections = []
    for image_id in gt.getImgIds():
        anns = gt.loadAnns(gt.getAnnIds(imgIds=image_id))
        boxes = np.array([[a["bbox"][0] + shift, a["bbox"][1], a["bbox"][0] + a["bbox"][2] + shift,
                           a["bbox"][1] + a["bbox"][3]] for a in anns])
        labels = [split.coco_id_to_contiguous[a["category_id"]] for a in anns]
        masks = np.stack([gt.annToMask(a) for a in anns])
        detections += evaluation.detections_to_coco(image_id, boxes, np.ones(len(anns)), labels, masks,
                                                    split.contiguous_to_coco_id)
    return detections


def test_perfect_predictions_score_one(val_split):
    results = evaluation.evaluate(val_split.coco, _ground_truth_as_detections(val_split))
    assert set(results) == set(metrics.EVALUATION_METRICS)
    for iou_type in ("bbox", "segm"):
        for suffix in ("IoU=0.5:0.95", "IoU=0.5", "IoU=0.75", "small", "medium"):
            assert results[f"mAP({iou_type})/{suffix}"] == pytest.approx(1.0), suffix
        assert results[f"mAP({iou_type})/large"] == -1.0  # no shape reaches 96x96 px of area


def test_shifted_boxes_score_lower(val_split):
    results = evaluation.evaluate(val_split, _ground_truth_as_detections(val_split, shift=6.0), ("bbox",))
    assert set(results) == {m for m in metrics.EVALUATION_METRICS if "bbox" in m}
    assert results["mAP(bbox)/IoU=0.5:0.95"] < 0.7
    assert results["mAP(bbox)/IoU=0.75"] < results["mAP(bbox)/IoU=0.5"] <= 1.0


def test_no_detections_gives_zeros(val_split):
    results = evaluation.evaluate(val_split.coco, [])
    assert results == {name: 0.0 for name in metrics.EVALUATION_METRICS}


def test_annotation_file_and_image_subset(val_split):
    detections = [d for d in _ground_truth_as_detections(val_split) if d["image_id"] <= 3]
    subset = evaluation.evaluate(str(val_split.annotation_file), detections, ("segm",), image_ids=[1, 2, 3])
    assert subset["mAP(segm)/IoU=0.5"] == pytest.approx(1.0)
    whole = evaluation.evaluate(val_split.coco, detections, ("segm",))
    assert whole["mAP(segm)/IoU=0.5"] < 1.0  # images 4..6 count as missed


def test_bad_inputs(val_split):
    detections = _ground_truth_as_detections(val_split)
    with pytest.raises(ValueError, match="not in the ground truth"):
        evaluation.evaluate(val_split.coco, [dict(detections[0], image_id=999)])
    no_masks = [{k: v for k, v in d.items() if k != "segmentation"} for d in detections]
    with pytest.raises(ValueError, match="iou_types=\\('bbox',\\)"):
        evaluation.evaluate(val_split.coco, no_masks)
    assert evaluation.evaluate(val_split.coco, no_masks, ("bbox",))["mAP(bbox)/IoU=0.5"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="no COCO category"):
        evaluation.detections_to_coco(1, [[0, 0, 1, 1]], [1.0], [7], None, val_split.contiguous_to_coco_id)


def test_detections_to_coco_format():
    masks = np.zeros((1, 10, 12), np.uint8)
    masks[0, 2:5, 3:9] = 1
    (result,) = evaluation.detections_to_coco(4, np.array([[3, 2, 9, 5]], np.float32), [0.9], [2], masks,
                                              {1: 11, 2: 17})
    assert result["image_id"] == 4 and result["category_id"] == 17 and result["score"] == 0.9
    assert result["bbox"] == [3.0, 2.0, 6.0, 3.0]
    assert result["segmentation"]["size"] == [10, 12] and isinstance(result["segmentation"]["counts"], str)
    from pycocotools import mask as mask_utils
    decoded = mask_utils.decode(dict(result["segmentation"], counts=result["segmentation"]["counts"].encode()))
    np.testing.assert_array_equal(decoded, masks[0])
    assert evaluation.detections_to_coco(4, np.zeros((0, 4)), [], [], np.zeros((0, 10, 12)), {1: 1}) == []


def test_metric_lines_and_table(val_split):
    results = evaluation.evaluate(val_split.coco, _ground_truth_as_detections(val_split))
    lines = evaluation.metric_lines(results)
    assert len(lines) == 12
    for line, (name, value) in zip(lines, results.items()):
        assert float(re.match(metrics.metric_regex(name), line).group(1)) == pytest.approx(value)
    table = evaluation.format_table(results)
    assert table.splitlines()[0].split() == ["mAP", "IoU=0.5:0.95", "IoU=0.5", "IoU=0.75", "small", "medium",
                                             "large"]
    assert table.splitlines()[2].split() == ["bbox", "1.0000", "1.0000", "1.0000", "1.0000", "1.0000", "-"]
    assert evaluation.format_table({}) == "no evaluation results"


def test_gather_without_horovod_returns_the_list():
    local = [{"image_id": 1}]
    assert evaluation.gather_detections(local) is local


GATHER_SCRIPT = textwrap.dedent("""
    import json, sys
    import tensorflow as tf
    import horovod.tensorflow as hvd
    from training.evaluation import gather_detections
    hvd.init()
    rank = hvd.rank()
    local = [{"image_id": rank * 10 + i, "rank": rank} for i in range(rank + 2)]
    eager = gather_detections(local)
    everywhere = gather_detections(local, root_only=False)
    training_graph = tf.Graph()
    with training_graph.as_default():   # as inside tensorpack's finalized training graph
        tf.compat.v1.placeholder(tf.float32, [None])
        training_graph.finalize()
        graph = gather_detections(local)
    print("RESULT", rank, json.dumps([eager, everywhere, graph]), flush=True)
""")


@pytest.mark.slow
def test_gather_across_two_horovod_processes(tmp_path):
    horovodrun = shutil.which("horovodrun", path=os.path.dirname(sys.executable))
    assert horovodrun, "horovodrun is missing next to the interpreter: run `make install`"
    script = tmp_path / "gather.py"
    script.write_text(GATHER_SCRIPT)
    env = dict(os.environ, PYTHONPATH=os.getcwd(), TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run([horovodrun, "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, str(script)],
                          capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    import json
    results = {}
    for line in proc.stdout.splitlines():
        if "RESULT" in line:
            _, rank, payload = line.split("RESULT", 1)[1].split(" ", 2)
            results[int(rank)] = json.loads(payload)
    expected = [{"image_id": 0, "rank": 0}, {"image_id": 1, "rank": 0},
                {"image_id": 10, "rank": 1}, {"image_id": 11, "rank": 1}, {"image_id": 12, "rank": 1}]
    assert results[0] == [expected, expected, expected]
    assert results[1] == [[], expected, []]


# ------------------------------------------------------------------------------- AP per class
def _rect_mask(x, y, w, h, size=(120, 160)):
    mask = np.zeros(size, np.uint8)
    mask[y:y + h, x:x + w] = 1
    return mask


def _rle(mask):
    from pycocotools import mask as mask_utils
    rle = mask_utils.encode(np.asfortranarray(mask))
    return {"size": [int(v) for v in rle["size"]], "counts": rle["counts"].decode("ascii")}


def _hand_built_ground_truth():
    """Two 120x160 images; rectangles of four classes: "cat" twice, "dog" and "fox" once, "owl" never."""
    from pycocotools.coco import COCO
    objects = [(1, 1, (10, 10, 40, 40)), (2, 1, (5, 5, 50, 20)), (1, 2, (60, 40, 50, 50)), (2, 3, (90, 60, 30, 30))]
    gt = COCO()
    gt.dataset = {
        "images": [{"id": i, "width": 160, "height": 120, "file_name": f"{i}.png"} for i in (1, 2)],
        "categories": [{"id": c, "name": n} for c, n in ((1, "cat"), (2, "dog"), (3, "fox"), (4, "owl"))],
        "annotations": [{"id": n + 1, "image_id": img, "category_id": cat, "bbox": list(box), "area": box[2] * box[3],
                         "iscrowd": 0, "segmentation": _rle(_rect_mask(*box))}
                        for n, (img, cat, box) in enumerate(objects)]}
    gt.createIndex()
    return gt


def _detection(image_id, category_id, box):
    return {"image_id": image_id, "category_id": category_id, "bbox": list(box), "score": 0.9,
            "segmentation": _rle(_rect_mask(*box))}


def test_ap_per_class_known_by_hand():
    """cat: both found exactly -> 1.0. dog: found with IoU 50*36 / 50*50 = 0.72, a match at the
    thresholds 0.50..0.70 (5 of the 10), a miss at 0.75..0.95 -> 0.5. fox: missed -> 0.0.
    owl: no ground truth -> -1 ("-" in the table). The overall AP is pycocotools' own stats[0]."""
    from pycocotools.cocoeval import COCOeval
    gt = _hand_built_ground_truth()
    detections = [_detection(1, 1, (10, 10, 40, 40)), _detection(2, 1, (5, 5, 50, 20)),
                  _detection(1, 2, (60, 40, 50, 36))]
    results, per_class = evaluation.evaluate_with_classes(gt, detections)
    expected = {"cat": 1.0, "dog": 0.5, "fox": 0.0, "owl": -1.0}
    for iou_type in ("bbox", "segm"):
        assert per_class[iou_type] == pytest.approx(expected), iou_type
        reference = COCOeval(gt, gt.loadRes([dict(d) for d in detections]), iou_type)
        reference.evaluate()
        reference.accumulate()
        reference.summarize()
        assert results[f"mAP({iou_type})/IoU=0.5:0.95"] == pytest.approx(reference.stats[0]) == pytest.approx(0.5)
    table = evaluation.format_table(results, per_class).splitlines()
    assert table[5].split() == ["AP", "per", "class", "(IoU=0.5:0.95)", "bbox", "segm"]
    assert [row.split() for row in table[7:]] == [["cat", "1.0000", "1.0000"], ["dog", "0.5000", "0.5000"],
                                                  ["fox", "0.0000", "0.0000"], ["owl", "-", "-"]]
    assert evaluation.evaluate(gt, detections) == results


def test_ap_per_class_of_an_image_subset_and_of_no_detections():
    gt = _hand_built_ground_truth()
    # image 1 alone holds no fox: its AP is undefined there, not 0
    _, per_class = evaluation.evaluate_with_classes(gt, [_detection(1, 1, (10, 10, 40, 40))], ("bbox",), image_ids=[1])
    assert per_class["bbox"] == pytest.approx({"cat": 1.0, "dog": 0.0, "fox": -1.0, "owl": -1.0})
    results, per_class = evaluation.evaluate_with_classes(gt, [], ("bbox",))
    assert per_class == {"bbox": {"cat": 0.0, "dog": 0.0, "fox": 0.0, "owl": 0.0}}
    assert set(results.values()) == {0.0}


# ------------------------------------------------------------------------- filled-box masks
def test_filled_box_masks_score_what_a_box_covers_of_each_shape():
    """One 120x160 image: a 40x40 square (category 1) and a plus sign in a 48x48 box (category 2),
    two 12 px wide bars: 2 * 48 * 12 - 12 * 12 = 1008 px. With the true masks both detections match
    (segm AP50 1.0). With filled boxes the square still matches (IoU 1), the plus does not
    (IoU 1008 / 2304 = 0.4375 < 0.5): segm AP50 (1.0 + 0.0) / 2 = 0.5; the boxes are untouched."""
    from pycocotools import mask as mask_utils
    from pycocotools.coco import COCO
    square = _rect_mask(10, 10, 40, 40)
    plus = np.maximum(_rect_mask(60, 58, 48, 12), _rect_mask(78, 40, 12, 48))
    assert plus.sum() == 1008
    gt = COCO()
    gt.dataset = {
        "images": [{"id": 1, "width": 160, "height": 120, "file_name": "1.png"}],
        "categories": [{"id": 1, "name": "square"}, {"id": 2, "name": "plus"}],
        "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [10, 10, 40, 40], "area": 1600,
                         "iscrowd": 0, "segmentation": _rle(square)},
                        {"id": 2, "image_id": 1, "category_id": 2, "bbox": [60, 40, 48, 48], "area": 1008,
                         "iscrowd": 0, "segmentation": _rle(plus)}]}
    gt.createIndex()
    detections = [{"image_id": 1, "category_id": 1, "bbox": [10, 10, 40, 40], "score": 0.9, "segmentation": _rle(square)},
                  {"image_id": 1, "category_id": 2, "bbox": [60, 40, 48, 48], "score": 0.8, "segmentation": _rle(plus)}]
    filled = evaluation.with_filled_box_masks(gt, detections)
    decoded = [mask_utils.decode({**d["segmentation"], "counts": d["segmentation"]["counts"].encode()}) for d in filled]
    assert (decoded[0] == square).all() and (decoded[1] == _rect_mask(60, 40, 48, 48)).all()
    assert [d["bbox"] for d in filled] == [d["bbox"] for d in detections]
    assert detections[1]["segmentation"] == _rle(plus)      # the input is left as it was
    assert evaluation.evaluate(gt, detections, ("segm",))["mAP(segm)/IoU=0.5"] == pytest.approx(1.0)
    assert evaluation.evaluate(gt, filled, ("segm",))["mAP(segm)/IoU=0.5"] == pytest.approx(0.5)
