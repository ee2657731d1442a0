"""SageMaker-style hyperparameter strings become config overrides, or clear errors."""
from __future__ import annotations

import json

import pytest

from training import hparams
from training.config import ConfigError, new_config

# The two hyperparameter tables of AWS's SageMaker example notebook "Distributed Training of Mask-RCNN in
# Amazon SageMaker using EFS", with their defaults, as SageMaker writes them (strings; eval_period as given).
TENSORPACK_TABLE = {
    "mode_fpn": "True", "mode_mask": "True", "eval_period": 1,
    "lr_schedule": "[240000, 320000, 360000]", "batch_norm": "FreezeBN", "images_per_epoch": "120000",
    "data_train": "coco_train2017", "data_val": "coco_val2017", "resnet_arch": "resnet50",
    "backbone_weights": "ImageNet-R50-AlignPadding.npz", "load_model": "",
}
AWS_SAMPLES_TABLE = {
    "mode_fpn": "True", "mode_mask": "True", "eval_period": "1",
    "lr_epoch_schedule": "[(16, 0.1), (20, 0.01), (24, None)]", "batch_size_per_gpu": "4",
    "batch_norm": "FreezeBN", "images_per_epoch": "120000", "data_train": "train2017",
    "backbone_weights": "ImageNet-R50-AlignPadding.npz", "load_model": "",
}


def _applied(hps):
    cfg = new_config()
    cfg.update_args(hparams.to_overrides(hps))
    return cfg


def test_every_hyperparameter_of_both_tables_is_known():
    assert set(TENSORPACK_TABLE) | set(AWS_SAMPLES_TABLE) == set(hparams.HYPERPARAMETERS)


def test_tensorpack_table():
    cfg = _applied(TENSORPACK_TABLE)
    assert cfg.MODE_FPN is True and cfg.MODE_MASK is True
    assert cfg.TRAIN.EVAL_PERIOD == 1
    assert cfg.TRAIN.LR_SCHEDULE == [240000, 320000, 360000]
    assert cfg.BACKBONE.NORM == "FreezeBN"
    assert cfg.TRAIN.IMAGES_PER_EPOCH == 120000
    assert cfg.DATA.TRAIN == ("coco_train2017",) and cfg.DATA.VAL == ("coco_val2017",)
    assert cfg.BACKBONE.RESNET_NUM_BLOCKS == [3, 4, 6, 3]
    assert cfg.BACKBONE.WEIGHTS == "ImageNet-R50-AlignPadding.npz"
    assert cfg.TRAIN.LOAD_MODEL == ""


def test_aws_samples_table():
    cfg = _applied(AWS_SAMPLES_TABLE)
    assert cfg.TRAIN.LR_EPOCH_SCHEDULE == [(16, 0.1), (20, 0.01), (24, None)]
    assert cfg.TRAIN.BATCH_SIZE_PER_GPU == 4
    assert cfg.DATA.TRAIN == ("train2017",)


@pytest.mark.parametrize("raw, expected", [("True", True), ("False", False), ("true", True),
                                           ("false", False), (True, True), (" FALSE ", False)])
def test_booleans(raw, expected):
    assert _applied({"mode_mask": raw}).MODE_MASK is expected


@pytest.mark.parametrize("raw", ["1x", "'1x'", '"1x"'])
def test_lr_schedule_takes_a_schedule_name(raw):
    cfg = _applied({"lr_schedule": raw})
    assert cfg.TRAIN.LR_SCHEDULE == "1x"   # expanded by finalize (tests/training/test_config_finalize.py)


def test_resnet101_norms_and_lists():
    cfg = _applied({"resnet_arch": "resnet101", "batch_norm": "None", "data_train": "['a', 'b']"})
    assert cfg.BACKBONE.RESNET_NUM_BLOCKS == [3, 4, 23, 3]
    assert cfg.BACKBONE.NORM == "None"   # the string choice, not Python's None
    assert cfg.DATA.TRAIN == ("a", "b")
    assert _applied({"data_val": "[]"}).DATA.VAL == ()   # train without evaluating
    for norm in ("FreezeBN", "SyncBN", "GN", "'GN'", '"SyncBN"'):
        assert _applied({"batch_norm": norm}).BACKBONE.NORM == norm.strip("'\"")


def test_config_prefix_sets_any_key():
    cfg = _applied({"config:TRAIN.GRADIENT_CLIP": "1.5", "config:BACKBONE.RESNET_NUM_BLOCKS": "[1, 1, 1, 1]",
                    "config:PREPROC.TRAIN_SHORT_EDGE_SIZE": "[96, 128]", "config:DATA.BASEDIR": "/data/coco",
                    "config:TRAIN.XLA": "true", "config:RPN.ANCHOR_SIZES": "(16, 32, 64, 128, 256)"})
    assert cfg.TRAIN.GRADIENT_CLIP == 1.5 and cfg.BACKBONE.RESNET_NUM_BLOCKS == [1, 1, 1, 1]
    assert cfg.PREPROC.TRAIN_SHORT_EDGE_SIZE == [96, 128] and cfg.DATA.BASEDIR == "/data/coco"
    assert cfg.TRAIN.XLA is True and cfg.RPN.ANCHOR_SIZES == (16, 32, 64, 128, 256)


def test_overrides_are_key_value_strings():
    assert hparams.to_overrides({"batch_norm": "GN", "eval_period": "2"}) == [
        "BACKBONE.NORM='GN'", "TRAIN.EVAL_PERIOD=2"]


def test_sagemaker_toolkit_hyperparameters_are_skipped():
    assert hparams.to_overrides({"sagemaker_program": "train.py", "sagemaker_mpi_enabled": "true"}) == []


@pytest.mark.parametrize("hps, message", [
    ({"mode_fpm": "True"}, r"unknown hyperparameter 'mode_fpm'; known: mode_fpn"),
    ({"config:TRAIN.NO_SUCH_KEY": "1"}, r"config:TRAIN.NO_SUCH_KEY.*unknown config key 'TRAIN.NO_SUCH_KEY'"),
    ({"config:": "1"}, r"give a config key"),
    ({"batch_norm": "BatchNorm"}, r"batch_norm='BatchNorm'.*one of FreezeBN, SyncBN, GN, None"),
    ({"config:BACKBONE.NORM": "BN"}, r"one of FreezeBN, SyncBN, GN, None"),
    ({"resnet_arch": "resnet18"}, r"resnet_arch='resnet18'.*one of resnet50, resnet101"),
    ({"batch_size_per_gpu": "0"}, r"batch_size_per_gpu='0'.*integer >= 1"),
    ({"batch_size_per_gpu": "-2"}, r"integer >= 1"),
    ({"batch_size_per_gpu": "two"}, r"integer >= 1"),
    ({"config:TRAIN.BATCH_SIZE_PER_GPU": "0"}, r"integer >= 1"),
    ({"images_per_epoch": "1.5"}, r"integer >= 1"),
    ({"eval_period": "True"}, r"integer >= 0"),
    ({"mode_mask": "yes"}, r"mode_mask='yes'.*True or False"),
    ({"lr_schedule": "[240000, 320000"}, r"lr_schedule=.*increasing step counts"),
    ({"lr_schedule": "[320000, 240000]"}, r"increasing step counts"),
    ({"lr_schedule": "0x"}, r"increasing step counts .* or a name such as '1x'"),
    ({"lr_epoch_schedule": "[(16, 0.1), (20, 0.01), (24, 0.001)]"}, r"last pair must be \(final_epoch, None\)"),
    ({"lr_epoch_schedule": "[(16, 0.1), (12, None)]"}, r"epochs are not increasing"),
    ({"lr_epoch_schedule": "[16, 20]"}, r"not an \(epoch, multiplier\) pair"),
    ({"config:TRAIN.BASE_LR": "fast"}, r"config:TRAIN.BASE_LR='fast'.*must be a number like 0.01"),
    ({"config:MODE_MASK": "maybe"}, r"config:MODE_MASK='maybe'.*True or False"),
    ({"data_train": "[]"}, r"split name"),
    ({"data_val": "[1]"}, r"data_val='\[1\]'.*split name.*\(\[\] for none\)"),
    ({"lr_schedule": "[1]", "config:TRAIN.LR_SCHEDULE": "[2]"}, r"both set TRAIN.LR_SCHEDULE"),
    ({"load_model": "[1, 2]"}, r"file name or path"),
])
def test_bad_values_name_the_hyperparameter(hps, message):
    with pytest.raises(ConfigError, match=message):
        hparams.to_overrides(hps)


def test_never_evaluates_code(tmp_path):
    marker = tmp_path / "pwned"
    payload = f"__import__('pathlib').Path({str(marker)!r}).write_text('x')"
    with pytest.raises(ConfigError):
        hparams.to_overrides({"config:TRAIN.BASE_LR": payload})
    # A string-valued key takes the text as text; nothing runs.
    assert _applied({"config:DATA.BASEDIR": payload}).DATA.BASEDIR == payload
    assert not marker.exists()


def test_load_hyperparameters_json(tmp_path):
    path = tmp_path / "hyperparameters.json"
    path.write_text(json.dumps(AWS_SAMPLES_TABLE))
    assert hparams.load_hyperparameters_json(path) == AWS_SAMPLES_TABLE
    path.write_text("[1]")
    with pytest.raises(ConfigError, match="JSON object"):
        hparams.load_hyperparameters_json(path)
    path.write_text("{")
    with pytest.raises(ConfigError, match="not JSON"):
        hparams.load_hyperparameters_json(path)
    with pytest.raises(ConfigError, match="does not exist"):
        hparams.load_hyperparameters_json(tmp_path / "none.json")


def test_resolve_data_file(tmp_path):
    assert hparams.resolve_data_file("ImageNet-R50-AlignPadding.npz", "/opt/ml/input/data/train") == \
        "/opt/ml/input/data/train/ImageNet-R50-AlignPadding.npz"
    assert hparams.resolve_data_file("weights/r50.npz", tmp_path) == str(tmp_path / "weights/r50.npz")
    assert hparams.resolve_data_file("/abs/model.npz", "/data") == "/abs/model.npz"
    assert hparams.resolve_data_file("", "/data") == ""


def test_docs_table_lists_every_hyperparameter():
    from pathlib import Path
    doc = (Path(__file__).resolve().parents[2] / "docs" / "data.md").read_text()
    for spec in hparams.HYPERPARAMETERS.values():
        assert f"| `{spec.name}` | `{spec.key}` |" in doc, spec.name


def test_json_encoded_values_are_unwrapped():
    import json as _json
    encoded = {k: _json.dumps(v) for k, v in AWS_SAMPLES_TABLE.items()}   # '"True"', '"4"', ...
    assert _applied(encoded).to_dict() == _applied(AWS_SAMPLES_TABLE).to_dict()
    assert _applied({"mode_mask": _json.dumps(False), "eval_period": _json.dumps(2)}).TRAIN.EVAL_PERIOD == 2


def test_data_hyperparameters_take_an_annotation_file_and_image_folder():
    """Relative to the train channel (DATA.BASEDIR there): data_train / data_val or config:DATA.*."""
    cfg = _applied({"data_train": "labels/train.json:photos/train", "data_val": "['labels/val.json:photos/val']"})
    assert cfg.DATA.TRAIN == ("labels/train.json:photos/train",)
    assert cfg.DATA.VAL == ("labels/val.json:photos/val",)
    cfg = _applied({"config:DATA.TRAIN": "['a/one.json:img/one', 'coco_train2017']"})
    assert cfg.DATA.TRAIN == ("a/one.json:img/one", "coco_train2017")


@pytest.mark.parametrize("hps, message", [
    ({"data_train": "labels/train.json"}, r"^hyperparameter data_train='labels/train\.json': split entry "
                                          r"'labels/train\.json' names an annotation file without its image folder"),
    ({"data_val": "labels/val.csv:photos"}, r"^hyperparameter data_val='labels/val\.csv:photos': .* is not a \.json file"),
    ({"config:DATA.TRAIN": "[':photos']"}, r"^hyperparameter config:DATA\.TRAIN=.*needs both parts"),
])
def test_malformed_data_entries_name_the_hyperparameter(hps, message):
    with pytest.raises(ConfigError, match=message):
        hparams.to_overrides(hps)
