"""Augmentation: shorter-side resize with a maximum size, horizontal flip, and instance masks.

Pure NumPy/OpenCV functions; the input pipeline composes them. Coordinates are continuous pixel
coordinates (pixel column i spans [i, i+1)), the convention of COCO boxes and polygons, so a
resize multiplies x by new_width / width and a flip maps x to width - x.

Instance segmentations come from ``training.data.coco`` records: per instance a list of flat
polygons, or a compressed RLE dict. Polygons are transformed as coordinates and rasterised at the
output resolution; RLE is decoded at the input resolution and its mask resized (nearest neighbour)
and flipped with the image.
"""
from __future__ import annotations

from typing import Sequence

import cv2
import numpy as np
from pycocotools import mask as mask_utils

Scale = tuple  # (sx, sy): output pixels per input pixel along x and y


def resized_shape(height: int, width: int, short_size: float, max_size: float) -> tuple[int, int]:
    """(new_height, new_width): shorter side to ``short_size`` unless the longer one would pass ``max_size``.

    tensorpack's CustomResize arithmetic: the short side is ``short_size`` exactly, the long one
    scaled; over ``max_size`` both are scaled down again; each is rounded half up (``int(x + 0.5)``).
    """
    if height <= 0 or width <= 0:
        raise ValueError(f"image size must be positive, got {height}x{width}")
    scale = short_size / min(height, width)
    if height < width:
        new_h, new_w = float(short_size), scale * width
    else:
        new_h, new_w = scale * height, float(short_size)
    if max_size and max(new_h, new_w) > max_size:
        scale = max_size / max(new_h, new_w)
        new_h, new_w = new_h * scale, new_w * scale
    return max(1, int(new_h + 0.5)), max(1, int(new_w + 0.5))


def resize_shorter_side(image: np.ndarray, short_size: float, max_size: float,
                        interpolation: int = cv2.INTER_LINEAR) -> tuple[np.ndarray, Scale]:
    """Resize ``image`` [H, W, C]; returns it and the exact per-axis scale (after rounding the size)."""
    height, width = image.shape[:2]
    new_h, new_w = resized_shape(height, width, short_size, max_size)
    if (new_h, new_w) != (height, width):
        image = cv2.resize(image, (new_w, new_h), interpolation=interpolation)
    return image, (new_w / width, new_h / height)


def scale_boxes(boxes: np.ndarray, scale: Scale) -> np.ndarray:
    sx, sy = scale
    return (np.asarray(boxes, np.float32).reshape(-1, 4) * np.array([sx, sy, sx, sy], np.float32))


def scale_polygons(polygons: Sequence[Sequence[float]], scale: Scale) -> list[list[float]]:
    sx, sy = scale
    out = []
    for poly in polygons:
        xy = np.asarray(poly, np.float64).reshape(-1, 2) * (sx, sy)
        out.append(xy.reshape(-1).tolist())
    return out


def flip_image(image: np.ndarray) -> np.ndarray:
    """Mirror an [H, W] or [H, W, C] array left-right."""
    if image.ndim == 2 or image.shape[2] <= 4:
        return cv2.flip(image, 1)  # ~20x faster than a copy of the reversed view for a 3-channel image
    return np.ascontiguousarray(image[:, ::-1])


def flip_masks(masks: np.ndarray) -> np.ndarray:
    """Mirror a stack of masks [N, H, W] left-right."""
    return np.ascontiguousarray(masks[:, :, ::-1])


def flip_boxes(boxes: np.ndarray, width: float) -> np.ndarray:
    boxes = np.asarray(boxes, np.float32).reshape(-1, 4)
    flipped = boxes.copy()
    flipped[:, 0] = width - boxes[:, 2]
    flipped[:, 2] = width - boxes[:, 0]
    return flipped


def flip_polygons(polygons: Sequence[Sequence[float]], width: float) -> list[list[float]]:
    out = []
    for poly in polygons:
        xy = np.asarray(poly, np.float64).reshape(-1, 2).copy()
        xy[:, 0] = width - xy[:, 0]
        out.append(xy.reshape(-1).tolist())
    return out


def segmentation_to_mask(segmentation, height: int, width: int) -> np.ndarray:
    """A binary uint8 [height, width] mask from polygons (a list of flat lists) or an RLE dict."""
    if isinstance(segmentation, dict):
        rle = segmentation
        if isinstance(rle.get("counts"), list):
            rle = mask_utils.frPyObjects(rle, height, width)
        if [int(v) for v in rle["size"]] != [height, width]:
            raise ValueError(f"RLE of size {rle['size']} for a {height}x{width} image")
        return mask_utils.decode(rle).astype(np.uint8)
    polygons = [list(map(float, p)) for p in segmentation if len(p) >= 6]
    if not polygons:
        return np.zeros((height, width), np.uint8)
    rles = mask_utils.frPyObjects(polygons, height, width)
    return mask_utils.decode(mask_utils.merge(rles)).astype(np.uint8)


def instance_masks(segmentations: Sequence, height: int, width: int) -> np.ndarray:
    """Stack of binary masks [N, height, width] uint8, one per instance."""
    if not len(segmentations):
        return np.zeros((0, height, width), np.uint8)
    return np.stack([segmentation_to_mask(s, height, width) for s in segmentations])


def transform_segmentation(segmentation, height: int, width: int, scale: Scale,
                           new_height: int, new_width: int, flip: bool) -> np.ndarray:
    """One instance's mask at the output resolution, after a resize by ``scale`` and optional flip."""
    if isinstance(segmentation, dict):
        mask = segmentation_to_mask(segmentation, height, width)
        if (new_height, new_width) != (height, width):
            mask = cv2.resize(mask, (new_width, new_height), interpolation=cv2.INTER_NEAREST)
        return flip_image(mask) if flip else mask
    polygons = scale_polygons(segmentation, scale)
    if flip:
        polygons = flip_polygons(polygons, new_width)
    return segmentation_to_mask(polygons, new_height, new_width)


def augment_record(image: np.ndarray, record: dict, short_size: float, max_size: float,
                   flip: bool, with_masks: bool = True) -> dict:
    """Resize and optionally flip an image with its boxes and masks, consistently.

    ``record`` is a ``training.data.coco`` record whose image is ``image`` (RGB or BGR, [H, W, 3]).
    Returns ``image``, ``boxes`` (float32 [N, 4]), ``masks`` (uint8 [N, H', W'] or None), ``scale``
    (sx, sy) and ``flipped``; a box of the output maps back to the input by un-flipping and dividing
    by ``scale``.
    """
    height, width = image.shape[:2]
    out_image, scale = resize_shorter_side(image, short_size, max_size)
    new_h, new_w = out_image.shape[:2]
    boxes = scale_boxes(record["boxes"], scale)
    if flip:
        out_image = flip_image(out_image)
        boxes = flip_boxes(boxes, new_w)
    masks = None
    if with_masks:
        segms = record["segmentation"]
        masks = (np.stack([transform_segmentation(s, height, width, scale, new_h, new_w, flip) for s in segms])
                 if len(segms) else np.zeros((0, new_h, new_w), np.uint8))
    return {"image": out_image, "boxes": boxes, "masks": masks, "scale": scale, "flipped": bool(flip)}


def sample_short_size(rng: np.random.Generator, size_range: Sequence[int]) -> int:
    """A shorter-side length drawn uniformly from PREPROC.TRAIN_SHORT_EDGE_SIZE = [min, max]."""
    low, high = int(size_range[0]), int(size_range[-1])
    return int(rng.integers(low, high + 1))
