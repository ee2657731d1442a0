"""One training image, prepared: read, resized, maybe flipped, its masks rasterised and packed.

Pure NumPy / OpenCV / pycocotools, no TensorFlow and no tensorpack: the input worker processes
(``training.data.workers``) import this module and must stay light. The training batch's shape
is planned before any image is read (:func:`draw_augmentation` fixes each image's size first).
"""
from __future__ import annotations

import dataclasses

import cv2
import numpy as np

from training.config import COARSEST_STRIDE
from training.data import augment, packed_masks

SIZE_DIVISOR = COARSEST_STRIDE  # padded sides divide by it so every backbone level aligns


class ImageReadError(IOError):
    pass


def read_image(path: str) -> np.ndarray:
    """A BGR uint8 image (OpenCV's order, which the ImageNet weights and PIXEL_MEAN/STD expect;
    grayscale files come back as 3 equal channels); a clear error if missing or unreadable."""
    image = cv2.imread(path, cv2.IMREAD_COLOR)
    if image is None:
        raise ImageReadError(f"cannot read image {path}: missing or not an image file")
    return image


def padded_size(height: int, width: int, divisor: int = SIZE_DIVISOR) -> tuple[int, int]:
    return -(-height // divisor) * divisor, -(-width // divisor) * divisor


def batch_padded_size(sizes, cfg) -> tuple[int, int]:
    """Padded side lengths of a training batch of images of ``sizes`` ``[(h, w), ...]``.

    The smallest multiples of 32 that hold them; with TRAIN.XLA, one of at most four fixed shapes
    instead, ``{S, L} x {S, L}`` where S and L are the longest short and long edge the resizing can
    give (PREPROC.TRAIN_SHORT_EDGE_SIZE[1] and PREPROC.MAX_SIZE, rounded up to 32): (S, L) for a
    landscape batch, (L, S) portrait, (L, L) mixed. XLA compiles each cluster once per input
    shape; with free shapes it would recompile at almost every step.
    """
    hp, wp = padded_size(max(h for h, _ in sizes), max(w for _, w in sizes))
    if not cfg.TRAIN.XLA:
        return hp, wp
    short, long = padded_size(cfg.PREPROC.TRAIN_SHORT_EDGE_SIZE[1], cfg.PREPROC.MAX_SIZE)
    return (short if hp <= short else long), (short if wp <= short else long)


@dataclasses.dataclass(frozen=True)
class Augmentation:
    """What happens to one training image, drawn before it is read: the batch's shape follows."""

    short_size: int
    flip: bool
    height: int     # after the resize
    width: int


def draw_augmentation(record: dict, cfg, rng: np.random.Generator) -> Augmentation:
    short = augment.sample_short_size(rng, cfg.PREPROC.TRAIN_SHORT_EDGE_SIZE)
    flip = bool(cfg.PREPROC.HORIZONTAL_FLIP and rng.random() < 0.5)
    h, w = augment.resized_shape(int(record["height"]), int(record["width"]), short, cfg.PREPROC.MAX_SIZE)
    return Augmentation(short, flip, h, w)


def packed_polygon_mask(polygons, height: int, width: int):
    """``(y0, byte column, packed crop)``: one instance's polygons rasterised by pycocotools
    in the smallest byte-aligned window around them instead of the whole image (the same pixels up
    to pycocotools' vertex rounding after the shift: a rare edge pixel)."""
    xy = np.concatenate([np.asarray(p, np.float64).reshape(-1, 2) for p in polygons])
    x0 = int(np.clip(np.floor(xy[:, 0].min()) - 1, 0, width)) // packed_masks.BITS * packed_masks.BITS
    y0 = int(np.clip(np.floor(xy[:, 1].min()) - 1, 0, height))
    x1 = int(np.clip(np.ceil(xy[:, 0].max()) + 1, 0, width))
    y1 = int(np.clip(np.ceil(xy[:, 1].max()) + 1, 0, height))
    crop_w = -(-max(x1 - x0, 1) // packed_masks.BITS) * packed_masks.BITS
    crop_h = max(y1 - y0, 1)
    shifted = [(np.asarray(p, np.float64).reshape(-1, 2) - (x0, y0)).reshape(-1).tolist() for p in polygons]
    mask = augment.segmentation_to_mask(shifted, crop_h, crop_w)
    mask[:, max(width - x0, 0):] = 0  # the byte-aligned window may reach past the right edge
    return y0, x0 // packed_masks.BITS, packed_masks.pack(mask)


def augmented_example(record: dict, cfg, aug: Augmentation) -> dict:
    """Read, resize, maybe flip; the non-crowd instances' masks rasterised and packed."""
    image = read_image(record["file_name"])
    if image.shape[:2] != (int(record["height"]), int(record["width"])):
        raise ImageReadError(f"{record['file_name']} is {image.shape[1]}x{image.shape[0]} pixels but its annotation "
                             f"says {record['width']}x{record['height']}: fix the annotation file or the image")
    out = augment.augment_record(image, record, aug.short_size, cfg.PREPROC.MAX_SIZE, aug.flip, with_masks=False)
    crowd = np.asarray(record["is_crowd"], bool)
    masks = []
    if cfg.MODE_MASK:
        height, width = image.shape[:2]
        scale = out["scale"]
        for segm, is_crowd in zip(record["segmentation"], crowd):
            if is_crowd:  # crowd regions only silence RPN anchors; they have no mask target
                continue
            if isinstance(segm, dict):  # RLE: decoded at the input size, resized and flipped like the image
                mask = augment.transform_segmentation(segm, height, width, scale, aug.height, aug.width, aug.flip)
                masks.append((0, 0, packed_masks.pack(mask)))
            else:
                polygons = augment.scale_polygons(segm, scale)
                if aug.flip:
                    polygons = augment.flip_polygons(polygons, aug.width)
                masks.append(packed_polygon_mask(polygons, aug.height, aug.width))
    return {"image": out["image"], "boxes": out["boxes"], "class": np.asarray(record["class"], np.int32),
            "is_crowd": crowd, "masks": masks}


def prepare_training_example(record: dict, cfg, rng: np.random.Generator) -> dict:
    """Read, resize (random shorter side in the configured range), maybe flip; masks rasterised."""
    return augmented_example(record, cfg, draw_augmentation(record, cfg, rng))
