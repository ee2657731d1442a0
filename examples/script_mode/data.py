"""An MNIST-like data set made by the project: 28x28 grayscale digits rendered with OpenCV's
Hershey fonts, then randomly thickened, rotated, scaled, sheared, shifted and noised.

Nothing is downloaded. The same seed gives the same arrays on every machine (one numpy
``Generator`` drives every random choice, and OpenCV's rendering is deterministic), so the local
runs, the tests and a SageMaker job see identical data.

    python -m script_mode.data --out data/script_mode/digits.npz
"""
from __future__ import annotations

import argparse
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

IMAGE_SIZE = 28
NUM_CLASSES = 10
# The file name the training script looks for inside its data channel (SM_CHANNEL_TRAINING).
DATA_FILE = "digits.npz"

DEFAULT_TRAIN = 12000
DEFAULT_TEST = 2000
DEFAULT_SEED = 0

# Eight stroke styles, from thin sans to cursive; the italic flag doubles some of them.
_FONTS = (
    cv2.FONT_HERSHEY_SIMPLEX,
    cv2.FONT_HERSHEY_PLAIN,
    cv2.FONT_HERSHEY_DUPLEX,
    cv2.FONT_HERSHEY_COMPLEX,
    cv2.FONT_HERSHEY_TRIPLEX,
    cv2.FONT_HERSHEY_COMPLEX_SMALL,
    cv2.FONT_HERSHEY_SCRIPT_SIMPLEX,
    cv2.FONT_HERSHEY_SCRIPT_COMPLEX,
)
# Glyphs are drawn on a larger canvas and shrunk, which anti-aliases the strokes like MNIST's.
_CANVAS = 64


@dataclass(frozen=True)
class Digits:
    x_train: np.ndarray  # uint8 [N, 28, 28]
    y_train: np.ndarray  # int64 [N]
    x_test: np.ndarray
    y_test: np.ndarray


def _render(digit: int, rng: np.random.Generator) -> np.ndarray:
    font = _FONTS[rng.integers(len(_FONTS))] | (cv2.FONT_ITALIC if rng.random() < 0.25 else 0)
    thickness = int(rng.integers(2, 7))
    text = str(digit)
    # Scale the glyph so its larger side fills 55-80 % of the canvas, whatever the font's metrics.
    (w, h), base = cv2.getTextSize(text, font, 1.0, thickness)
    scale = rng.uniform(0.55, 0.8) * _CANVAS / max(w, h + base)
    (w, h), base = cv2.getTextSize(text, font, scale, thickness)
    canvas = np.zeros((_CANVAS, _CANVAS), np.uint8)
    origin = ((_CANVAS - w) // 2, (_CANVAS + h) // 2)
    cv2.putText(canvas, text, origin, font, scale, 255, thickness, cv2.LINE_AA)

    # Random affine about the centre: rotation, anisotropic scale, shear, shift.
    angle = np.deg2rad(rng.uniform(-15, 15))
    sx, sy = rng.uniform(0.85, 1.15, size=2)
    shear = rng.uniform(-0.25, 0.25)
    tx, ty = rng.uniform(-0.08, 0.08, size=2) * _CANVAS
    rot = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
    linear = rot @ np.array([[1.0, shear], [0.0, 1.0]]) @ np.diag([sx, sy])
    centre = np.array([_CANVAS / 2, _CANVAS / 2])
    offset = centre - linear @ centre + [tx, ty]
    warped = cv2.warpAffine(canvas, np.hstack([linear, offset[:, None]]), (_CANVAS, _CANVAS),
                            flags=cv2.INTER_LINEAR, borderValue=0)

    small = cv2.resize(warped, (IMAGE_SIZE, IMAGE_SIZE), interpolation=cv2.INTER_AREA)
    noisy = small.astype(np.float32) + rng.normal(0.0, rng.uniform(0, 20), small.shape)
    return np.clip(noisy, 0, 255).astype(np.uint8)


def _make(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    labels = rng.integers(0, NUM_CLASSES, size=n)
    images = np.stack([_render(int(d), rng) for d in labels]) if n else \
        np.zeros((0, IMAGE_SIZE, IMAGE_SIZE), np.uint8)
    return images, labels.astype(np.int64)


def generate(n_train: int = DEFAULT_TRAIN, n_test: int = DEFAULT_TEST,
             seed: int = DEFAULT_SEED) -> Digits:
    """Render the data set. Train and test come from independent streams of the same seed, so
    asking for more training images leaves the test set unchanged."""
    if n_train < 1 or n_test < 1:
        raise ValueError(f"need at least one training and one test image, got "
                         f"n_train={n_train}, n_test={n_test}")
    train_rng, test_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))
    x_train, y_train = _make(n_train, train_rng)
    x_test, y_test = _make(n_test, test_rng)
    return Digits(x_train, y_train, x_test, y_test)


def save(digits: Digits, path: str | os.PathLike) -> Path:
    """Write atomically (temp file + rename) so a crashed run never leaves half a data set."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp.npz")
    os.close(fd)
    try:
        np.savez_compressed(tmp, x_train=digits.x_train, y_train=digits.y_train,
                            x_test=digits.x_test, y_test=digits.y_test)
        os.chmod(tmp, 0o644)  # mkstemp makes it owner-only
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path


def load(path: str | os.PathLike) -> Digits:
    """Read a file written by ``save``; a directory means ``<dir>/digits.npz`` (a data channel)."""
    path = Path(path)
    if path.is_dir():
        path = path / DATA_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"no data set at {path}: create it with `python -m script_mode.data --out {path}`")
    with np.load(path) as f:
        return Digits(f["x_train"], f["y_train"], f["x_test"], f["y_test"])


def ensure(path: str | os.PathLike, n_train: int = DEFAULT_TRAIN, n_test: int = DEFAULT_TEST,
           seed: int = DEFAULT_SEED) -> Path:
    """Create the data set at ``path`` unless a file is already there."""
    path = Path(path)
    if not path.is_file():
        save(generate(n_train, n_test, seed), path)
    return path


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=f"data/script_mode/{DATA_FILE}", help="output .npz path")
    p.add_argument("--train", type=int, default=DEFAULT_TRAIN, help="training images")
    p.add_argument("--test", type=int, default=DEFAULT_TEST, help="test images")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED)
    a = p.parse_args(argv)
    path = save(generate(a.train, a.test, a.seed), a.out)
    print(f"wrote {a.train} training and {a.test} test images to {path}")


if __name__ == "__main__":
    main()
