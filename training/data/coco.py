"""The COCO-format reader: an instances JSON plus an image folder, as a list of training records.

A split entry (an item of DATA.TRAIN / DATA.VAL) names the files: a split name of the COCO layout
under the data directory (DATA.BASEDIR)::

    BASEDIR/annotations/instances_<name>.json
    BASEDIR/<name>/<file_name>                 (file_name as listed in the JSON's "images")

(``coco_train2017`` also resolves to ``train2017``), or ``<annotation file>:<image folder>`` with
paths relative to BASEDIR or absolute; ``training.data.splits`` resolves both forms.

Each record of :attr:`CocoSplit.roidb` holds ``file_name`` (absolute path), ``image_id``,
``height``, ``width``, ``boxes`` float32 [N, 4] (x1, y1, x2, y2 in absolute pixels, clipped to the
image), ``class`` int32 [N] (contiguous 1..C; 0 is background), ``is_crowd`` int8 [N] and
``segmentation``: per instance either a list of polygons (each a flat float64 array
[x0, y0, x1, y1, ...] of the file's numbers) or, where the file stores the instance as RLE (crowd
regions, occluded synthetic shapes), a compressed RLE dict ``{"size": [h, w], "counts": bytes}``.
``training.data.augment`` turns both into binary masks. Instances with a degenerate box (no area
after clipping) are dropped, and so are non-crowd polygon instances with no polygon of at least
three points.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import io
import logging
import os
from pathlib import Path

import numpy as np
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO

from training.data.splits import DatasetError, layout_help
from training.data.splits import resolve as _resolve

log = logging.getLogger(__name__)

SHOW_MISSING = 5  # missing images named in an error message
STAT_THREADS = 32


def write_annotations(basedir: str | os.PathLike, split: str, dataset: dict) -> Path:
    """Write ``dataset`` as ``basedir/annotations/instances_<split>.json`` (write_annotations_file)."""
    return write_annotations_file(Path(basedir) / "annotations" / f"instances_{split}.json", dataset)


def write_annotations_file(path: str | os.PathLike, dataset: dict) -> Path:
    """Write ``dataset`` to ``path``, atomically: a reader (a training run, pycocotools) never sees a
    half-written file. Returns the path."""
    import json
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(dataset, sort_keys=True, separators=(",", ":")))
    os.replace(tmp, path)
    return path


def resolve_split(basedir: str | os.PathLike, split: str) -> tuple[Path, Path]:
    """(annotation file, image directory) of a split entry (``training.data.splits``: a split name,
    tried in the documented order, or ``<annotation file>:<image folder>``)."""
    return _resolve(basedir, split)


@dataclasses.dataclass
class CocoSplit:
    """One split of a COCO-format dataset, ready for training or evaluation."""

    name: str
    annotation_file: Path
    image_dir: Path
    coco: COCO | None                       # pycocotools' index of the file, for COCOeval; None: not kept
    roidb: list[dict]
    class_names: list[str]                  # ["BG", category names in category-id order]
    contiguous_to_coco_id: dict[int, int]   # 1..C -> COCO category id
    coco_id_to_contiguous: dict[int, int]

    @property
    def num_classes(self) -> int:
        """Categories, background excluded."""
        return len(self.class_names) - 1

    def training_roidb(self) -> list[dict]:
        """Records with at least one non-crowd instance (the others give no training signal)."""
        return [r for r in self.roidb if np.any(r["is_crowd"] == 0)]


def load_split(basedir: str | os.PathLike, split: str, *, validate: bool = True,
               require_annotations: bool = True, keep_coco: bool = True) -> CocoSplit:
    """Read ``split`` under ``basedir``; every problem is raised here, before any training starts.

    ``validate`` checks that every listed image file exists (one ``os.path.isfile`` per image);
    without it only the image directory and the first image are checked.
    ``require_annotations`` rejects a split without a single usable instance (a training split).
    ``keep_coco=False`` drops pycocotools' ``COCO`` object (the parsed file) once the records are
    built: training needs the records only, and the object is most of the memory (host memory
    per rank in docs/training.md).
    """
    ann_file, image_dir = resolve_split(basedir, split)
    try:
        coco = _load_coco(ann_file)
    except (ValueError, KeyError, TypeError, AssertionError) as err:
        raise DatasetError(f"{ann_file} is not a COCO instances file: {err}") from err
    image_ids = sorted(coco.getImgIds())
    if not image_ids:
        raise DatasetError(f"{ann_file} lists no images; {layout_help(basedir)}")
    if not coco.getCatIds():
        raise DatasetError(f"{ann_file} lists no categories")
    if not image_dir.is_dir():
        raise DatasetError(f"image directory {image_dir} for split {split!r} does not exist; "
                           f"{layout_help(basedir)}")
    images = coco.loadImgs(image_ids)
    to_check = images if validate else images[:1]
    # one stat per image, latency-bound on EFS (118k for COCO train): many in flight at once
    with concurrent.futures.ThreadPoolExecutor(STAT_THREADS) as pool:
        exists = list(pool.map(os.path.isfile, [image_dir / img["file_name"] for img in to_check]))
    missing = [img["file_name"] for img, ok in zip(to_check, exists) if not ok]
    if missing:
        shown = ", ".join(missing[:SHOW_MISSING]) + (" ..." if len(missing) > SHOW_MISSING else "")
        raise DatasetError(f"{len(missing)} image(s) listed in {ann_file} are missing from {image_dir}: "
                           f"{shown}; {check_hint(ann_file, image_dir)}")

    cat_ids = sorted(coco.getCatIds())
    coco_id_to_contiguous = {cid: i + 1 for i, cid in enumerate(cat_ids)}
    contiguous_to_coco_id = {v: k for k, v in coco_id_to_contiguous.items()}
    class_names = ["BG"] + [coco.cats[cid]["name"] for cid in cat_ids]

    roidb, dropped = [], 0
    for img in images:
        anns = coco.imgToAnns.get(img["id"], [])
        try:
            record, n_dropped = _record(img, anns, image_dir, coco_id_to_contiguous)
        except _BadAnnotation as err:
            raise DatasetError(f"{ann_file}: {err}; {check_hint(ann_file, image_dir)}") from None
        roidb.append(record)
        dropped += n_dropped
    if dropped:
        log.warning("%s: dropped %d instance(s) with an empty box or no valid polygon (%s)", ann_file, dropped,
                    check_hint(ann_file, image_dir))
    log.info("split %r: %d images from %s, image files in %s", split, len(roidb), ann_file, image_dir)
    if require_annotations and not any(np.any(r["is_crowd"] == 0) for r in roidb):
        raise DatasetError(f"{ann_file} has {len(roidb)} images but no usable (non-crowd, non-empty) "
                           f"annotations: nothing to train on")
    return CocoSplit(split, ann_file, image_dir, coco if keep_coco else None, roidb, class_names,
                     contiguous_to_coco_id, coco_id_to_contiguous)


def load_splits(basedir: str | os.PathLike, splits, **kwargs) -> list[CocoSplit]:
    """Several splits (DATA.TRAIN is a list); they must share their categories."""
    if isinstance(splits, str):
        splits = [splits]
    loaded = [load_split(basedir, s, **kwargs) for s in splits]
    if not loaded:
        raise DatasetError("no split given")
    for other in loaded[1:]:
        if other.class_names != loaded[0].class_names:
            raise DatasetError(f"splits {loaded[0].name!r} and {other.name!r} have different categories: "
                               f"{loaded[0].class_names[1:]} vs {other.class_names[1:]}")
    return loaded


def check_hint(ann_file: Path, image_dir: Path) -> str:
    """The command that lists every problem of a split (training/data/check.py)."""
    return f"`maskrcnn check-data --annotations {ann_file} --images {image_dir}` lists every problem"


class _BadAnnotation(ValueError):
    """An annotation the records cannot be built from; the message names it."""


def _load_coco(ann_file: Path) -> COCO:
    # pycocotools prints progress to stdout; the trainer's log needs no such noise per split.
    with contextlib.redirect_stdout(io.StringIO()):
        return COCO(str(ann_file))


def _record(img: dict, anns: list[dict], image_dir: Path, cat_map: dict[int, int]) -> tuple[dict, int]:
    height, width = int(img["height"]), int(img["width"])
    boxes, classes, crowd, segms = [], [], [], []
    dropped = 0
    for ann in anns:
        if ann.get("ignore", 0):
            continue
        if ann.get("category_id") not in cat_map:
            raise _BadAnnotation(f"annotation {ann.get('id')} of image {img['id']} has category_id "
                                 f"{ann.get('category_id')!r}, which 'categories' does not list")
        try:
            x, y, w, h = (float(v) for v in ann["bbox"])
        except (KeyError, TypeError, ValueError):
            raise _BadAnnotation(f"annotation {ann.get('id')} of image {img['id']} has no bbox of 4 numbers "
                                 f"(got {ann.get('bbox')!r})") from None
        x1, y1 = max(x, 0.0), max(y, 0.0)
        x2, y2 = min(x + w, float(width)), min(y + h, float(height))
        if x2 - x1 <= 0 or y2 - y1 <= 0 or ann.get("area", 1) <= 0:
            dropped += 1
            continue
        is_crowd = int(ann.get("iscrowd", 0))
        seg = _segmentation(ann.get("segmentation"), height, width)
        if seg is None and not is_crowd:
            dropped += 1
            continue
        boxes.append([x1, y1, x2, y2])
        classes.append(cat_map[ann["category_id"]])
        crowd.append(is_crowd)
        segms.append(seg if seg is not None else [])
    record = {
        "file_name": str(image_dir / img["file_name"]),
        "image_id": img["id"],
        "height": height,
        "width": width,
        "boxes": np.asarray(boxes, np.float32).reshape(-1, 4),
        "class": np.asarray(classes, np.int32),
        "is_crowd": np.asarray(crowd, np.int8),
        "segmentation": segms,
    }
    return record, dropped


def _segmentation(seg, height: int, width: int):
    """Polygons (>= 3 points each) or a compressed RLE dict; None when nothing usable is left."""
    if isinstance(seg, dict):  # RLE; uncompressed counts (a list) are compressed here
        if isinstance(seg.get("counts"), list):
            seg = mask_utils.frPyObjects(seg, height, width)
        counts = seg["counts"]
        return {"size": [int(v) for v in seg["size"]],
                "counts": counts.encode("ascii") if isinstance(counts, str) else counts}
    if isinstance(seg, list):
        # one array a polygon: parsed, each number is a Python float (24 bytes and a list slot of 8)
        polygons = [np.asarray(p, np.float64) for p in seg if len(p) >= 6 and len(p) % 2 == 0]
        return polygons or None
    return None
