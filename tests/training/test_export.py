"""training.export: the SavedModel, loaded with TensorFlow alone in a fresh process, detects what
``maskrcnn predict --images`` detects on the same files; its in-graph pre- and
post-processing matches the OpenCV/NumPy steps training.predict runs."""
import io
import json

import cv2
import numpy as np
import pytest
from pycocotools import mask as mask_utils

from saved_models import run_python

# Plain TensorFlow and NumPy: what a client of the export has (no project code on the path).
LOAD_AND_DETECT = """
import json, os, sys
import numpy as np
import tensorflow as tf
detect = tf.saved_model.load(sys.argv[1]).signatures["serving_default"]
out = {}
for name in sorted(os.listdir(sys.argv[2])):
    with open(os.path.join(sys.argv[2], name), "rb") as f:
        result = detect(image_bytes=tf.constant(f.read()))
    for key, value in result.items():
        value = value.numpy()
        out[f"{name}/{key}"] = value.astype(str) if value.dtype == object else value   # class names: bytes
np.savez(sys.argv[3], **out)
"""


@pytest.fixture(scope="module")
def exported(untrained_model):
    return untrained_model


@pytest.fixture(scope="module")
def images(exported, tmp_path_factory):
    """The synthetic val images at the model's input size (64 px: nothing to resize), one downscaled
    as JPEG, one upscaled PNG (the resize runs) and a JPEG stored turned with an EXIF orientation."""
    folder = tmp_path_factory.mktemp("images")
    for path in sorted((exported.data / "val2017").iterdir()):
        (folder / path.name).write_bytes(path.read_bytes())
    first = cv2.imread(str(sorted((exported.data / "val2017").iterdir())[0]))
    assert cv2.imwrite(str(folder / "down.jpg"), cv2.resize(first, (100, 80)), [cv2.IMWRITE_JPEG_QUALITY, 90])
    assert cv2.imwrite(str(folder / "up.png"), cv2.resize(first, (50, 40)))
    # a phone photo: its pixels stored turned, with the EXIF Orientation that turns them upright
    turned = np.rot90(cv2.resize(first, (100, 80))[:, :, ::-1], 1)
    (folder / "turned.jpg").write_bytes(_with_orientation(np.ascontiguousarray(turned), 6, "JPEG"))
    return folder


def _overlap(a: np.ndarray, rle: dict) -> tuple[int, int]:
    """(intersection, union) in pixels of a binary mask and an RLE-encoded one."""
    b = mask_utils.decode(rle)
    return int(np.logical_and(a, b).sum()), int(np.logical_or(a, b).sum())


def _iou(overlaps) -> float:
    """The IoU of all masks together: tiny masks, where one pixel is a large fraction, weigh little."""
    inter, union = np.sum(overlaps, axis=0)
    return inter / union


@pytest.mark.slow
def test_saved_model_in_a_fresh_process_detects_what_predict_detects(exported, images, tmp_path):
    predicted = run_python("-m", "training.predict", "--checkpoint", str(exported.run), "--images", str(images),
                           "--output", str(tmp_path / "predict.json"))
    assert predicted.returncode == 0, predicted.stderr[-3000:]
    reference = json.loads((tmp_path / "predict.json").read_text())
    loaded = run_python("-c", LOAD_AND_DETECT, str(exported.model), str(images), str(tmp_path / "saved.npz"),
                        cwd=tmp_path)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    saved = np.load(tmp_path / "saved.npz")
    categories = json.loads((exported.model / "classes.json").read_text())["categories"]
    names = {c["id"]: c["name"] for c in categories}
    assert sorted(names.values()) == ["circle", "square", "triangle"]   # training.data.synthetic's shapes

    for path in sorted(images.iterdir()):
        name = path.name
        ref = [r for r in reference if r["file_name"] == name]
        boxes, classes, scores, masks = (saved[f"{name}/{k}"] for k in ("boxes", "classes", "scores", "masks"))
        height, width = cv2.imread(str(path)).shape[:2]
        assert len(ref) > 0 and len(boxes) == len(ref), name
        assert masks.shape == (len(ref), height, width) and masks.dtype == np.uint8 and set(np.unique(masks)) <= {0, 1}
        assert saved[f"{name}/class_names"].tolist() == [names[c] for c in classes]
        ref_boxes = np.array([r["bbox"] for r in ref])
        ref_boxes[:, 2:] += ref_boxes[:, :2]      # COCO's x, y, w, h -> x1, y1, x2, y2
        ref_scores = np.array([r["score"] for r in ref])
        ref_classes = [r["category_id"] for r in ref]
        if (height, width) == (64, 64):
            # Nothing resized: the same pixels go in, so the same detections in the same order (up
            # to predict's rounding of boxes to 3 and scores to 5 decimals) and, pasted by the same
            # ops, the very same masks.
            assert classes.tolist() == ref_classes, name
            assert np.abs(boxes - ref_boxes).max() < 0.002, name
            assert np.abs(scores - ref_scores).max() < 1e-5, name
            for i, (mask, r) in enumerate(zip(masks, ref)):
                np.testing.assert_array_equal(mask, mask_utils.decode(r["segmentation"]), err_msg=f"{name} #{i}")
        else:
            # Resized: the graph's bilinear resize rounds to within one grey level of OpenCV's, which
            # reorders the untrained model's near-equal scores and flips a few near-tie NMS choices.
            # Each detection still has its counterpart: the same class, the box within 1 px, the score close.
            matched = []
            for box, cls, score, mask in zip(boxes, classes, scores, masks):
                hits = [j for j in range(len(ref)) if ref_classes[j] == cls and
                        np.abs(ref_boxes[j] - box).max() < 1.0 and abs(ref_scores[j] - score) < 2e-3]
                if hits:
                    matched.append(max((_overlap(mask, ref[j]["segmentation"]) for j in hits),
                                       key=lambda o: o[0] / max(o[1], 1)))
            assert len(matched) >= 0.9 * len(ref), (name, len(matched), len(ref))
            assert _iou(matched) > 0.9, (name, _iou(matched))


def test_graph_steps_match_the_opencv_steps_predict_runs(tf_session, tmp_path):
    """Decoding, the resized size and the resize itself, one at a time against training.predict's
    own functions (cv2.imread, resized_shape, cv2.resize). Both paste masks with the same ops
    (training.model.mask_head.paste_masks_graph, tested against tensorpack's definition in
    test_mask_targets.py)."""
    tf, sess = tf_session
    from training.data.augment import resized_shape
    from training.export import decode_bgr, resized_hw

    rng = np.random.default_rng(0)
    # Sizes: the synthetic tests' 64/64, COCO's 800/1344 and a case whose scaled side ends in
    # exactly .5 (rounded half up).
    for short, max_size in ((64, 64), (800, 1344), (5, 0)):
        sizes = [(h, w) for h in (1, 2, 3, 37, 64, 100, 427, 480, 640, 1333) for w in (1, 9, 64, 333, 640, 2000)]
        got = sess.run([resized_hw(tf, h, w, short, max_size) for h, w in sizes])
        assert [tuple(int(v) for v in g) for g in got] == [resized_shape(h, w, short, max_size) for h, w in sizes]
    assert resized_shape(2, 5, 5, 0) == (5, 13)   # 12.5 -> 13 (half up), which the graph gives too

    image = cv2.GaussianBlur(rng.integers(0, 256, (61, 83, 3), dtype=np.uint8), (7, 7), 3)
    files = {"img.jpg": [cv2.IMWRITE_JPEG_QUALITY, 85], "img.png": [], "grey.png": []}
    for name, params in files.items():
        assert cv2.imwrite(str(tmp_path / name), image[:, :, 0] if name == "grey.png" else image, params)
    data = tf.compat.v1.placeholder(tf.string, [])
    decoded = decode_bgr(tf, data)
    for name in files:
        got = sess.run(decoded, {data: (tmp_path / name).read_bytes()})
        np.testing.assert_array_equal(got, cv2.imread(str(tmp_path / name)), err_msg=name)

    for new_hw in ((40, 55), (128, 170)):
        resized = tf.image.resize(image[None], new_hw, method="bilinear", antialias=False)
        got = sess.run(tf.cast(tf.clip_by_value(tf.round(resized), 0, 255), tf.uint8))[0]
        diff = np.abs(got.astype(int) - cv2.resize(image, new_hw[::-1], interpolation=cv2.INTER_LINEAR))
        assert diff.max() <= 1, new_hw


def _with_orientation(stored_rgb: np.ndarray, value: int, fmt: str) -> bytes:
    """An image file (Pillow's writer) of the stored pixels with EXIF Orientation ``value`` in IFD0."""
    from PIL import Image
    exif = Image.Exif()
    exif[0x0112] = value          # Orientation
    exif[0x010F] = "a phone"      # Make: another entry before it in IFD0
    out = io.BytesIO()
    Image.fromarray(stored_rgb).save(out, fmt, exif=exif, **({"quality": 95} if fmt == "JPEG" else {}))
    return out.getvalue()


# How a camera stores an upright picture for each Orientation value (Exif 2.3, 4.6.4: where the
# stored row 0 and column 0 appear when viewed), as NumPy operations on the upright [H, W] pixels.
STORED_FOR_ORIENTATION = {
    1: lambda up: up,                         # row 0 at the top, column 0 on the left
    2: lambda up: up[:, ::-1],                # top, right: mirrored
    3: lambda up: up[::-1, ::-1],             # bottom, right: upside down
    4: lambda up: up[::-1, :],                # bottom, left: mirrored upside down
    5: lambda up: up.transpose(1, 0, 2),      # left, top: row 0 is the left column
    6: lambda up: np.rot90(up, 1),            # right, top: the phone held turned clockwise (portrait)
    7: lambda up: np.rot90(up, 2).transpose(1, 0, 2),   # right, bottom
    8: lambda up: np.rot90(up, -1),           # left, bottom
}


def test_exif_orientation_is_applied_as_opencv_applies_it(tf_session):
    """A phone photo's pixels are stored turned, with an EXIF Orientation: the SavedModel's decoder
    turns them upright as cv2.imread (training.predict) does, for JPEG and PNG (eXIf) alike."""
    tf, sess = tf_session
    from training.export import decode_bgr

    # upright: 32 x 48, four flat quadrants of distinct colours (RGB), so a turn or mirror shows
    upright = np.zeros((32, 48, 3), np.uint8)
    quadrants = {(0, 0): (220, 30, 30), (0, 1): (30, 200, 40), (1, 0): (40, 40, 220), (1, 1): (240, 240, 240)}
    for (row, col), rgb in quadrants.items():
        upright[row * 16:(row + 1) * 16, col * 24:(col + 1) * 24] = rgb
    data = tf.compat.v1.placeholder(tf.string, [])
    decoded = decode_bgr(tf, data)
    for value, store in STORED_FOR_ORIENTATION.items():
        stored = np.ascontiguousarray(store(upright))
        assert stored.shape[:2] == ((32, 48) if value <= 4 else (48, 32))
        for fmt in ("JPEG", "PNG"):
            file_bytes = _with_orientation(stored, value, fmt)
            got = sess.run(decoded, {data: file_bytes})
            np.testing.assert_array_equal(got, cv2.imdecode(np.frombuffer(file_bytes, np.uint8), cv2.IMREAD_COLOR),
                                          err_msg=f"{fmt} {value}")
            assert got.shape == (32, 48, 3), (fmt, value)
            if fmt == "PNG":   # lossless: exactly the upright pixels
                np.testing.assert_array_equal(got[:, :, ::-1], upright, err_msg=str(value))
            for (row, col), rgb in quadrants.items():   # JPEG: each quadrant's centre, within JPEG's loss
                centre = got[row * 16 + 8, col * 24 + 12, ::-1].astype(int)
                assert np.abs(centre - rgb).max() <= 12, (fmt, value, (row, col), centre)
    # Orientation values outside 1..8 and files without one are left as stored
    for file_bytes in (_with_orientation(upright, 9, "JPEG"), _with_orientation(upright, 0, "PNG")):
        assert sess.run(decoded, {data: file_bytes}).shape == (32, 48, 3)


def test_bad_arguments_are_refused_before_anything_is_written(tmp_path):
    from training import export
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "saved_model.pb").write_bytes(b"an earlier export")
    (tmp_path / "run").mkdir()
    with pytest.raises(SystemExit, match="taken exists and is not an empty directory: choose a new --output"):
        export.main(["--checkpoint", str(tmp_path / "run"), "--output", str(tmp_path / "taken")])
    with pytest.raises(SystemExit, match="no checkpoint in .*run"):
        export.main(["--checkpoint", str(tmp_path / "run"), "--output", str(tmp_path / "new")])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run", "taken"]
