"""Run a trained detector on images: resize, predict in batches, map back to each image, paste masks.

Shared by the in-training COCO evaluation (training/callbacks.py) and ``training.predict``.

A batch holds only images whose padded network inputs have the same size. The model's output for
an image depends on how far it is padded, not only on its pixels: padding beyond an image's own
multiple of 32 changes what the convolutions see at its border and, with GroupNorm, the statistics
of every feature map. Grouping by padded size keeps each image's detections what it gets alone,
whatever the batch size.
"""
from __future__ import annotations

from typing import Iterable, Iterator

import numpy as np

from training.data.augment import resized_shape
from training.data.pipeline import padded_size, prepare_test_image
from training.model.mask_head import mask_paster

# Images read ahead per batch slot while waiting for images of the same padded size.
WINDOW_PER_SLOT = 4


def network_input_size(image: np.ndarray, cfg) -> tuple[int, int]:
    """The padded ``(height, width)`` the network sees for ``image`` (what :func:`detect_batch` groups by)."""
    height, width = image.shape[:2]
    return padded_size(*resized_shape(height, width, cfg.PREPROC.TEST_SHORT_EDGE_SIZE, cfg.PREPROC.MAX_SIZE))


def detect_batch(predict_fn, images: list[np.ndarray], cfg) -> list[dict]:
    """One ``predict_fn(images, image_hw) -> (boxes, scores, labels, masks, detections_per_image)``
    run on ``images``, which must share :func:`network_input_size`.

    Returns per image: boxes (x1y1x2y2 in that image's pixels), scores, labels (1..C) and, with
    MODE_MASK, binary masks ``[N, H, W]`` at the image's resolution.
    """
    prepared = [prepare_test_image(image, cfg) for image in images]
    shapes = {batch.shape for batch, _, _ in prepared}
    if len(shapes) != 1:
        raise ValueError(f"a batch needs images of one padded size, got {sorted(s[1:3] for s in shapes)}")
    batch = np.concatenate([b for b, _, _ in prepared])
    image_hw = np.concatenate([hw for _, hw, _ in prepared])
    boxes, scores, labels, masks, counts = predict_fn(batch, image_hw)
    ends = np.cumsum(np.asarray(counts, np.int64))
    if len(ends) != len(images) or (len(ends) and ends[-1] != len(boxes)):
        raise ValueError(f"the model returned {len(boxes)} detections for counts {list(counts)} of {len(images)} images")
    out = []
    for image, (_, _, scale), start, end in zip(images, prepared, np.concatenate([[0], ends[:-1]]), ends):
        out.append(_in_image(image, scale, boxes[start:end], scores[start:end], labels[start:end],
                             masks[start:end], cfg))
    return out


def detect_all(predict_fn, indexed_images: Iterable[tuple[int, np.ndarray]], cfg, *,
               batch_size: int | None = None) -> Iterator[tuple[int, np.ndarray, dict]]:
    """``(index, image, detections)`` for every ``(index, image)``, ``batch_size`` images (default
    TEST.BATCH_SIZE) per session run.

    Images wait, at most ``WINDOW_PER_SLOT * batch_size`` of them, for others of their padded size;
    when the window is full, the group of the longest-waiting image runs as it is. Results come in
    batch order, which can differ from the input order: the index says which image each is.
    """
    batch_size = batch_size or cfg.TEST.BATCH_SIZE
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    groups: dict[tuple[int, int], list] = {}   # insertion order: the group of the oldest image first

    def run(key):
        group = groups.pop(key)
        for (index, image), det in zip(group, detect_batch(predict_fn, [image for _, image in group], cfg)):
            yield index, image, det

    for index, image in indexed_images:
        key = network_input_size(image, cfg)
        groups.setdefault(key, []).append((index, image))
        if len(groups[key]) == batch_size:
            yield from run(key)
        elif sum(len(g) for g in groups.values()) >= WINDOW_PER_SLOT * batch_size:
            yield from run(min(groups, key=lambda k: groups[k][0][0]))
    while groups:
        yield from run(min(groups, key=lambda k: groups[k][0][0]))


def _in_image(image, scale, boxes, scores, labels, masks, cfg) -> dict:
    """Detections in the original image's pixels. Boxes are divided by the resize's own scale
    along each axis (the exact inverse of the resize, which training applies to the ground truth
    per axis too), where tensorpack's eval.py divides both axes by sqrt(sx * sy); then clipped
    to the image, and the masks pasted as the exported model pastes them."""
    sx, sy = scale
    height, width = image.shape[:2]
    boxes = np.asarray(boxes, np.float32).reshape(-1, 4) / np.array([sx, sy, sx, sy], np.float32)
    boxes[:, [0, 2]] = np.clip(boxes[:, [0, 2]], 0, width)
    boxes[:, [1, 3]] = np.clip(boxes[:, [1, 3]], 0, height)
    out = {"boxes": boxes, "scores": np.asarray(scores, np.float32), "labels": np.asarray(labels, np.int32),
           "masks": None}
    if cfg.MODE_MASK:
        paste = mask_paster(cfg.MRCNN.MASK_SIZE, accurate=cfg.MRCNN.ACCURATE_PASTE)
        out["masks"] = paste(boxes, np.asarray(masks, np.float32).reshape(-1, cfg.MRCNN.MASK_SIZE, cfg.MRCNN.MASK_SIZE),
                             height, width)
    return out
