"""COCO evaluation in one place: detections to COCO results, COCOeval, gathering across ranks.

Every rank predicts on its share of the validation images and turns its outputs into COCO result
dicts (:func:`detections_to_coco`); :func:`gather_detections` brings them to rank 0 through Horovod
(no shared file system needed); rank 0 runs :func:`evaluate_with_classes` and logs
:func:`metric_lines` (the lines SageMaker's metric regexes read) and :func:`format_table` (the
summary figures and the AP of each class).
"""
from __future__ import annotations

import contextlib
import copy
import io
import logging
import os
from typing import Iterable, Mapping, Sequence

import numpy as np
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from training.metrics import COCO_STAT_SUFFIXES, IOU_TYPES, format_metric, map_metric_name

log = logging.getLogger(__name__)

GATHER_NAME = "gather_detections"
PER_CLASS_KEY = "per_class_AP"   # eval_results.json: {"bbox": {class name: AP at IoU=0.5:0.95}, "segm": ...}


def detections_to_coco(image_id: int, boxes: np.ndarray, scores: np.ndarray, labels: np.ndarray,
                       masks: np.ndarray | None, contiguous_to_coco_id: Mapping[int, int]) -> list[dict]:
    """COCO result dicts for one image.

    ``boxes`` [N, 4] are x1, y1, x2, y2 in the original image's pixels; ``labels`` [N] contiguous
    class ids 1..C; ``masks`` None or [N, H, W] binary masks at the original image's resolution.
    Values are plain Python types (JSON- and pickle-friendly); RLE counts are str.
    """
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
    scores = np.asarray(scores, np.float64).reshape(-1)
    labels = np.asarray(labels).reshape(-1)
    if not len(boxes) == len(scores) == len(labels):
        raise ValueError(f"boxes, scores and labels differ in length: {len(boxes)}, {len(scores)}, {len(labels)}")
    rles = None
    if masks is not None:
        masks = np.asarray(masks)
        if masks.ndim != 3 or len(masks) != len(boxes):
            raise ValueError(f"masks must be [N, H, W] with N={len(boxes)}, got shape {masks.shape}")
        if len(masks):
            rles = mask_utils.encode(np.asfortranarray(np.moveaxis(masks > 0, 0, -1).astype(np.uint8)))
    results = []
    for i, ((x1, y1, x2, y2), score, label) in enumerate(zip(boxes, scores, labels)):
        label = int(label)
        if label not in contiguous_to_coco_id:
            raise ValueError(f"label {label} has no COCO category (known: {sorted(contiguous_to_coco_id)})")
        result = {
            "image_id": int(image_id),
            "category_id": int(contiguous_to_coco_id[label]),
            "bbox": [round(float(x1), 3), round(float(y1), 3),
                     round(float(x2 - x1), 3), round(float(y2 - y1), 3)],
            "score": round(float(score), 5),
        }
        if rles is not None:
            result["segmentation"] = {"size": [int(v) for v in rles[i]["size"]],
                                      "counts": rles[i]["counts"].decode("ascii")}
        results.append(result)
    return results


def _as_coco(coco_gt) -> COCO:
    if isinstance(coco_gt, COCO):
        return coco_gt
    if hasattr(coco_gt, "coco") and isinstance(coco_gt.coco, COCO):  # a training.data.coco.CocoSplit
        return coco_gt.coco
    if isinstance(coco_gt, (str, os.PathLike)):
        with contextlib.redirect_stdout(io.StringIO()):
            return COCO(str(coco_gt))
    raise TypeError(f"expected a pycocotools COCO, a CocoSplit or an annotation file, got {type(coco_gt).__name__}")


def empty_results(iou_types: Iterable[str] = IOU_TYPES) -> dict[str, float]:
    return {map_metric_name(t, s): 0.0 for t in iou_types for s in COCO_STAT_SUFFIXES}


def evaluate(coco_gt, detections: Sequence[dict], iou_types: Sequence[str] = IOU_TYPES,
             image_ids: Sequence[int] | None = None) -> dict[str, float]:
    """COCOeval for each IoU type; returns {"mAP(bbox)/IoU=0.5:0.95": ..., "mAP(segm)/small": ...}.

    ``coco_gt`` is the ground truth (pycocotools COCO, CocoSplit or annotation file). ``image_ids``
    restricts evaluation to the images that were predicted (default: all images of the split).
    No detections at all gives 0.0 everywhere. As in COCOeval, -1.0 means the ground truth has no
    object in that size range (small < 32^2 px area <= medium < 96^2 <= large).
    """
    return evaluate_with_classes(coco_gt, detections, iou_types, image_ids)[0]


def evaluate_with_classes(coco_gt, detections: Sequence[dict], iou_types: Sequence[str] = IOU_TYPES,
                          image_ids: Sequence[int] | None = None) -> tuple[dict[str, float], dict]:
    """:func:`evaluate`'s figures, and per IoU type the AP of every category by name
    (:func:`per_class_ap`): ``{"bbox": {"circle": 0.81, ...}, "segm": {...}}``."""
    for iou_type in iou_types:
        if iou_type not in IOU_TYPES:
            raise ValueError(f"iou_type {iou_type!r} is not one of {IOU_TYPES}")
    if "segm" in iou_types and any("segmentation" not in d for d in detections):
        raise ValueError("segm evaluation needs a 'segmentation' in every detection; "
                         "evaluate with iou_types=('bbox',) for a model without masks")
    gt = _as_coco(coco_gt)
    if not detections:
        names = [c["name"] for c in gt.loadCats(sorted(gt.getCatIds()))]
        return empty_results(iou_types), {t: dict.fromkeys(names, 0.0) for t in iou_types}
    unknown = {d["image_id"] for d in detections} - set(gt.getImgIds())
    if unknown:
        raise ValueError(f"detections for image ids not in the ground truth: {sorted(unknown)[:5]}")
    results, per_class = {}, {}
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        # loadRes adds ids and areas to the dicts it gets: give it copies.
        dt = gt.loadRes(copy.deepcopy(list(detections)))
        for iou_type in iou_types:
            coco_eval = COCOeval(gt, dt, iou_type)
            if image_ids is not None:
                coco_eval.params.imgIds = sorted(int(i) for i in image_ids)
            coco_eval.evaluate()
            coco_eval.accumulate()
            coco_eval.summarize()
            for suffix, value in zip(COCO_STAT_SUFFIXES, coco_eval.stats[:len(COCO_STAT_SUFFIXES)]):
                results[map_metric_name(iou_type, suffix)] = float(value)
            per_class[iou_type] = per_class_ap(coco_eval)
    log.debug("COCOeval output:\n%s", printed.getvalue())
    return results, per_class


def with_filled_box_masks(coco_gt, detections: Sequence[dict]) -> list[dict]:
    """``detections`` with each mask replaced by its box, filled: what a mask head that paints the
    whole box would output. Scored as segm, it is the floor a real mask head has to beat
    (tests/training/test_learns.py): on compact shapes a filled box alone overlaps the object enough
    to pass IoU 0.5 for many of them. The rectangle is rasterised by pycocotools (``frPyObjects`` of
    an [x, y, w, h] box), at the image's size from the ground truth."""
    gt = _as_coco(coco_gt)
    filled = []
    for d in detections:
        image = gt.imgs[d["image_id"]]
        rle = mask_utils.frPyObjects(np.array([d["bbox"]], np.float64), image["height"], image["width"])[0]
        filled.append({**d, "segmentation": {"size": [int(v) for v in rle["size"]],
                                             "counts": rle["counts"].decode("ascii")}})
    return filled


def per_class_ap(coco_eval: COCOeval) -> dict[str, float]:
    """AP at IoU=0.50:0.95 of each category (by name, in category id order) of an accumulated COCOeval.

    COCOeval's ``eval["precision"]`` is ``[T IoU thresholds, R recall points, K categories, A area
    ranges, M max detections]``; a category's AP is the mean of its entries above -1 at area "all"
    and 100 detections per image, the average ``summarize()`` takes over all categories for
    ``stats[0]``. -1.0: no ground truth of that category in the evaluated images.
    """
    params = coco_eval.params
    precision = coco_eval.eval["precision"][:, :, :, params.areaRngLbl.index("all"), params.maxDets.index(100)]
    names = {c["id"]: c["name"] for c in coco_eval.cocoGt.loadCats(params.catIds)}
    out = {}
    for k, cat_id in enumerate(params.catIds):
        values = precision[:, :, k]
        values = values[values > -1]
        out[names[cat_id]] = float(values.mean()) if values.size else -1.0
    return out


def metric_lines(results: Mapping[str, float]) -> list[str]:
    """The log lines (one per metric) that the SageMaker metric definitions capture."""
    return [format_metric(name, value) for name, value in results.items()]


def format_table(results: Mapping[str, float], per_class: Mapping[str, Mapping[str, float]] | None = None) -> str:
    """The end-of-job mAP table; "-" where COCOeval had no ground truth in that size range (or of
    that class). With ``per_class`` (:func:`evaluate_with_classes`), a second table: AP at
    IoU=0.5:0.95 per class, one column per IoU type."""
    headers = ("mAP", "IoU=0.5:0.95", "IoU=0.5", "IoU=0.75", "small", "medium", "large")
    rows = []
    for iou_type in IOU_TYPES:
        names = [map_metric_name(iou_type, s) for s in COCO_STAT_SUFFIXES]
        if not any(n in results for n in names):
            continue
        rows.append((iou_type,) + tuple(_cell(results.get(name)) for name in names))
    if not rows:
        return "no evaluation results"
    text = _table(headers, rows)
    types = [t for t in IOU_TYPES if per_class and per_class.get(t)]
    if types:
        classes = list(dict.fromkeys(name for t in types for name in per_class[t]))
        text += "\n\n" + _table(("AP per class (IoU=0.5:0.95)",) + tuple(types),
                                 [(name,) + tuple(_cell(per_class[t].get(name)) for t in types) for name in classes])
    return text


def _cell(value) -> str:
    return "-" if value is None or value < 0 else f"{value:.4f}"


def _table(headers, rows) -> str:
    """Left-aligned first column, right-aligned others, a rule under the headers."""
    widths = [max(len(r[i]) for r in [headers] + rows) for i in range(len(headers))]
    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths)))
             for row in [headers] + rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def gather_detections(local: list, root_only: bool = True) -> list:
    """Concatenate every rank's ``local`` list, in rank order, through Horovod (no shared files).

    Rank 0 gets the whole list; other ranks get [] (``root_only``) or the whole list as well.
    Without Horovod, or with a single process, ``local`` comes back unchanged. Every rank must
    call this (it is a collective operation).
    """
    from training import collectives
    hvd = collectives.active_horovod()
    if hvd is None:
        return local
    import tensorflow as tf

    with tf.init_scope():
        eager = tf.executing_eagerly()
    if eager:
        with tf.init_scope():
            per_rank = hvd.allgather_object(local, name=GATHER_NAME)
    else:
        # Graph mode (tensorpack's finalized training graph): a graph and session of its own that
        # create no GPU device (see training.collectives).
        per_rank = collectives.allgather_object(local, name=GATHER_NAME)
    if root_only and hvd.rank() != 0:
        return []
    return [item for part in per_rank for item in part]
