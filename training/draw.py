"""Draw object instances onto an image: translucent masks, box outlines, class names and scores.

For detections (``training.predict --draw``) and ground truth alike: :func:`draw_instances` takes
plain arrays, so anything that has boxes, masks and names can show them. Pure NumPy/OpenCV.
"""
from __future__ import annotations

import zlib
from typing import Sequence

import cv2
import numpy as np

MASK_ALPHA = 0.5   # weight of the instance's colour in a mask pixel
# BGR colours far from one another and from grey backgrounds; instance colours cycle through them.
PALETTE = ((60, 76, 231), (113, 204, 46), (219, 152, 52), (15, 196, 241), (182, 89, 155),
           (34, 126, 230), (156, 188, 26), (94, 73, 52), (133, 220, 246), (80, 80, 200))
FONT = cv2.FONT_HERSHEY_SIMPLEX


def class_color(key: int | str) -> tuple[int, int, int]:
    """A fixed colour per class id (the palette in order) or class name (by a checksum of it)."""
    index = key if isinstance(key, (int, np.integer)) else zlib.crc32(str(key).encode())
    return PALETTE[int(index) % len(PALETTE)]


def default_thickness(height: int, width: int) -> int:
    """Box outline width: 1 px per started 400 px of the longer side."""
    return max(1, -(-max(height, width) // 400))


def label_text(name: str | None, score: float | None) -> str:
    parts = ([name] if name else []) + ([f"{score:.2f}"] if score is not None else [])
    return " ".join(parts)


def draw_instances(image: np.ndarray, boxes, masks=None, names: Sequence[str] | None = None, scores=None, *,
                   colors: Sequence[tuple[int, int, int]] | None = None, alpha: float = MASK_ALPHA,
                   thickness: int | None = None, font_scale: float | None = None) -> np.ndarray:
    """A copy of ``image`` (BGR uint8 ``[H, W, 3]``) with N instances drawn on it.

    * ``masks`` ``[N, H, W]`` (nonzero = the instance), or None: every mask pixel becomes
      ``round((1 - alpha) * pixel + alpha * colour)``, instance after instance;
    * ``boxes`` ``[N, 4]`` x1, y1, x2, y2 in continuous pixel coordinates (pixel column i spans
      [i, i + 1), as COCO boxes): an outline ``thickness`` pixels wide along the inside of the box,
      on pixel columns round(x1) and round(x2) - 1 and rows round(y1) and round(y2) - 1 (1 px);
    * ``names`` and/or ``scores`` (optional): a label "name 0.97" on a filled box of the
      instance's colour, above the box's top-left corner (inside the box at the image's top edge).

    Masks go first, then every outline, then every label, so no mask hides a label. ``colors``:
    one BGR colour per instance; by default :func:`class_color` of its name (or its index).
    """
    if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
        raise ValueError(f"image must be BGR uint8 [H, W, 3], got {image.dtype} {image.shape}")
    out = image.copy()
    height, width = out.shape[:2]
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
    n = len(boxes)
    for what, values in (("masks", masks), ("names", names), ("scores", scores), ("colors", colors)):
        if values is not None and len(values) != n:
            raise ValueError(f"{what} has {len(values)} entries for {n} boxes")
    if masks is not None and n and np.shape(masks)[1:] != (height, width):
        raise ValueError(f"masks must be [N, {height}, {width}] (full-image), got {np.shape(masks)}")
    if colors is None:
        colors = [class_color(names[i] if names is not None else i) for i in range(n)]
    thickness = thickness or default_thickness(height, width)
    font_scale = font_scale or max(0.3, min(height, width) / 800)

    if masks is not None:
        for mask, color in zip(masks, colors):
            inside = np.asarray(mask) > 0
            blended = out[inside] * (1.0 - alpha) + np.asarray(color, np.float64) * alpha
            out[inside] = np.clip(np.round(blended), 0, 255).astype(np.uint8)
    corners = []
    for (x1, y1, x2, y2), color in zip(boxes, colors):
        left, top = int(round(x1)), int(round(y1))
        right, bottom = max(int(round(x2)), left + 1) - 1, max(int(round(y2)), top + 1) - 1
        corners.append((left, top))
        for k in range(thickness):
            if left + k > right - k or top + k > bottom - k:
                break
            cv2.rectangle(out, (left + k, top + k), (right - k, bottom - k), tuple(int(c) for c in color), 1)
    for i, ((left, top), color) in enumerate(zip(corners, colors)):
        text = label_text(names[i] if names is not None else None, float(scores[i]) if scores is not None else None)
        if text:
            _label(out, text, left, top, color, font_scale)
    return out


def _label(out: np.ndarray, text: str, left: int, top: int, color, font_scale: float) -> None:
    (tw, th), baseline = cv2.getTextSize(text, FONT, font_scale, 1)
    box_h = th + baseline + 2
    y0 = top - box_h if top - box_h >= 0 else top     # above the box, or inside it at the top edge
    cv2.rectangle(out, (left, y0), (left + tw + 2, y0 + box_h - 1), tuple(int(c) for c in color), cv2.FILLED)
    # dark text on light colours, white on dark ones (ITU-R BT.601 luma of the BGR colour)
    luma = 0.114 * color[0] + 0.587 * color[1] + 0.299 * color[2]
    ink = (0, 0, 0) if luma > 140 else (255, 255, 255)
    cv2.putText(out, text, (left + 1, y0 + th + 1), FONT, font_scale, ink, 1, cv2.LINE_AA)


def write_image(path, image: np.ndarray) -> None:
    """Write ``image`` (BGR) in the format its suffix names (JPEG at quality 95); a clear error if not."""
    path = str(path)
    params = [cv2.IMWRITE_JPEG_QUALITY, 95] if path.lower().endswith((".jpg", ".jpeg")) else []
    if not cv2.imwrite(path, image, params):
        raise OSError(f"cannot write image {path}: unsupported suffix or unwritable folder")
