"""Seeing what the model does: ``training.draw`` paints instances exactly as documented, and
``training.predict --draw`` writes every image with its detections; batched prediction gives each
image the detections it gets alone."""
import json
import shutil

import cv2
import numpy as np
import pytest

from training.draw import draw_instances

GREY = (100, 100, 100)
COLOUR = (200, 0, 50)   # BGR; blended with GREY at alpha 0.5: (150, 50, 75), no rounding involved


def _grey(height=40, width=60):
    return np.full((height, width, 3), GREY, np.uint8)


def test_mask_fill_and_outline_pixels():
    image = _grey()
    mask = np.zeros((1, 40, 60), np.uint8)
    mask[0, 12:18, 22:28] = 1
    drawn = draw_instances(image, [[20.0, 10.0, 30.0, 20.0]], mask, colors=[COLOUR], thickness=1)
    assert drawn.shape == image.shape and drawn is not image
    np.testing.assert_array_equal(image, _grey())  # the source is left alone
    # the box [20, 30) x [10, 20): outline on columns 20 and 29, rows 10 and 19
    outline = np.zeros((40, 60), bool)
    outline[10, 20:30] = outline[19, 20:30] = outline[10:20, 20] = outline[10:20, 29] = True
    assert (drawn[outline] == COLOUR).all()
    assert (drawn[12:18, 22:28] == (150, 50, 75)).all()          # mask: half grey, half colour
    inside_not_drawn = np.zeros((40, 60), bool)
    inside_not_drawn[11:19, 21:29] = True
    inside_not_drawn[12:18, 22:28] = False
    assert (drawn[inside_not_drawn] == GREY).all()               # neither mask nor outline
    untouched = np.ones((40, 60), bool)
    untouched[10:20, 20:30] = False
    assert (drawn[untouched] == GREY).all()


def test_thicker_outline_grows_inwards_and_sub_pixel_boxes_round():
    drawn = draw_instances(_grey(), [[19.6, 10.4, 30.4, 19.6]], colors=[COLOUR], thickness=2)
    # rounds to [20, 30) x [10, 20); 2 px: columns 20, 21, 28, 29 and rows 10, 11, 18, 19
    for column in (20, 21, 28, 29):
        assert (drawn[10:20, column] == COLOUR).all(), column
    for row in (10, 11, 18, 19):
        assert (drawn[row, 20:30] == COLOUR).all(), row
    assert (drawn[12:18, 22:28] == GREY).all()
    assert (drawn[:, :20] == GREY).all() and (drawn[:, 30:] == GREY).all() and (drawn[20:] == GREY).all()


def test_label_above_the_box_and_inside_it_at_the_top_edge():
    drawn = draw_instances(_grey(60, 80), [[30, 30, 50, 50]], names=["cat"], scores=[0.9], colors=[COLOUR])
    assert (drawn[20:30, 30:40] != GREY).any(axis=-1).sum() > 20   # the label's filled box above the box
    assert (drawn[51:] == GREY).all() and (drawn[:, :30] == GREY).all()
    at_top = draw_instances(_grey(60, 80), [[30, 0, 50, 40]], names=["cat"], scores=[0.9], colors=[COLOUR])
    assert (at_top[1:8, 31:40] != GREY).any(axis=-1).all()         # no room above: inside the box's top


def test_colours_by_class_name_and_bad_shapes():
    a = draw_instances(_grey(), [[0, 0, 10, 10], [20, 20, 30, 30]], names=["cat", "cat"], thickness=1)
    assert (a[0, 0] == a[20, 20]).all() and (a[0, 0] != GREY).any()  # one class, one colour
    with pytest.raises(ValueError, match=r"masks must be \[N, 40, 60\]"):
        draw_instances(_grey(), [[0, 0, 10, 10]], np.zeros((1, 20, 20), np.uint8))
    with pytest.raises(ValueError, match="names has 2 entries for 1 boxes"):
        draw_instances(_grey(), [[0, 0, 10, 10]], names=["a", "b"])
    assert (draw_instances(_grey(), np.zeros((0, 4)), np.zeros((0, 40, 60))) == GREY).all()


# ------------------------------------------------------------------------------- the predict command
@pytest.mark.parametrize("args, message", [
    ([], "nothing to do: give --output FILE (results JSON), --draw DIR (pictures) and/or --evaluate"),
    (["--draw", "d", "--score-threshold", "1.5"], "--score-threshold must be between 0 and 1, got 1.5"),
    (["--output", "r.json", "--batch-size", "0"], "--batch-size must be at least 1, got 0"),
    (["--output", "r.json", "--max-images", "-1"], "--max-images must be 0 (all) or more, got -1"),
    (["--draw", "a_file"], "--draw a_file is a file: give a folder (it is created if missing)"),
])
def test_bad_arguments_are_one_clear_line_before_anything_loads(tmp_path, monkeypatch, capsys, args, message):
    from training.predict import main
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a_file").write_text("")
    assert main(["--checkpoint", "no_such_run", "--images", "photos", *args]) == 2
    assert capsys.readouterr().err == f"error: {message}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


# Sources 4x the synthetic crops: the network sees them at 64x64, 64x48, 51x64 (all padded to 64x64)
# and 20x64 (padded to 32x64). The detections come back in these 4x larger pixels.
CROPS = {"a.png": (0, 64, 0, 64), "b.png": (0, 64, 0, 48), "c.png": (0, 48, 0, 60), "d.png": (0, 20, 0, 64)}


@pytest.fixture(scope="module")
def run_and_images(untrained_model, tmp_path_factory):
    """A folder with the untrained run (tests/saved_models.py) in runs/r1, as a user's, and the crops in images/."""
    root = tmp_path_factory.mktemp("predict_draw")
    shutil.copytree(untrained_model.run, root / "runs" / "r1")
    (root / "images").mkdir()
    for n, (name, (y0, y1, x0, x1)) in enumerate(CROPS.items(), start=1):
        source = cv2.imread(str(untrained_model.data / "val2017" / f"{n:012d}.png"))
        crop = source[y0:y1, x0:x1]
        cv2.imwrite(str(root / "images" / name), cv2.resize(crop, None, fx=4, fy=4, interpolation=cv2.INTER_NEAREST))
    return root


def test_predict_draws_each_image_with_its_detections(run_and_images):
    from untrained_run import run_mains
    root = run_and_images
    # an untrained model scores everything alike (about 1 / 4 over background and 3 classes): a
    # threshold at the best score draws exactly one detection, so the other images stay as they were
    (probe,) = run_mains("training.predict", [["--checkpoint", "runs/r1", "--images", "images",
                                               "--output", "all.json", "--batch-size", "3"]], cwd=root)
    assert probe["code"] == 0, probe["stderr"][-3000:]
    results = json.loads((root / "all.json").read_text())
    best = max(results, key=lambda r: r["score"])
    # the drawing runs, in one interpreter
    proc, first = run_mains("training.predict", [
        ["--checkpoint", "runs/r1", "--images", "images", "--draw", "drawn",
         "--score-threshold", str(best["score"] - 1e-6), "--batch-size", "3"],
        ["--checkpoint", "runs/r1", "--images", "images", "--draw", "first", "--max-images", "2"]], cwd=root)
    assert first["code"] == 0, first["stderr"][-3000:]
    assert sorted(p.name for p in (root / "first").iterdir()) == ["a.png", "b.png"]    # file-name order
    assert proc["code"] == 0, proc["stderr"][-3000:]
    assert "on 4 images in drawn" in proc["stdout"]
    assert sorted(p.name for p in (root / "drawn").iterdir()) == sorted(CROPS)
    for name in CROPS:
        source = cv2.imread(str(root / "images" / name))
        drawn = cv2.imread(str(root / "drawn" / name))
        assert drawn.shape == source.shape, name
        if name != best["file_name"]:
            np.testing.assert_array_equal(drawn, source, err_msg=name)
            continue
        x, y, w, h = best["bbox"]
        left, top, right, bottom = round(x), round(y), round(x + w) - 1, round(y + h) - 1
        changed = (drawn != source).any(axis=-1)
        assert changed[bottom, left:right + 1].mean() > 0.9          # its outline
        assert changed[top:bottom + 1, left:right + 1].any()
        far = max(bottom, top + 30) + 2                               # below the box and its label
        np.testing.assert_array_equal(drawn[far:], source[far:])
        np.testing.assert_array_equal(drawn[:max(top - 30, 0)], source[:max(top - 30, 0)])


BATCHES = """
import json, sys
import numpy as np
from training.data.pipeline import iterate_test_images
from training.inference import detect_all
from training.predict import build_predictor, load_run_config, resolve_checkpoint
checkpoint, logdir = resolve_checkpoint("runs/r1")
cfg, _ = load_run_config(logdir, [])
predict = build_predictor(cfg, checkpoint)
paths = sys.argv[1:]
runs = {}
for batch_size in (1, 3):
    def predict_fn(images, image_hw):
        runs.setdefault(batch_size, []).append([list(images.shape), image_hw.tolist()])
        return predict(images, image_hw)
    dets = {i: d for i, _, d in detect_all(predict_fn, iterate_test_images(paths), cfg, batch_size=batch_size)}
    np.savez(f"batch{batch_size}.npz", **{f"{i}_{k}": v for i, d in dets.items() for k, v in d.items()})
print("RUNS " + json.dumps(runs))
"""


def test_batched_prediction_gives_each_image_its_own_detections(run_and_images):
    """A batch holds the images of one padded size: a, b and c run together, d alone; every image
    gets the detections it gets alone (the untrained model keeps all 50 per image)."""
    from untrained_run import run_python
    root = run_and_images
    proc = run_python("-c", BATCHES, *[f"images/{name}" for name in CROPS], cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = json.loads(proc.stdout.split("RUNS ", 1)[1])
    assert runs["1"] == [[[1, 64, 64, 3], [[64, 64]]], [[1, 64, 64, 3], [[64, 48]]],
                         [[1, 64, 64, 3], [[51, 64]]], [[1, 32, 64, 3], [[20, 64]]]]
    assert runs["3"] == [[[3, 64, 64, 3], [[64, 64], [64, 48], [51, 64]]], [[1, 32, 64, 3], [[20, 64]]]]
    alone, batched = np.load(root / "batch1.npz"), np.load(root / "batch3.npz")
    for i, name in enumerate(CROPS):
        assert len(alone[f"{i}_boxes"]) == len(batched[f"{i}_boxes"]) == 50, name
        # The untrained model scores many detections within 1e-6 of each other, so two runs whose
        # sums round differently may list such a pair in the other order: pair them up by box.
        pair = _partners(alone[f"{i}_boxes"], alone[f"{i}_labels"], batched[f"{i}_boxes"], batched[f"{i}_labels"])
        np.testing.assert_array_equal(batched[f"{i}_labels"][pair], alone[f"{i}_labels"], err_msg=name)
        np.testing.assert_allclose(batched[f"{i}_scores"][pair], alone[f"{i}_scores"], atol=1e-5, err_msg=name)
        np.testing.assert_allclose(batched[f"{i}_boxes"][pair], alone[f"{i}_boxes"], atol=1e-2, err_msg=name)
        assert alone[f"{i}_masks"].shape == (50,) + cv2.imread(str(root / "images" / name)).shape[:2]
        differing = np.mean(batched[f"{i}_masks"][pair] != alone[f"{i}_masks"])
        assert differing < 1e-3, (name, differing)
        assert np.mean(pair != np.arange(50)) <= 0.1, (name, pair)     # a few near-ties, not a shuffle


def _partners(boxes, labels, other_boxes, other_labels) -> np.ndarray:
    """For each detection, the index of the nearest one of the same label among the others (each
    used once)."""
    distance = np.abs(boxes[:, None, :] - other_boxes[None, :, :]).max(axis=2)
    distance += 1e6 * (labels[:, None] != other_labels[None, :])
    pair, used = [], set()
    for row in distance:
        j = next(j for j in np.argsort(row, kind="stable") if j not in used)
        used.add(j)
        pair.append(j)
    return np.array(pair)
