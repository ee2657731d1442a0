"""A deterministic synthetic COCO-format dataset: coloured shapes on a textured background.

Writes a real dataset that the COCO reader, the trainer and COCOeval use like any other::

    OUTPUT/annotations/instances_train2017.json   OUTPUT/train2017/000000000001.png ...
    OUTPUT/annotations/instances_val2017.json     OUTPUT/val2017/000000000001.png ...

Three categories (circle, square, triangle) in several sizes and colours, partially overlapping;
``--categories`` picks others from a catalogue of shapes (hexagon, star, cross, ...), each keeping its
catalogue id, so a subset has the non-contiguous category ids real datasets often have.
Masks are exact by construction: every shape is a polygon (a circle is a 64-gon, within 0.05 px of
the true circle at the default sizes), rasterised once with pycocotools, and that very raster is
what gets painted. Shapes are painted in z-order, so an object's visible mask is its raster minus
the rasters of the objects above it. A fully visible object is annotated with its polygon (whose
COCO rasterisation is exactly the painted pixels); an occluded one with the RLE of its visible
pixels (a polygon cannot represent "polygon minus polygon" exactly at pixel level). bbox and area
are those of the visible mask. Objects are flat-coloured, so a mask can be checked against the
image pixel by pixel.

``--layout files`` writes what a team's own dataset usually looks like instead: an annotation file
per split and an image folder per split, named by the dataset rather than by COCO::

    OUTPUT/train.json   OUTPUT/images/train/000000000001.png ...
    OUTPUT/val.json     OUTPUT/images/val/000000000001.png ...

Same arguments and seed give byte-identical annotation files and images. Commands::

    maskrcnn synthetic --output data/synthetic --train 1000 --val 100 --size 128 --seed 0
    maskrcnn synthetic --output data/tools --categories hexagon,star,cross --layout files
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

from training.data.coco import write_annotations, write_annotations_file

# Every shape the generator can draw, with its category id; the default dataset uses the first three.
CATALOGUE = ({"id": 1, "name": "circle", "supercategory": "shape"},
             {"id": 2, "name": "square", "supercategory": "shape"},
             {"id": 3, "name": "triangle", "supercategory": "shape"},
             {"id": 4, "name": "hexagon", "supercategory": "shape"},
             {"id": 5, "name": "star", "supercategory": "shape"},
             {"id": 6, "name": "cross", "supercategory": "shape"})
SHAPE_NAMES = tuple(c["name"] for c in CATALOGUE)
DEFAULT_CATEGORIES = SHAPE_NAMES[:3]
CATEGORIES = CATALOGUE[:3]
LAYOUTS = ("coco", "files")

# Saturated RGB colours; the background is low-saturation, so no background pixel equals one.
PALETTE = ((230, 40, 40), (40, 200, 60), (50, 90, 235), (240, 210, 30),
           (220, 50, 220), (40, 215, 220), (245, 140, 20), (150, 60, 230))

CIRCLE_VERTICES = 64
SPLITS = ("train2017", "val2017")
FILES_SPLITS = ("train", "val")     # --layout files: OUTPUT/<split>.json and OUTPUT/images/<split>/
STAR_INNER = 0.45                   # a star's inner radius, as a fraction of its outer one
CROSS_ARM = 1 / 3                   # a cross's arm width, as a fraction of its extent


@dataclasses.dataclass(frozen=True)
class SyntheticSpec:
    """What to generate; every field is a command-line option."""

    train: int = 1000
    val: int = 100
    size: int = 128                 # square images, size x size pixels
    min_objects: int = 1
    max_objects: int = 4
    min_object_size: int = 20       # extent of a shape (circle diameter, square side, ...) in px
    max_object_size: int = 64
    min_visible: float = 0.5        # an occluded object keeps at least this fraction of its pixels
    image_format: str = "png"       # png (lossless, exact colours) or jpg
    seed: int = 0
    categories: tuple = DEFAULT_CATEGORIES   # shape names from CATALOGUE
    layout: str = "coco"            # coco (annotations/instances_<split>.json) or files (<split>.json)

    def category_list(self) -> list[dict]:
        by_name = {c["name"]: c for c in CATALOGUE}
        return [dict(by_name[name]) for name in self.categories]

    def validate(self) -> None:
        problems = []
        if self.train < 1 or self.val < 1:
            problems.append(f"--train and --val must be >= 1 (got {self.train}, {self.val})")
        if self.size < 32:
            problems.append(f"--size must be >= 32 px (got {self.size})")
        if not 1 <= self.min_objects <= self.max_objects:
            problems.append(f"need 1 <= --min-objects <= --max-objects (got {self.min_objects}, "
                            f"{self.max_objects})")
        if not 8 <= self.min_object_size <= self.max_object_size <= self.size:
            problems.append(f"need 8 <= --min-object-size <= --max-object-size <= --size (got "
                            f"{self.min_object_size}, {self.max_object_size}, {self.size})")
        if not 0.0 < self.min_visible <= 1.0:
            problems.append(f"--min-visible must be in (0, 1] (got {self.min_visible})")
        if self.image_format not in ("png", "jpg"):
            problems.append(f"--format must be png or jpg (got {self.image_format!r})")
        unknown = [c for c in self.categories if c not in SHAPE_NAMES]
        if not self.categories or unknown or len(set(self.categories)) != len(self.categories):
            problems.append(f"--categories must name distinct shapes among {', '.join(SHAPE_NAMES)} "
                            f"(got {','.join(self.categories) or 'none'})")
        if self.layout not in LAYOUTS:
            problems.append(f"--layout must be one of {', '.join(LAYOUTS)} (got {self.layout!r})")
        if problems:
            raise ValueError("invalid synthetic dataset options: " + "; ".join(problems))


def _shape_polygon(rng: np.random.Generator, shape: str, size: float) -> np.ndarray:
    """Vertices [K, 2] (x, y) of a shape of extent ``size`` centred at the origin."""
    if shape == "circle":  # diameter `size`
        angles = np.arange(CIRCLE_VERTICES) * (2 * math.pi / CIRCLE_VERTICES)
        radius = size / 2
    elif shape == "square":  # side `size`, axis-aligned or tilted up to 30 degrees
        angles = np.array([0.25, 0.75, 1.25, 1.75]) * math.pi + rng.uniform(-math.pi / 6, math.pi / 6)
        radius = size / math.sqrt(2)
    elif shape == "triangle":  # equilateral, side `size`, any rotation
        angles = np.array([0.0, 2 / 3, 4 / 3]) * math.pi + rng.uniform(0, 2 * math.pi)
        radius = size / math.sqrt(3)
    elif shape == "hexagon":  # regular, corner to corner `size`, any rotation
        angles = np.arange(6) * (math.pi / 3) + rng.uniform(0, math.pi / 3)
        radius = size / 2
    elif shape == "star":  # five points on a circle of diameter `size`, any rotation
        angles = np.arange(10) * (math.pi / 5) + rng.uniform(0, 2 * math.pi / 5)
        radius = np.where(np.arange(10) % 2 == 0, size / 2, STAR_INNER * size / 2)
    elif shape == "cross":  # a plus sign `size` wide, arms CROSS_ARM of it, tilted up to 30 degrees
        a, b = size / 2, CROSS_ARM * size / 2
        corners = np.array([(b, a), (b, b), (a, b), (a, -b), (b, -b), (b, -a),
                            (-b, -a), (-b, -b), (-a, -b), (-a, b), (-b, b), (-b, a)])
        turn = rng.uniform(-math.pi / 6, math.pi / 6)
        rotation = np.array([[math.cos(turn), -math.sin(turn)], [math.sin(turn), math.cos(turn)]])
        return corners @ rotation.T
    else:
        raise ValueError(f"unknown shape {shape!r}: one of {', '.join(SHAPE_NAMES)}")
    return np.stack([radius * np.cos(angles), radius * np.sin(angles)], axis=1)


def _rasterize(polygon: np.ndarray, height: int, width: int) -> np.ndarray:
    """The pixels pycocotools assigns to ``polygon``: the same function COCO tools apply to it."""
    rle = mask_utils.frPyObjects([polygon.reshape(-1).tolist()], height, width)
    return mask_utils.decode(rle)[:, :, 0].astype(bool)


def _background(rng: np.random.Generator, size: int) -> np.ndarray:
    """Low-saturation texture: a tinted gradient, soft stripes and per-pixel noise."""
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size
    base = rng.uniform(70, 170)
    tint = rng.uniform(-12, 12, size=3)
    gradient = rng.uniform(-25, 25) * xx + rng.uniform(-25, 25) * yy
    angle, period = rng.uniform(0, math.pi), rng.uniform(0.08, 0.3)
    stripes = 10 * np.sin((xx * math.cos(angle) + yy * math.sin(angle)) / period * 2 * math.pi)
    noise = rng.normal(0, 6, size=(size, size, 1))
    image = base + gradient[..., None] + stripes[..., None] + noise + tint
    # Channel spread stays well under 100, while every palette colour spreads over more than 100.
    return np.clip(image, 0, 255).astype(np.uint8)


@dataclasses.dataclass
class _Shape:
    category: int
    polygon: np.ndarray      # [K, 2]
    raster: np.ndarray       # [H, W] bool, the painted pixels before occlusion
    colour: tuple


def _place_shapes(rng: np.random.Generator, spec: SyntheticSpec) -> list[_Shape]:
    """Shapes in z-order (last on top), each keeping >= min_visible of its pixels visible."""
    size = spec.size
    wanted = int(rng.integers(spec.min_objects, spec.max_objects + 1))
    shapes: list[_Shape] = []
    for _ in range(wanted * 20):
        if len(shapes) == wanted:
            break
        index = int(rng.integers(1, len(spec.categories) + 1))
        shape_name = spec.categories[index - 1]
        category = SHAPE_NAMES.index(shape_name) + 1
        extent = float(rng.uniform(spec.min_object_size, spec.max_object_size))
        polygon = _shape_polygon(rng, shape_name, extent)
        low, high = polygon.min(axis=0), polygon.max(axis=0)
        if np.any(high - low > size):
            continue
        polygon = polygon + rng.uniform(-low, size - high)  # wholly inside the image
        raster = _rasterize(polygon, size, size)
        if raster.sum() < 16:
            continue
        # Everything below must stay visible enough once this shape covers part of it.
        covered = raster.copy()
        ok = True
        for below in reversed(shapes):
            visible = below.raster & ~covered
            if visible.sum() < spec.min_visible * below.raster.sum():
                ok = False
                break
            covered |= below.raster
        if not ok:
            continue
        # A colour differing from every shape this one touches, so touching shapes stay distinct.
        grown = cv2.dilate(raster.astype(np.uint8), np.ones((3, 3), np.uint8)).astype(bool)
        taken = {s.colour for s in shapes if (s.raster & grown).any()}
        free = [c for c in PALETTE if c not in taken] or list(PALETTE)
        colour = free[int(rng.integers(len(free)))]
        shapes.append(_Shape(category, polygon, raster, colour))
    return shapes


def _image_and_annotations(rng: np.random.Generator, spec: SyntheticSpec, image_id: int,
                           first_ann_id: int) -> tuple[np.ndarray, list[dict]]:
    image = _background(rng, spec.size)
    shapes = _place_shapes(rng, spec)
    for shape in shapes:
        image[shape.raster] = shape.colour
    annotations = []
    covered = np.zeros((spec.size, spec.size), bool)
    for shape in reversed(shapes):  # top to bottom
        visible = shape.raster & ~covered
        covered |= shape.raster
        rle = mask_utils.encode(np.asfortranarray(visible.astype(np.uint8)))
        if visible.sum() == shape.raster.sum():
            segmentation = [[round(float(v), 3) for v in shape.polygon.reshape(-1)]]
            # Rounding the vertices must not move a pixel: check against what was painted.
            if not np.array_equal(_rasterize(np.array(segmentation[0]), spec.size, spec.size), visible):
                segmentation = _rle_json(rle)
        else:
            segmentation = _rle_json(rle)
        annotations.append({
            "id": 0,  # numbered below, bottom to top
            "image_id": image_id,
            "category_id": shape.category,
            "segmentation": segmentation,
            "area": int(mask_utils.area(rle)),
            "bbox": [float(v) for v in mask_utils.toBbox(rle)],
            "iscrowd": 0,
        })
    annotations.reverse()
    for offset, ann in enumerate(annotations):
        ann["id"] = first_ann_id + offset
    return image, annotations


def _rle_json(rle: dict) -> dict:
    return {"size": [int(v) for v in rle["size"]], "counts": rle["counts"].decode("ascii")}


def _write_split(output: Path, split: str, count: int, spec: SyntheticSpec,
                 seed_seq: np.random.SeedSequence) -> Path:
    image_dir = output / split if spec.layout == "coco" else output / "images" / split
    image_dir.mkdir(parents=True, exist_ok=True)
    images, annotations = [], []
    extension = "png" if spec.image_format == "png" else "jpg"
    # One independent stream per image: image k is the same whatever --train/--val count is.
    for index, child in enumerate(seed_seq.spawn(count)):
        rng = np.random.default_rng(child)
        image_id = index + 1
        image, anns = _image_and_annotations(rng, spec, image_id, len(annotations) + 1)
        file_name = f"{image_id:012d}.{extension}"
        params = [cv2.IMWRITE_PNG_COMPRESSION, 3] if extension == "png" else [cv2.IMWRITE_JPEG_QUALITY, 95]
        if not cv2.imwrite(str(image_dir / file_name), image[:, :, ::-1], params):  # OpenCV wants BGR
            raise OSError(f"could not write {image_dir / file_name}")
        images.append({"id": image_id, "file_name": file_name, "height": spec.size, "width": spec.size})
        annotations.extend(anns)
    dataset = {
        "info": {"description": "synthetic shapes (training/data/synthetic.py)",
                 "spec": dataclasses.asdict(spec)},
        "licenses": [],
        "images": images,
        "annotations": annotations,
        "categories": spec.category_list(),
    }
    if spec.layout == "coco":
        return write_annotations(output, split, dataset)
    return write_annotations_file(output / f"{split}.json", dataset)


def generate(output: str | os.PathLike, spec: SyntheticSpec = SyntheticSpec()) -> dict[str, Path]:
    """Write the dataset under ``output``; returns {split: annotation file path}."""
    spec.validate()
    output = Path(output)
    train_seq, val_seq = np.random.SeedSequence(spec.seed).spawn(2)
    train, val = SPLITS if spec.layout == "coco" else FILES_SPLITS
    return {
        train: _write_split(output, train, spec.train, spec, train_seq),
        val: _write_split(output, val, spec.val, spec, val_seq),
    }


def main(argv: list[str] | None = None) -> int:
    defaults = SyntheticSpec()
    parser = argparse.ArgumentParser(
        prog="maskrcnn synthetic",
        description="Write a deterministic COCO-format dataset of coloured shapes with exact masks.")
    parser.add_argument("--output", required=True, help="dataset directory (created; files overwritten)")
    parser.add_argument("--train", type=int, default=defaults.train, help="training images")
    parser.add_argument("--val", type=int, default=defaults.val, help="validation images")
    parser.add_argument("--size", type=int, default=defaults.size, help="image side in pixels")
    parser.add_argument("--min-objects", type=int, default=defaults.min_objects)
    parser.add_argument("--max-objects", type=int, default=defaults.max_objects)
    parser.add_argument("--min-object-size", type=int, default=defaults.min_object_size,
                        help="smallest shape extent in pixels")
    parser.add_argument("--max-object-size", type=int, default=defaults.max_object_size,
                        help="largest shape extent in pixels")
    parser.add_argument("--min-visible", type=float, default=defaults.min_visible,
                        help="fraction of an occluded shape that stays visible")
    parser.add_argument("--format", dest="image_format", choices=("png", "jpg"), default=defaults.image_format)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--categories", default=",".join(defaults.categories),
                        help=f"comma-separated shapes, from: {', '.join(SHAPE_NAMES)}")
    parser.add_argument("--layout", choices=LAYOUTS, default=defaults.layout,
                        help="coco: annotations/instances_<split>.json beside <split>/; "
                             "files: <split>.json beside images/<split>/ (train, val)")
    args = vars(parser.parse_args(argv))
    output = args.pop("output")
    args["categories"] = tuple(name.strip() for name in args["categories"].split(",") if name.strip())
    spec = SyntheticSpec(**args)
    try:
        paths = generate(output, spec)
    except ValueError as err:
        parser.error(str(err))
    for (split, path), count in zip(paths.items(), (spec.train, spec.val)):
        print(f"{split}: {count} images, annotations in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
