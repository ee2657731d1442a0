"""Run a trained detector on one image: resize, predict, map back to the image, paste masks.

Shared by the in-training COCO evaluation (training/callbacks.py) and ``training.predict``.
"""
from __future__ import annotations

import numpy as np

from training.data.pipeline import prepare_test_image
from training.model.mask_head import paste_mask


def detect(predict_fn, image: np.ndarray, cfg) -> dict:
    """``predict_fn(images, image_hw) -> (boxes, scores, labels, masks)`` on the network input.

    Returns boxes (x1y1x2y2 in ``image``'s pixels), scores, labels (1..C) and, with MODE_MASK,
    binary masks ``[N, H, W]`` at the image's resolution.
    """
    batch, image_hw, (sx, sy) = prepare_test_image(image, cfg)
    boxes, scores, labels, masks = predict_fn(batch, image_hw)
    height, width = image.shape[:2]
    boxes = np.asarray(boxes, np.float32).reshape(-1, 4) / np.array([sx, sy, sx, sy], np.float32)
    boxes[:, [0, 2]] = np.clip(boxes[:, [0, 2]], 0, width)
    boxes[:, [1, 3]] = np.clip(boxes[:, [1, 3]], 0, height)
    out = {"boxes": boxes, "scores": np.asarray(scores, np.float32), "labels": np.asarray(labels, np.int32),
           "masks": None}
    if cfg.MODE_MASK:
        out["masks"] = (np.stack([paste_mask(b, m, height, width, accurate=cfg.MRCNN.ACCURATE_PASTE) for b, m in zip(boxes, masks)])
                        if len(boxes) else np.zeros((0, height, width), np.uint8))
    return out
