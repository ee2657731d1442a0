"""Check a COCO-format dataset against its images before training, and draw a few samples to look at.

    maskrcnn check-data --annotations labels/train.json --images photos/train
    maskrcnn check-data --basedir data/mine --split labels/train.json:photos/train --samples 8 --render-dir look/
    maskrcnn check-data --basedir data/coco --split val2017 --json

Every image listed is opened the way the trainer opens it (``cv2.imread``), every annotation and
category is looked at, and the problems are counted by kind with the first few offenders named.
Errors make the dataset unusable as it is (the trainer would stop, crash, or silently drop the
instance); warnings do not (e.g. a category without instances, a box that sticks out of its image
and is clipped). Exit status: 0 when there is no error, 1 when there is one, 2 for bad arguments.

``--samples N --render-dir OUT`` writes N images (those with annotations first) as PNG files with
every instance's mask filled in translucent colour, its box, and its category name.
"""
from __future__ import annotations

import argparse
import collections
import concurrent.futures
import dataclasses
import json
import os
import sys
from pathlib import Path

import cv2
import numpy as np

from training.data import augment
from training.data.examples import ImageReadError, read_image
from training.data.splits import DatasetError, resolve

SHOW = 5                  # offenders named per problem kind
READ_THREADS = 16         # image reads in flight: latency-bound on EFS, and OpenCV decodes without the GIL
EXCEED_TOLERANCE = 1.0    # px a box may stick out of its image before it is reported (rounding in exports)
MIN_POLYGON_AREA = 1e-6   # px^2; below this a polygon is a line or a point

ERROR, WARNING = "error", "warning"
# kind -> (severity, what it means); the order is the report's
KINDS = {
    "duplicate_image_id": (ERROR, "two entries of 'images' share an id"),
    "duplicate_annotation_id": (ERROR, "two entries of 'annotations' share an id"),
    "duplicate_category_id": (ERROR, "two entries of 'categories' share an id"),
    "bad_image_entry": (ERROR, "an image entry without an id, a file_name, or a positive width and height"),
    "missing_image": (ERROR, "the image file does not exist"),
    "unreadable_image": (ERROR, "the image file cannot be read or is corrupt"),
    "size_mismatch": (ERROR, "the image's size differs from the JSON's width/height"),
    "unknown_image": (ERROR, "an annotation's image_id is not in 'images'"),
    "unknown_category": (ERROR, "an annotation's category_id is not in 'categories'"),
    "bad_box": (ERROR, "bbox is not 4 numbers [x, y, width, height]"),
    "box_non_positive": (ERROR, "a box with zero or negative width or height (the trainer drops it)"),
    "box_outside_image": (ERROR, "a box entirely outside its image (the trainer drops it)"),
    "zero_area": (ERROR, "an annotation whose area is zero or negative (the trainer drops it)"),
    "missing_segmentation": (ERROR, "a non-crowd annotation without a segmentation (the trainer drops it: "
                                    "it needs a mask for every instance)"),
    "degenerate_polygon": (ERROR, "an empty polygon list, or a polygon with fewer than 3 points or zero area"),
    "rle_wrong_size": (ERROR, "an RLE mask whose size is not the image's [height, width]"),
    "bad_rle": (ERROR, "an RLE mask whose counts do not cover its size exactly"),
    "box_exceeds_image": (WARNING, "a box sticking out of its image by more than 1 px (the trainer clips it)"),
    "category_without_instances": (WARNING, "a category that no annotation uses"),
}


@dataclasses.dataclass
class Report:
    annotation_file: str
    image_dir: str
    counts: dict[str, int] = dataclasses.field(default_factory=dict)    # images, annotations, ...
    problems: dict[str, list[dict]] = dataclasses.field(
        default_factory=lambda: collections.defaultdict(list))          # kind -> every offender
    rendered: list[str] = dataclasses.field(default_factory=list)

    def add(self, kind: str, **offender) -> None:
        self.problems[kind].append(offender)

    def count(self, kind: str) -> int:
        return len(self.problems.get(kind, ()))

    @property
    def errors(self) -> int:
        return sum(len(v) for k, v in self.problems.items() if KINDS[k][0] == ERROR)

    @property
    def warnings(self) -> int:
        return sum(len(v) for k, v in self.problems.items() if KINDS[k][0] == WARNING)

    @property
    def usable(self) -> bool:
        return self.errors == 0

    def summary(self) -> str:
        verdict = "usable" if self.usable else "NOT usable: fix the errors above"
        return (f"summary: {self.counts.get('images', 0)} images, {self.counts.get('annotations', 0)} annotations, "
                f"{self.counts.get('categories', 0)} categories; {self.errors} error(s), {self.warnings} "
                f"warning(s): {verdict}")

    def to_json(self) -> dict:
        return {"annotations": self.annotation_file, "images": self.image_dir, "counts": self.counts,
                "usable": self.usable, "errors": self.errors, "warnings": self.warnings,
                "problems": {k: {"severity": KINDS[k][0], "meaning": KINDS[k][1], "count": len(v),
                                 "first": v[:SHOW]} for k, v in self._ordered()},
                "rendered": self.rendered}

    def text(self) -> str:
        lines = [f"checked {self.annotation_file} against {self.image_dir}"]
        for kind, offenders in self._ordered():
            severity, meaning = KINDS[kind]
            lines.append(f"{severity}: {kind}: {len(offenders)} ({meaning})")
            lines += [f"    {describe(o)}" for o in offenders[:SHOW]]
            if len(offenders) > SHOW:
                lines.append(f"    ... and {len(offenders) - SHOW} more")
        if self.counts.get("images_without_annotations"):
            lines.append(f"note: {self.counts['images_without_annotations']} image(s) have no annotation "
                         f"(kept for evaluation, skipped in training)")
        lines += [f"rendered {p}" for p in self.rendered]
        lines.append(self.summary())
        return "\n".join(lines)

    def _ordered(self):
        return [(k, self.problems[k]) for k in KINDS if self.problems.get(k)]


def describe(offender: dict) -> str:
    """One offender as a line: which annotation/image/category, its file, and the detail."""
    parts = []
    if "annotation_id" in offender:
        parts.append(f"annotation {offender['annotation_id']}")
    if "image_id" in offender:
        parts.append(("of " if parts else "") + f"image {offender['image_id']}")
    if offender.get("file_name"):
        parts.append(f"({offender['file_name']})")
    if "category_id" in offender:
        parts.append(f"category {offender['category_id']}" + (f" ({offender['name']})" if "name" in offender else ""))
    return " ".join(parts) + (f": {offender['detail']}" if offender.get("detail") else "")


def _id(v):
    """An id as a dictionary key: JSON gives numbers and strings; anything else is keyed by its text."""
    return v if isinstance(v, (int, float, str, type(None))) else repr(v)


def _order(v) -> tuple:
    return (str(type(v)), v)


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v)


def _polygon_area(flat) -> float:
    xy = np.asarray(flat, np.float64).reshape(-1, 2)
    x, y = xy[:, 0], xy[:, 1]
    return 0.5 * abs(float(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1))))


def _rle_total(counts) -> int | None:
    """Pixels an RLE's counts cover: the sum of a list, or of the runs of a compressed string
    (pycocotools' rleFrString: 5 bits a character, a continuation bit, deltas from the run two
    before). None when the string is not a valid encoding. Decoding an RLE whose counts exceed its
    size writes past pycocotools' buffer, so the sum is checked without decoding."""
    if isinstance(counts, list):
        return sum(int(c) for c in counts) if all(_number(c) and c >= 0 for c in counts) else None
    if isinstance(counts, bytes):
        counts = counts.decode("ascii", "replace")
    if not isinstance(counts, str):
        return None
    runs, p = [], 0
    while p < len(counts):
        x, k, more = 0, 0, True
        while more:
            if p >= len(counts):
                return None
            c = ord(counts[p]) - 48
            if not 0 <= c < 64:
                return None
            x |= (c & 0x1F) << (5 * k)
            more = bool(c & 0x20)
            p += 1
            k += 1
            if not more and (c & 0x10):
                x |= -1 << (5 * k)
        if len(runs) > 2:
            x += runs[-2]
        if x < 0:
            return None
        runs.append(x)
    return sum(runs)


def _check_segmentation(seg, iscrowd: bool, height: int, width: int) -> tuple[str, str] | None:
    """(kind, detail) of the first problem of an annotation's segmentation, or None."""
    if seg is None or (isinstance(seg, (list, dict)) and not seg and iscrowd):
        return None if iscrowd else ("missing_segmentation", "no 'segmentation'")
    if isinstance(seg, dict):
        size = seg.get("size")
        if not (isinstance(size, list) and len(size) == 2 and all(_number(v) for v in size)):
            return "bad_rle", f"size {size!r} is not [height, width]"
        if [int(v) for v in size] != [height, width]:
            return "rle_wrong_size", f"RLE size {size} for an image of [height, width] [{height}, {width}]"
        total = _rle_total(seg.get("counts"))
        if total != height * width:
            covered = "are not valid" if total is None else f"cover {total} pixels"
            return "bad_rle", f"counts {covered}, size {size} has {height * width}"
        return None
    if isinstance(seg, list) and not seg:
        return "degenerate_polygon", "an empty list of polygons"
    if not isinstance(seg, list):
        return "degenerate_polygon", f"segmentation {seg!r} is neither polygons nor RLE"
    for i, poly in enumerate(seg):
        if not isinstance(poly, list) or not all(_number(v) for v in poly):
            return "degenerate_polygon", f"polygon {i} is not a list of numbers"
        if len(poly) < 6 or len(poly) % 2:
            return "degenerate_polygon", f"polygon {i} has {len(poly)} coordinates (needs x, y pairs of 3+ points)"
        if _polygon_area(poly) < MIN_POLYGON_AREA:
            return "degenerate_polygon", f"polygon {i} has zero area"
    return None


def _check_box(bbox, height: int, width: int) -> tuple[str, str] | None:
    if not (isinstance(bbox, list) and len(bbox) == 4 and all(_number(v) for v in bbox)):
        return "bad_box", f"bbox {bbox!r}"
    x, y, w, h = (float(v) for v in bbox)
    if w <= 0 or h <= 0:
        return "box_non_positive", f"bbox {bbox}"
    if x >= width or y >= height or x + w <= 0 or y + h <= 0:
        return "box_outside_image", f"bbox {bbox} in an image of width {width}, height {height}"
    t = EXCEED_TOLERANCE
    if x < -t or y < -t or x + w > width + t or y + h > height + t:
        return "box_exceeds_image", f"bbox {bbox} in an image of width {width}, height {height}"
    return None


def _read(path: Path) -> tuple[str, object]:
    """("missing" | "unreadable" | "ok", detail or (height, width)) for one file, read as the trainer
    reads it; the pixels are not kept (a whole COCO split does not fit in memory)."""
    if not path.is_file():
        return "missing", None
    try:
        image = read_image(str(path))
    except ImageReadError:
        return "unreadable", "OpenCV cannot decode it"
    # OpenCV decodes a JPEG cut short with a warning only (the rest grey): its end marker says.
    if path.suffix.lower() in (".jpg", ".jpeg"):
        with open(path, "rb") as f:
            f.seek(max(0, path.stat().st_size - 1024))
            if b"\xff\xd9" not in f.read():
                return "unreadable", "the JPEG data is cut short (no end marker)"
    return "ok", image.shape[:2]


def load_dataset(annotation_file: Path) -> dict:
    """The instances JSON as written (pycocotools' index would merge duplicate ids); DatasetError
    when it is not a COCO instances file."""
    try:
        data = json.loads(Path(annotation_file).read_text())
    except OSError as err:
        raise DatasetError(f"cannot read annotation file {annotation_file}: {err.strerror}") from None
    except (ValueError, UnicodeDecodeError) as err:
        raise DatasetError(f"{annotation_file} is not JSON: {err}") from None
    if not isinstance(data, dict):
        raise DatasetError(f"{annotation_file} is not a COCO instances file: the top level is not an object")
    for key in ("images", "annotations", "categories"):
        if not isinstance(data.get(key), list):
            raise DatasetError(f"{annotation_file} is not a COCO instances file: no '{key}' list")
    return data


def check(annotation_file: str | os.PathLike, image_dir: str | os.PathLike, *, samples: int = 0,
          render_dir: str | os.PathLike | None = None) -> Report:
    """Every problem of the dataset; renders ``samples`` images into ``render_dir``."""
    annotation_file, image_dir = Path(annotation_file), Path(image_dir)
    if not annotation_file.is_file():
        raise DatasetError(f"annotation file {annotation_file} does not exist")
    if not image_dir.is_dir():
        raise DatasetError(f"image folder {image_dir} does not exist")
    data = load_dataset(annotation_file)
    report = Report(str(annotation_file), str(image_dir))

    categories: dict = {}
    for cat in data["categories"]:
        cat = cat if isinstance(cat, dict) else {}
        cid = _id(cat.get("id"))
        if cid in categories:
            report.add("duplicate_category_id", category_id=cid, name=str(cat.get("name")))
        categories.setdefault(cid, cat)

    images: dict = {}
    valid_images = []
    for img in data["images"]:
        img = img if isinstance(img, dict) else {}
        iid, name = _id(img.get("id")), img.get("file_name")
        if iid in images:
            report.add("duplicate_image_id", image_id=iid, file_name=name)
            continue
        images[iid] = img
        if iid is None or not isinstance(name, str) or not name or not all(
                _number(img.get(k)) and img[k] > 0 for k in ("width", "height")):
            report.add("bad_image_entry", image_id=iid, file_name=name,
                       detail=f"file_name {name!r}, width {img.get('width')!r}, height {img.get('height')!r}")
            continue
        valid_images.append(img)

    with concurrent.futures.ThreadPoolExecutor(READ_THREADS) as pool:
        reads = pool.map(lambda i: _read(image_dir / i["file_name"]), valid_images)
        drawable = {}
        for img, (status, found) in zip(valid_images, reads):
            where = dict(image_id=_id(img["id"]), file_name=img["file_name"])
            if status == "missing":
                report.add("missing_image", **where, detail=f"not in {image_dir}")
            elif status == "unreadable":
                report.add("unreadable_image", **where, detail=found)
            else:
                h, w = found
                if (h, w) != (int(img["height"]), int(img["width"])):
                    report.add("size_mismatch", **where, detail=f"{w} x {h} on disk, {int(img['width'])} x "
                                                                f"{int(img['height'])} (width x height) in the JSON")
                else:
                    drawable[_id(img["id"])] = True

    ann_ids, used_categories, annotated = set(), set(), collections.defaultdict(list)
    for ann in data["annotations"]:
        ann = ann if isinstance(ann, dict) else {}
        aid, iid, cid = _id(ann.get("id")), _id(ann.get("image_id")), _id(ann.get("category_id"))
        img = images.get(iid)
        where = dict(annotation_id=aid, image_id=iid, file_name=img.get("file_name") if img else None)
        if aid in ann_ids:
            report.add("duplicate_annotation_id", **where)
        ann_ids.add(aid)
        if img is None:
            report.add("unknown_image", **where, detail=f"image_id {iid!r} is not in 'images'")
            continue
        if cid not in categories:
            report.add("unknown_category", **where, detail=f"category_id {cid!r} is not in 'categories'")
        else:
            used_categories.add(cid)
        annotated[iid].append(ann)
        if not all(_number(img.get(k)) and img[k] > 0 for k in ("width", "height")):
            continue   # its image entry is already reported
        height, width = int(img["height"]), int(img["width"])
        box = _check_box(ann.get("bbox"), height, width)
        if box:
            report.add(box[0], **where, detail=box[1])
        if "area" in ann and not (_number(ann["area"]) and ann["area"] > 0):
            report.add("zero_area", **where, detail=f"area {ann['area']!r}")
        seg = _check_segmentation(ann.get("segmentation"), bool(ann.get("iscrowd", 0)), height, width)
        if seg:
            report.add(seg[0], **where, detail=seg[1])

    for cid, cat in categories.items():
        if cid not in used_categories:
            report.add("category_without_instances", category_id=cid, name=str(cat.get("name")))

    report.counts = {"images": len(data["images"]), "annotations": len(data["annotations"]),
                     "categories": len(data["categories"]),
                     "images_without_annotations": sum(1 for i in images if i not in annotated)}
    if samples and render_dir is not None:
        report.rendered = render_samples(image_dir, valid_images, annotated, categories, drawable, samples,
                                         Path(render_dir))
    return report


def category_colors(category_ids) -> dict:
    """A distinct BGR colour per category: hues spread around the circle, in id order."""
    ids = sorted((c for c in category_ids if c is not None), key=_order)
    colors = {}
    for i, cid in enumerate(ids):
        hsv = np.uint8([[[int(180 * i / max(1, len(ids))), 220, 255]]])
        colors[cid] = tuple(int(v) for v in cv2.cvtColor(hsv, cv2.COLOR_HSV2BGR)[0, 0])
    return colors


def render(image: np.ndarray, annotations: list[dict], categories: dict, colors: dict) -> np.ndarray:
    """``image`` with each annotation's mask filled at half opacity, its box and its category name."""
    height, width = image.shape[:2]
    overlay = image.copy()
    for ann in annotations:
        seg = ann.get("segmentation")
        if not seg or _check_segmentation(seg, bool(ann.get("iscrowd", 0)), height, width):
            continue   # a broken mask is reported, not drawn
        mask = augment.segmentation_to_mask(seg, height, width).astype(bool)
        overlay[mask] = colors.get(_id(ann.get("category_id")), (255, 255, 255))
    out = cv2.addWeighted(overlay, 0.5, image, 0.5, 0)
    thickness = max(1, round(min(height, width) / 300))
    for ann in annotations:
        bbox = ann.get("bbox")
        if not (isinstance(bbox, list) and len(bbox) == 4 and all(_number(v) for v in bbox)):
            continue
        color = colors.get(_id(ann.get("category_id")), (255, 255, 255))
        x, y, w, h = bbox
        p1, p2 = (int(round(x)), int(round(y))), (int(round(x + w)) - 1, int(round(y + h)) - 1)
        cv2.rectangle(out, p1, p2, color, thickness)
        name = str(categories.get(_id(ann.get("category_id")), {}).get("name", ann.get("category_id")))
        scale = max(0.35, min(height, width) / 800)
        (tw, th), base = cv2.getTextSize(name, cv2.FONT_HERSHEY_SIMPLEX, scale, 1)
        ty = p1[1] - 2 if p1[1] - th - base - 2 >= 0 else p1[1] + th + 2
        cv2.rectangle(out, (p1[0], ty - th - 1), (p1[0] + tw + 1, ty + base - 1), color, cv2.FILLED)
        cv2.putText(out, name, (p1[0] + 1, ty - 1), cv2.FONT_HERSHEY_SIMPLEX, scale, (0, 0, 0), 1, cv2.LINE_AA)
    return out


def render_samples(image_dir: Path, images: list[dict], annotated: dict, categories: dict, drawable: dict,
                   samples: int, out_dir: Path) -> list[str]:
    """The first ``samples`` drawable images (by id; those with annotations first) as PNG files
    named ``<image id>_<file stem>.png``; returns their paths."""
    chosen = sorted((i for i in images if _id(i["id"]) in drawable),
                    key=lambda i: (_id(i["id"]) not in annotated, _order(_id(i["id"]))))[:samples]
    out_dir.mkdir(parents=True, exist_ok=True)
    colors = category_colors(categories)
    written = []
    for img in chosen:
        drawn = render(read_image(str(image_dir / img["file_name"])), annotated.get(_id(img["id"]), []), categories,
                       colors)
        path = out_dir / f"{img['id']}_{Path(img['file_name']).stem}.png"
        if not cv2.imwrite(str(path), drawn):
            raise DatasetError(f"cannot write {path}: check that --render-dir is writable")
        written.append(str(path))
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="maskrcnn check-data", description=__doc__.splitlines()[0])
    p.add_argument("--annotations", help="the COCO instances JSON")
    p.add_argument("--images", help="the folder its file_name entries are relative to")
    p.add_argument("--basedir", help="instead: a data directory (DATA.BASEDIR) ...")
    p.add_argument("--split", help="... and a split entry, e.g. val2017 or labels/val.json:photos/val")
    p.add_argument("--samples", type=int, default=0, help="draw this many images (needs --render-dir)")
    p.add_argument("--render-dir", help="where the drawn samples go, as <image id>_<name>.png")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    a = p.parse_args(argv)
    if bool(a.annotations) != bool(a.images):
        p.error("--annotations and --images go together")
    if bool(a.annotations) == bool(a.split):
        p.error("give --annotations F --images D, or --basedir B --split S")
    if a.samples < 0:
        p.error("--samples must be >= 0")
    if a.samples and not a.render_dir:
        p.error("--samples needs --render-dir (where the drawn images go)")
    try:
        if a.split:
            annotation_file, image_dir = resolve(a.basedir or ".", a.split)
        else:
            annotation_file, image_dir = Path(a.annotations), Path(a.images)
        report = check(annotation_file, image_dir, samples=a.samples, render_dir=a.render_dir)
    except DatasetError as err:
        if a.json:
            print(json.dumps({"usable": False, "fatal": str(err)}))
        else:
            print(f"error: {err}", file=sys.stderr)
        return 1
    print(json.dumps(report.to_json(), indent=1, default=str) if a.json else report.text())
    return 0 if report.usable else 1


if __name__ == "__main__":
    sys.exit(main())
