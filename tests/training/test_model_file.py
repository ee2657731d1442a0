"""A published model file (tensorpack's .npz, ``name:0`` keys) is a model for ``maskrcnn predict``
and ``maskrcnn export``, as tensorpack's predict.py --load takes it: here a small one, written as
tensorpack's dump-model-params.py writes one, from the variables of an untrained run at test shapes.
Predicting with the file gives what predicting with the run's checkpoint gives; the export of the
file answers what predict answers, masks included, pixel for pixel."""
import json

import numpy as np
import pytest
from pycocotools import mask as mask_utils

from saved_models import run_python
from untrained_run import run_mains
from test_export import LOAD_AND_DETECT

# The untrained run's model (tests/untrained_run.py): the cpu_synthetic config at 64 px.
SIZES = ["PREPROC.TRAIN_SHORT_EDGE_SIZE=[64, 64]", "PREPROC.TEST_SHORT_EDGE_SIZE=64", "PREPROC.MAX_SIZE=64",
         "TEST.RESULT_SCORE_THRESH=0.0"]


def _overrides(data):
    from training.configs.cpu_synthetic import OVERRIDES
    return [*OVERRIDES, *SIZES, f"DATA.BASEDIR={str(data)!r}"]


def write_tensorpack_npz(checkpoint: str, path, cfg) -> dict:
    """The model variables of ``checkpoint`` under tensor names (``conv0/W:0``), compressed, as
    dump-model-params.py --meta writes them: no global step, no optimizer state."""
    from training.compat import tf
    from training.model.weights import model_variable_shapes
    reader = tf.train.load_checkpoint(checkpoint)
    values = {f"{name}:0": reader.get_tensor(name) for name in model_variable_shapes(cfg)}
    np.savez_compressed(path, **values)
    return values


@pytest.fixture(scope="module")
def model_file(untrained_model, tmp_path_factory):
    from training.config import finalize, new_config
    from training.data.coco import load_split
    exported = untrained_model
    cfg = new_config()
    cfg.update_args(_overrides(exported.data))
    finalize(cfg, num_ranks=1, class_names=load_split(exported.data, "train2017").class_names, has_gpu=False)
    path = tmp_path_factory.mktemp("model_file") / "model.npz"
    values = write_tensorpack_npz(str(exported.run / "model-1"), path, cfg)
    assert "fastrcnn/outputs/class/b:0" in values and values["fastrcnn/outputs/class/b:0"].shape == (4,)
    return exported, path


@pytest.mark.slow
def test_predict_and_export_take_a_model_file(model_file, tmp_path):
    exported, npz = model_file
    config = ["--config", *_overrides(exported.data)]
    images = exported.data / "val2017"

    # The three predictions in one interpreter (each builds its own graph and session).
    refused, from_run, from_file = run_mains("training.predict", [
        ["--checkpoint", npz, "--images", images, "--output", tmp_path / "none.json", *config],
        ["--checkpoint", exported.run, "--split", "val2017", "--output", tmp_path / "run.json",
         "--config", f"DATA.BASEDIR={str(exported.data)!r}"],
        ["--checkpoint", npz, "--split", "val2017", "--output", tmp_path / "file.json", *config]])
    # Its classes: the file has 4 class outputs, not COCO's 81, so the dataset must say which.
    assert refused["code"] != 0
    assert f"{npz} classifies 3 categories, not COCO's 80: name the dataset it was trained on with --split NAME" \
        in refused["stderr"], refused["stderr"][-2000:]
    assert not (tmp_path / "none.json").exists()

    assert from_run["code"] == 0, from_run["stderr"][-3000:]
    assert from_file["code"] == 0, from_file["stderr"][-3000:]
    run_results = json.loads((tmp_path / "run.json").read_text())
    file_results = json.loads((tmp_path / "file.json").read_text())
    assert len(run_results) > 0 and file_results == run_results

    export = run_python("-m", "training.export", "--checkpoint", npz, "--split", "val2017",
                        "--output", tmp_path / "saved", *config)
    assert export.returncode == 0, export.stderr[-3000:]
    categories = json.loads((tmp_path / "saved" / "classes.json").read_text())["categories"]
    assert sorted(c["name"] for c in categories) == ["circle", "square", "triangle"]
    loaded = run_python("-c", LOAD_AND_DETECT, tmp_path / "saved", images, tmp_path / "saved.npz", cwd=tmp_path)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    saved = np.load(tmp_path / "saved.npz")
    records = {r["id"]: r["file_name"] for r in json.loads(
        (exported.data / "annotations" / "instances_val2017.json").read_text())["images"]}
    for image_id, file_name in records.items():
        name = file_name.split("/")[-1]
        ref = [r for r in file_results if r["image_id"] == image_id]
        boxes, classes, scores, masks = (saved[f"{name}/{k}"] for k in ("boxes", "classes", "scores", "masks"))
        assert classes.tolist() == [r["category_id"] for r in ref], name
        ref_boxes = np.array([r["bbox"] for r in ref])
        ref_boxes[:, 2:] += ref_boxes[:, :2]
        assert np.abs(boxes - ref_boxes).max() < 0.002, name
        assert np.abs(scores - [r["score"] for r in ref]).max() < 1e-5, name
        for i, (mask, r) in enumerate(zip(masks, ref)):
            np.testing.assert_array_equal(mask, mask_utils.decode(r["segmentation"]), err_msg=f"{name} #{i}")
