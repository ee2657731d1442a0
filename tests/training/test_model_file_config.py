"""Which model and classes a published model file (.npz) stands for, decided from its entries'
shapes before any graph is built (training.predict.model_file_config)."""
import numpy as np
import pytest

from training.config import finalize, new_config
from training.configs.cpu_synthetic import OVERRIDES
from training.data.coco_categories import COCO_CATEGORIES
from training.model.weights import model_variable_shapes
from training.predict import model_file_config

SMALL = [*OVERRIDES, "PREPROC.TRAIN_SHORT_EDGE_SIZE=[64, 64]", "PREPROC.TEST_SHORT_EDGE_SIZE=64",
         "PREPROC.MAX_SIZE=64"]


def _write(path, categories, *, drop=()):
    cfg = new_config()
    cfg.update_args(SMALL)
    finalize(cfg, num_ranks=1, class_names=["BG"] + [f"c{i}" for i in range(categories)], has_gpu=False)
    np.savez(path, **{f"{name}:0": np.zeros(shape, np.float32)
                      for name, shape in model_variable_shapes(cfg).items() if name not in drop})
    return str(path)


def test_81_class_outputs_are_cocos_80_categories(tmp_path):
    cfg, category_ids = model_file_config(_write(tmp_path / "coco.npz", 80), SMALL)
    assert cfg.DATA.NUM_CATEGORY == 80
    assert cfg.DATA.CLASS_NAMES[:3] == ["BG", "person", "bicycle"] and cfg.DATA.CLASS_NAMES[-1] == "toothbrush"
    # class 12 is the 12th category, stop sign, whose COCO id is 13 (id 12 is unused)
    assert cfg.DATA.CLASS_NAMES[12] == "stop sign" and category_ids[12] == 13 and category_ids[80] == 90
    assert sorted(category_ids.values()) == [i for i, _ in COCO_CATEGORIES]


def test_another_class_count_needs_its_dataset(tmp_path):
    path = _write(tmp_path / "mine.npz", 3)
    with pytest.raises(SystemExit, match=r"mine.npz classifies 3 categories, not COCO's 80: name the dataset it was "
                                         r"trained on with --split NAME"):
        model_file_config(path, SMALL)


def test_a_file_that_does_not_fit_the_model_is_refused_before_building(tmp_path):
    path = _write(tmp_path / "part.npz", 80, drop=("rpn/conv0/b",))
    with pytest.raises(SystemExit, match=r"--checkpoint .*part.npz has no 'rpn/conv0/b'"):
        model_file_config(path, SMALL)
    backbone = _write(tmp_path / "backbone.npz", 80, drop=("fastrcnn/outputs/class/b",))
    with pytest.raises(SystemExit, match="has no class logits"):
        model_file_config(backbone, SMALL)
    with pytest.raises(SystemExit, match="model file .*absent.npz not found"):
        model_file_config(str(tmp_path / "absent.npz"), SMALL)
