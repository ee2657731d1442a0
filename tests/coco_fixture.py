"""A COCO-realistic fixture: a small dataset with the properties of COCO 2017 that bite at scale.

``training.data.synthetic`` draws square 128 px shapes for a quick CPU run. This module writes
what the trainer meets on the real COCO files instead, so tests and benchmarks run at the shapes
users run:

* JPEG images of COCO's typical sizes, landscape and portrait (``COCO_IMAGE_SIZES``). Several of
  them give an odd number of stride-32 cells at the default short edge 800 / max 1333 (e.g.
  640x480 -> 800x1067, padded 800x1088: 25 x 34 cells at stride 32, 12.5 x 17 at stride 64), the
  case where a stride-64 level computed by flooring and one computed by a stride-2 layer disagree.
* grayscale JPEGs (single channel on disk, as about 1% of COCO's are);
* images without any annotation (listed in ``images``, absent from ``annotations``);
* ``iscrowd=1`` regions annotated as uncompressed RLE (``counts`` a list), as COCO stores crowds;
* many small objects (COCO: ~41% of instances have area < 32^2), polygon-annotated;
* COCO's 80 categories with their ids (1..90 with gaps), names and supercategories, and sparse
  image ids (``image_id`` is not the index of the image).

Objects are flat-coloured star-shaped polygons (one colour per category, painted in z-order) on a
textured background; every annotation's area and bbox are those pycocotools computes from its
segmentation. Image ``k`` of a split is fully determined by the seed and ``k``; the per-image
features cycle with ``k`` (``IMAGE_KINDS``), so any split of ``len(IMAGE_KINDS)`` images or more
holds every size and every kind. Command::

    python tests/coco_fixture.py --output data/coco_fixture --train 200 --val 16 --seed 0
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
from pathlib import Path

import cv2
import numpy as np
from pycocotools import mask as mask_utils

from training.data.coco import write_annotations

# COCO 2017's 80 categories: (id, name, supercategory). Ids 12, 26, 29, 30, 45, 66, 68, 69, 71, 83
# are unused in COCO, which is why a trainer must map category ids to contiguous classes.
COCO_CATEGORIES = (
    (1, "person", "person"), (2, "bicycle", "vehicle"), (3, "car", "vehicle"), (4, "motorcycle", "vehicle"),
    (5, "airplane", "vehicle"), (6, "bus", "vehicle"), (7, "train", "vehicle"), (8, "truck", "vehicle"),
    (9, "boat", "vehicle"), (10, "traffic light", "outdoor"), (11, "fire hydrant", "outdoor"),
    (13, "stop sign", "outdoor"), (14, "parking meter", "outdoor"), (15, "bench", "outdoor"),
    (16, "bird", "animal"), (17, "cat", "animal"), (18, "dog", "animal"), (19, "horse", "animal"),
    (20, "sheep", "animal"), (21, "cow", "animal"), (22, "elephant", "animal"), (23, "bear", "animal"),
    (24, "zebra", "animal"), (25, "giraffe", "animal"), (27, "backpack", "accessory"),
    (28, "umbrella", "accessory"), (31, "handbag", "accessory"), (32, "tie", "accessory"),
    (33, "suitcase", "accessory"), (34, "frisbee", "sports"), (35, "skis", "sports"),
    (36, "snowboard", "sports"), (37, "sports ball", "sports"), (38, "kite", "sports"),
    (39, "baseball bat", "sports"), (40, "baseball glove", "sports"), (41, "skateboard", "sports"),
    (42, "surfboard", "sports"), (43, "tennis racket", "sports"), (44, "bottle", "kitchen"),
    (46, "wine glass", "kitchen"), (47, "cup", "kitchen"), (48, "fork", "kitchen"), (49, "knife", "kitchen"),
    (50, "spoon", "kitchen"), (51, "bowl", "kitchen"), (52, "banana", "food"), (53, "apple", "food"),
    (54, "sandwich", "food"), (55, "orange", "food"), (56, "broccoli", "food"), (57, "carrot", "food"),
    (58, "hot dog", "food"), (59, "pizza", "food"), (60, "donut", "food"), (61, "cake", "food"),
    (62, "chair", "furniture"), (63, "couch", "furniture"), (64, "potted plant", "furniture"),
    (65, "bed", "furniture"), (67, "dining table", "furniture"), (70, "toilet", "furniture"),
    (72, "tv", "electronic"), (73, "laptop", "electronic"), (74, "mouse", "electronic"),
    (75, "remote", "electronic"), (76, "keyboard", "electronic"), (77, "cell phone", "electronic"),
    (78, "microwave", "appliance"), (79, "oven", "appliance"), (80, "toaster", "appliance"),
    (81, "sink", "appliance"), (82, "refrigerator", "appliance"), (84, "book", "indoor"),
    (85, "clock", "indoor"), (86, "vase", "indoor"), (87, "scissors", "indoor"),
    (88, "teddy bear", "indoor"), (89, "hair drier", "indoor"), (90, "toothbrush", "indoor"),
)
PERSON_ID = 1  # COCO's crowds are mostly people

# (width, height) as COCO lists them. At short edge 800 / max 1333 they become (h x w, padded to 32):
# 640x427 -> 800x1199 (800x1216), 640x480 -> 800x1067 (800x1088), 500x375 -> 800x1067 (800x1088),
# 640x512 -> 800x1000 (800x1024), 427x640 -> 1199x800 (1216x800), 480x640 -> 1067x800 (1088x800):
# 800 / 32 = 25 cells, odd, at stride 32 in every one of them.
COCO_IMAGE_SIZES = ((640, 427), (640, 480), (500, 375), (640, 512), (427, 640), (480, 640))

# Per-image kinds, cycling with the image's index: every 8 consecutive images hold each kind.
IMAGE_KINDS = ("colour", "crowd", "colour", "grayscale", "colour", "small_only", "colour", "empty")

SMALL_AREA = 32 ** 2  # COCO's "small" upper bound


@dataclasses.dataclass(frozen=True)
class CocoFixtureSpec:
    """What to generate; every field is a command-line option."""

    train: int = 16
    val: int = 8
    min_objects: int = 1
    max_objects: int = 13          # uniform, so ~7 per annotated image: COCO's mean is 7.3
    small_fraction: float = 0.4    # fraction of objects drawn small (area < 32^2 px)
    quality: int = 90              # JPEG quality
    seed: int = 0

    def validate(self) -> None:
        problems = []
        if self.train < 1 or self.val < 1:
            problems.append(f"--train and --val must be >= 1 (got {self.train}, {self.val})")
        if not 1 <= self.min_objects <= self.max_objects:
            problems.append(f"need 1 <= --min-objects <= --max-objects (got {self.min_objects}, {self.max_objects})")
        if not 0.0 <= self.small_fraction <= 1.0:
            problems.append(f"--small-fraction must be in [0, 1] (got {self.small_fraction})")
        if not 10 <= self.quality <= 100:
            problems.append(f"--quality must be 10..100 (got {self.quality})")
        if problems:
            raise ValueError("invalid COCO fixture options: " + "; ".join(problems))


def category_colour(category_id: int) -> tuple[int, int, int]:
    """A fixed saturated BGR colour per category (the background is low-saturation)."""
    hue = (category_id * 37) % 180  # OpenCV hue is 0..179
    hsv = np.uint8([[[hue, 200 + category_id % 56, 170 + (category_id * 7) % 86]]])
    return tuple(int(v) for v in cv2.cvtColor(hsv, cv2.COLOR_HSV2BGR)[0, 0])


def _background(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """A low-saturation BGR texture: tinted gradient, soft stripes, per-pixel noise."""
    yy = np.arange(height, dtype=np.float32)[:, None] / height
    xx = np.arange(width, dtype=np.float32)[None, :] / width
    angle, period = rng.uniform(0, math.pi), rng.uniform(0.05, 0.25)
    plane = (rng.uniform(70, 170) + rng.uniform(-30, 30) * xx + rng.uniform(-30, 30) * yy
             + 12 * np.sin((xx * math.cos(angle) + yy * math.sin(angle)) / period * 2 * math.pi))
    noise = rng.normal(0, 6, size=(height, width, 1)).astype(np.float32)
    image = plane[..., None] + noise + rng.uniform(-12, 12, size=3).astype(np.float32)
    return np.clip(image, 0, 255).astype(np.uint8)


def _polygon(rng: np.random.Generator, width: int, height: int, small: bool) -> np.ndarray:
    """A star-shaped polygon [K, 2] (x, y) wholly inside the image; small ones have area < 32^2."""
    extent = rng.uniform(8, 30) if small else rng.uniform(36, 0.8 * min(width, height))
    aspect = math.exp(rng.uniform(-0.9, 0.9))  # elongated objects too (width / height of the shape)
    rx, ry = 0.5 * extent * math.sqrt(aspect), 0.5 * extent / math.sqrt(aspect)
    k = int(rng.integers(5, 14))
    angles = np.sort(rng.uniform(0, 2 * math.pi, size=k))
    radii = rng.uniform(0.65, 1.0, size=k)
    xy = np.stack([rx * radii * np.cos(angles), ry * radii * np.sin(angles)], axis=1)
    size = np.array([width, height], np.float64)
    xy *= min(1.0, float(np.min((size - 4) / (xy.max(axis=0) - xy.min(axis=0)))))  # elongated: fit inside
    low, high = xy.min(axis=0), xy.max(axis=0)
    return xy + rng.uniform(-low + 1, size - high - 1)


def _rle_of_polygon(polygon: np.ndarray, height: int, width: int) -> dict:
    return mask_utils.merge(mask_utils.frPyObjects([polygon.reshape(-1).tolist()], height, width))


def _uncompressed_rle(mask: np.ndarray) -> dict:
    """COCO's crowd format: column-major run lengths starting with a run of zeros."""
    flat = np.asfortranarray(mask.astype(np.uint8)).reshape(-1, order="F")
    change = np.flatnonzero(np.diff(flat)) + 1
    bounds = np.concatenate([[0], change, [flat.size]])
    counts = np.diff(bounds).tolist()
    if flat[0]:
        counts = [0] + counts
    return {"size": [int(mask.shape[0]), int(mask.shape[1])], "counts": [int(c) for c in counts]}


def _crowd_mask(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """Many small blobs packed in one region: what a crowd of people looks like at COCO's scale."""
    mask = np.zeros((height, width), np.uint8)
    rw, rh = int(rng.uniform(0.3, 0.6) * width), int(rng.uniform(0.2, 0.4) * height)
    x0, y0 = int(rng.integers(0, width - rw)), int(rng.integers(0, height - rh))
    for _ in range(int(rng.integers(15, 40))):
        cx, cy = int(rng.integers(x0, x0 + rw)), int(rng.integers(y0, y0 + rh))
        axes = (int(rng.integers(3, 9)), int(rng.integers(6, 16)))
        cv2.ellipse(mask, (cx, cy), axes, 0, 0, 360, 1, -1)
    return mask


def _image_and_annotations(rng: np.random.Generator, spec: CocoFixtureSpec, index: int, image_id: int,
                           first_ann_id: int) -> tuple[np.ndarray, list[dict]]:
    width, height = COCO_IMAGE_SIZES[index % len(COCO_IMAGE_SIZES)]
    kind = IMAGE_KINDS[index % len(IMAGE_KINDS)]
    image = _background(rng, height, width)
    annotations: list[dict] = []
    painted: list[tuple[np.ndarray, tuple]] = []
    if kind == "crowd":
        crowd = _crowd_mask(rng, height, width)
        painted.append((crowd.astype(bool), category_colour(PERSON_ID)))
        rle = mask_utils.encode(np.asfortranarray(crowd))
        annotations.append({"category_id": PERSON_ID, "segmentation": _uncompressed_rle(crowd),
                            "area": int(mask_utils.area(rle)),
                            "bbox": [float(v) for v in mask_utils.toBbox(rle)], "iscrowd": 1})
    if kind != "empty":
        categories = [c[0] for c in COCO_CATEGORIES]
        for _ in range(int(rng.integers(spec.min_objects, spec.max_objects + 1))):
            small = kind == "small_only" or rng.random() < spec.small_fraction
            polygon = _polygon(rng, width, height, small)
            rle = _rle_of_polygon(polygon, height, width)
            area = int(mask_utils.area(rle))
            if area < 4:  # a sliver that rasterises to (almost) nothing: COCO has none of those
                continue
            category = categories[int(rng.integers(len(categories)))]
            painted.append((mask_utils.decode(rle).astype(bool), category_colour(category)))
            annotations.append({"category_id": category,
                                "segmentation": [[round(float(v), 2) for v in polygon.reshape(-1)]],
                                "area": area, "bbox": [round(float(v), 2) for v in mask_utils.toBbox(rle)],
                                "iscrowd": 0})
    for mask, colour in painted:  # z-order: later objects cover earlier ones, as in a photo
        image[mask] = colour
    if kind == "grayscale":
        image = cv2.cvtColor(image, cv2.COLOR_BGR2GRAY)
    for offset, ann in enumerate(annotations):
        ann.update(id=first_ann_id + offset, image_id=image_id)
    return image, annotations


def _write_split(output: Path, split: str, count: int, spec: CocoFixtureSpec,
                 seed_seq: np.random.SeedSequence) -> Path:
    image_dir = output / split
    image_dir.mkdir(parents=True, exist_ok=True)
    images, annotations = [], []
    image_id = 0
    for index, child in enumerate(seed_seq.spawn(count)):
        rng = np.random.default_rng(child)
        image_id += int(rng.integers(1, 400))  # sparse ids, like COCO's
        image, anns = _image_and_annotations(rng, spec, index, image_id, len(annotations) + 1)
        file_name = f"{image_id:012d}.jpg"
        if not cv2.imwrite(str(image_dir / file_name), image, [cv2.IMWRITE_JPEG_QUALITY, spec.quality]):
            raise OSError(f"could not write {image_dir / file_name}")
        images.append({"id": image_id, "file_name": file_name, "height": int(image.shape[0]),
                       "width": int(image.shape[1])})
        annotations.extend(anns)
    dataset = {
        "info": {"description": "COCO-realistic fixture (tests/coco_fixture.py)",
                 "spec": dataclasses.asdict(spec)},
        "licenses": [],
        "images": images,
        "annotations": annotations,
        "categories": [{"id": i, "name": n, "supercategory": s} for i, n, s in COCO_CATEGORIES],
    }
    return write_annotations(output, split, dataset)


def generate(output: str | os.PathLike, spec: CocoFixtureSpec = CocoFixtureSpec()) -> dict[str, Path]:
    """Write ``train2017`` and ``val2017`` under ``output``; returns {split: annotation file path}."""
    spec.validate()
    output = Path(output)
    train_seq, val_seq = np.random.SeedSequence(spec.seed).spawn(2)
    return {"train2017": _write_split(output, "train2017", spec.train, spec, train_seq),
            "val2017": _write_split(output, "val2017", spec.val, spec, val_seq)}


def main(argv: list[str] | None = None) -> int:
    defaults = CocoFixtureSpec()
    parser = argparse.ArgumentParser(
        prog="python tests/coco_fixture.py",
        description="Write a small COCO-realistic dataset: COCO image sizes, grayscale and unannotated "
                    "images, crowd RLE, many small objects, COCO's 80 category ids.")
    parser.add_argument("--output", required=True, help="dataset directory (created; files overwritten)")
    parser.add_argument("--train", type=int, default=defaults.train, help="training images")
    parser.add_argument("--val", type=int, default=defaults.val, help="validation images")
    parser.add_argument("--min-objects", type=int, default=defaults.min_objects)
    parser.add_argument("--max-objects", type=int, default=defaults.max_objects)
    parser.add_argument("--small-fraction", type=float, default=defaults.small_fraction)
    parser.add_argument("--quality", type=int, default=defaults.quality, help="JPEG quality")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    args = vars(parser.parse_args(argv))
    output = args.pop("output")
    spec = CocoFixtureSpec(**args)
    try:
        paths = generate(output, spec)
    except ValueError as err:
        parser.error(str(err))
    for split, path in paths.items():
        print(f"{split}: {spec.train if split == 'train2017' else spec.val} images, annotations in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
