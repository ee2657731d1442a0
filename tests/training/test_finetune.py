"""Fine-tuning from tensorpack's COCO-trained COCO-R50FPN-MaskRCNN-Standard.npz (TRAIN.LOAD_MODEL).

The file's variables are recorded in tests/training/data/COCO-R50FPN-MaskRCNN-Standard.txt, read
from tensorpack's examples/FasterRCNN source (its header cites the files and functions), not from
this project's model. The expected counts below come from that list, by hand:

* 307 entries: backbone 265 (53 convs x W + 4 BatchNorm parameters), fpn 16 (8 convs x W, b),
  rpn 6 (3 convs x W, b), fastrcnn 8 (fc6, fc7, outputs/class, outputs/box x W, b), maskrcnn 12
  (fcn0-3, deconv, conv x W, b);
* 6 of them follow the class count (CLASS_LAYERS): at another class count, 301 are restored and 6
  re-initialised.

Fake files hold random values under the recorded keys (tensor names, ``:0``), as tensorpack writes
them, written uncompressed to save time (np.load reads both; the real file is savez_compressed).
"""
from pathlib import Path

import numpy as np
import pytest

from tensorpack_weights import R50, imagenet_resnet_entries, random_values

RECORDED = Path(__file__).parent / "data" / "COCO-R50FPN-MaskRCNN-Standard.txt"
CLASS_LAYERS = ("fastrcnn/outputs/class/W", "fastrcnn/outputs/class/b", "fastrcnn/outputs/box/W",
                "fastrcnn/outputs/box/b", "maskrcnn/conv/W", "maskrcnn/conv/b")
COCO_CLASSES = ["BG"] + [f"category{i}" for i in range(1, 81)]   # COCO's 80 categories and the background
FROZEN = ("conv0/", "group0/")   # BACKBONE.FREEZE_AT=2: the stem and the first stage


def recorded_entries() -> dict[str, tuple]:
    entries = {}
    for line in RECORDED.read_text().splitlines():
        if line and not line.startswith("#"):
            key, shape = line.split()
            entries[key] = tuple(int(n) for n in shape.split(","))
    return entries


@pytest.fixture(scope="module")
def coco_file(tmp_path_factory):
    """A random COCO-R50FPN-MaskRCNN-Standard.npz: path, values by tensor name."""
    values = random_values(recorded_entries(), seed=7)
    path = tmp_path_factory.mktemp("coco") / "COCO-R50FPN-MaskRCNN-Standard.npz"
    np.savez(path, **values)
    return str(path), values


def _config(class_names, *extra):
    """The defaults (R50-FPN, FreezeBN, FREEZE_AT=2, mask head) fine-tuned from a model file."""
    from training.config import finalize, new_config
    cfg = new_config()
    cfg.update_args(["DATA.VAL=()", "TRAIN.LOAD_MODEL='COCO-R50FPN-MaskRCNN-Standard.npz'", *extra])
    return finalize(cfg, num_ranks=1, class_names=class_names, has_gpu=False)


def _model_variables(tf):
    from training.model.weights import is_model_variable
    trainable = {v.op.name for v in tf.compat.v1.trainable_variables()}
    return {v.op.name: v for v in tf.compat.v1.global_variables() if is_model_variable(v.op.name, v.op.name in trainable)}


def _restore(tf, sess, path):
    """strict_finetune_init as the trainer runs it: planned on the built graph, run after the initializer."""
    from training.model.weights import strict_finetune_init
    init = strict_finetune_init(path)
    init._setup_graph()
    sess.run(tf.compat.v1.global_variables_initializer())
    init._run_init(sess)
    return init


# ------------------------------------------------------------------ the recorded list
def test_the_recorded_list_is_tensorpacks_file():
    entries = recorded_entries()
    assert len(entries) == 307 and all(key.endswith(":0") for key in entries)
    scopes = [key.split("/")[0] for key in entries]
    assert {s: scopes.count(s) for s in ("fpn", "rpn", "fastrcnn", "maskrcnn")} == \
        {"fpn": 16, "rpn": 6, "fastrcnn": 8, "maskrcnn": 12}
    backbone = {k: s for k, s in entries.items() if k.split("/")[0] not in ("fpn", "rpn", "fastrcnn", "maskrcnn")}
    imagenet = {k: s for k, s in imagenet_resnet_entries(R50).items() if not k.startswith("linear/")}
    assert backbone == imagenet   # ImageNet-R50-AlignPadding.npz without its classifier
    # 256 channels x 7 x 7 ROI features; 81 classes (80 + background); 4 deltas for each of the 81
    assert entries["fastrcnn/fc6/W:0"] == (12544, 1024) and entries["fastrcnn/fc7/W:0"] == (1024, 1024)
    assert entries["fastrcnn/outputs/class/W:0"] == (1024, 81) and entries["fastrcnn/outputs/box/W:0"] == (1024, 324)
    assert entries["maskrcnn/conv/W:0"] == (1, 1, 256, 80) and entries["maskrcnn/deconv/W:0"] == (2, 2, 256, 256)
    assert entries["rpn/class/W:0"] == (1, 1, 256, 3) and entries["rpn/box/W:0"] == (1, 1, 256, 12)
    assert entries["fpn/lateral_1x1_c5/W:0"] == (1, 1, 2048, 256)
    assert all(f"{name}:0" in entries for name in CLASS_LAYERS)


# ------------------------------------------------------------------ the model's variables are the file's
def test_every_variable_of_the_file_maps_onto_the_default_model_at_coco_classes(tf_session, coco_file, capsys):
    """The default R50-FPN mask model at 81 classes has exactly the file's variables, shape for
    shape, and all 307 are restored (the class layers too: the class count is the file's)."""
    tf, sess = tf_session
    from training.model.tower import build_towers
    from training.model.weights import model_variable_shapes
    path, values = coco_file
    cfg = _config(COCO_CLASSES)
    build_towers(cfg)
    variables = _model_variables(tf)
    model_shapes = {name: tuple(v.shape) for name, v in variables.items()}
    assert model_shapes == {key.removesuffix(":0"): shape for key, shape in recorded_entries().items()}
    assert model_variable_shapes(cfg) == model_shapes   # what the check before training compares with

    init = _restore(tf, sess, path)
    assert capsys.readouterr().out.splitlines()[-1] == "restored 307 of 307 variables; re-initialised 0 class-specific ones"
    for name in ("fastrcnn/fc6/W", "fastrcnn/outputs/box/W", "maskrcnn/conv/W", "group3/block2/conv3/bn/variance/EMA"):
        np.testing.assert_array_equal(sess.run(variables[name]), values[f"{name}:0"], err_msg=name)
    assert len(init.plan.restore) == 307


@pytest.mark.parametrize("overrides", [
    ["MODE_FPN=False"],
    ["MODE_FPN=False", "MODE_MASK=False"],
    ["FPN.NORM='GN'", "BACKBONE.NORM='GN'", "FPN.FRCNN_HEAD_FUNC='fastrcnn_4conv1fc_gn_head'",
     "FPN.MRCNN_HEAD_FUNC='maskrcnn_up4conv_gn_head'"],
    ["FPN.FRCNN_HEAD_FUNC='fastrcnn_4conv1fc_head'", "BACKBONE.NORM='None'", "MODE_MASK=False"],
], ids=["C4", "C4-faster", "GN-heads", "conv-head-no-norm"])
def test_the_check_before_training_knows_the_built_models_variables(tf_session, overrides):
    """model_variable_shapes(cfg), which a model file is checked against before any graph exists,
    equals the variables MaskRCNN builds (small nets of each kind)."""
    tf, _ = tf_session
    from training.model.tower import build_towers
    from training.model.weights import model_variable_shapes
    small = ["BACKBONE.RESNET_NUM_BLOCKS=[1, 1, 1, 1]", "BACKBONE.WIDTH=8", "BACKBONE.BLOCK='basic'",
             "BACKBONE.GN_GROUPS=4", "FPN.NUM_CHANNEL=16", "FPN.FRCNN_FC_HEAD_DIM=32", "FPN.FRCNN_CONV_HEAD_DIM=8",
             "MRCNN.HEAD_DIM=8", "RPN.HEAD_DIM=16"]
    cfg = _config(["BG", "a", "b", "c"], *small, *overrides)
    build_towers(cfg)
    assert model_variable_shapes(cfg) == {name: tuple(v.shape) for name, v in _model_variables(tf).items()}


# ------------------------------------------------------------------ fine-tuning at another class count
def test_fine_tuning_at_three_categories_restores_all_but_the_class_layers_and_keeps_frozen_stages(
        tf_session, coco_file, tmp_path, capsys):
    """The full R50-FPN model at 3 categories: 301 of 307 restored, the 6 class layers in their new
    shapes; then 2 training steps (small images), after which the frozen stages still hold the
    file's values and a trained layer does not."""
    tf, sess = tf_session
    from training.data.coco import load_split
    from training.data.pipeline import TrainingBatches
    from training.data.synthetic import SyntheticSpec, generate
    from training.model.tower import build_towers
    path, values = coco_file
    generate(tmp_path / "data", SyntheticSpec(train=2, val=1, size=128, min_object_size=24, max_object_size=64))
    train = load_split(tmp_path / "data", "train2017")
    assert len(train.class_names) == 4   # BG and the synthetic dataset's 3 shapes
    cfg = _config(train.class_names, f"DATA.BASEDIR={str(tmp_path / 'data')!r}", "DATA.TRAIN=('train2017',)",
                  "PREPROC.TRAIN_SHORT_EDGE_SIZE=[128, 128]", "PREPROC.TEST_SHORT_EDGE_SIZE=128", "PREPROC.MAX_SIZE=128",
                  "TRAIN.BATCH_SIZE_PER_GPU=1", "DATA.NUM_WORKERS=0", "FRCNN.BATCH_PER_IM=64", "RPN.TRAIN_PER_LEVEL_NMS_TOPK=200",
                  "TRAIN.WARMUP=0", "TRAIN.BASE_LR=0.01")
    assert cfg.BACKBONE.FREEZE_AT == 2   # the COCO weights count as pretrained
    towers = build_towers(cfg)
    variables = _model_variables(tf)

    init = _restore(tf, sess, path)
    out = capsys.readouterr().out.splitlines()
    assert out[-2] == "restored 301 of 307 variables; re-initialised 6 class-specific ones"
    assert out[-1] == "the file classifies 80 categories, this model 3: re-initialised " + ", ".join(sorted(CLASS_LAYERS))
    assert sorted(init.plan.reinit) == sorted(CLASS_LAYERS)
    # 4 = 3 categories + background; 16 = 4 deltas for each of the 4
    assert {n: tuple(variables[n].shape) for n in CLASS_LAYERS} == {
        "fastrcnn/outputs/class/W": (1024, 4), "fastrcnn/outputs/class/b": (4,),
        "fastrcnn/outputs/box/W": (1024, 16), "fastrcnn/outputs/box/b": (16,),
        "maskrcnn/conv/W": (1, 1, 256, 3), "maskrcnn/conv/b": (3,)}
    restored = sess.run({n: variables[n] for n in init.plan.restore})
    assert len(restored) == 301
    for name, value in restored.items():
        np.testing.assert_array_equal(value, values[f"{name}:0"], err_msg=name)

    frozen = [n for n in variables if n.startswith(FROZEN)]
    assert len(frozen) == 5 + 10 * 5   # conv0 and group0's 10 convs (3 blocks x 3 + shortcut), W + 4 BatchNorm
    trainable = {v.op.name for v in tf.compat.v1.trainable_variables()}
    assert not trainable & set(frozen) and "group1/block0/conv1/W" in trainable
    batches = iter(TrainingBatches(train.training_roidb(), cfg, seed=0))
    for _ in range(2):
        _, loss = sess.run([towers.train_op, towers.cost], towers.feed(next(batches)))
        assert np.isfinite(loss)
    after = sess.run({n: variables[n] for n in frozen + ["group1/block0/conv1/W", "fastrcnn/fc6/W"]})
    for name in frozen:
        np.testing.assert_array_equal(after[name], values[f"{name}:0"], err_msg=name)
    assert not np.array_equal(after["group1/block0/conv1/W"], values["group1/block0/conv1/W:0"])
    assert not np.array_equal(after["fastrcnn/fc6/W"], values["fastrcnn/fc6/W:0"])


# ------------------------------------------------------------------ what stops before training
def _file_shapes():
    return {key.removesuffix(":0"): shape for key, shape in recorded_entries().items()}


def _plan(file_shapes, *overrides, classes=COCO_CLASSES):
    from training.model.weights import model_variable_shapes, plan_finetune
    return plan_finetune(file_shapes, model_variable_shapes(_config(classes, *overrides)), path="coco.npz",
                         every_entry_is_a_variable=True)


def test_the_plan_counts_what_the_trainer_prints():
    assert _plan(_file_shapes()).summary() == "restored 307 of 307 variables; re-initialised 0 class-specific ones"
    plan = _plan(_file_shapes(), classes=["BG", "cat", "dog"])
    assert plan.summary() == "restored 301 of 307 variables; re-initialised 6 class-specific ones"
    assert (plan.file_categories, plan.model_categories) == (80, 2)
    # dump-model-params.py without --meta keeps the step: never restored, never in the way
    assert _plan({**_file_shapes(), "global_step": ()}).summary() == _plan(_file_shapes()).summary()


def test_a_missing_variable_stops_with_its_name_and_the_fix():
    from training.model.weights import WeightsError
    shapes = _file_shapes()
    del shapes["rpn/conv0/b"]
    with pytest.raises(WeightsError, match=r"TRAIN.LOAD_MODEL coco.npz has no 'rpn/conv0/b': it is not a model of this "
                                           r"architecture; set MODE_FPN, MODE_MASK, .* as the file was trained"):
        _plan(shapes)


def test_a_wrong_shape_stops_with_the_keys_to_set():
    from training.model.weights import WeightsError
    with pytest.raises(WeightsError, match=r"'fastrcnn/fc6/W' has shape \(12544, 1024\) in the file but \(12544, 512\) "
                                           r"in the model: set FPN.FRCNN_HEAD_FUNC, FPN.FRCNN_FC_HEAD_DIM"):
        _plan(_file_shapes(), "FPN.FRCNN_FC_HEAD_DIM=512")
    with pytest.raises(WeightsError, match=r"'conv0/W' has shape \(7, 7, 3, 64\) in the file but \(7, 7, 3, 32\) in "
                                           r"the model: set BACKBONE.RESNET_NUM_BLOCKS, BACKBONE.WIDTH"):
        _plan(_file_shapes(), "BACKBONE.WIDTH=32")


def test_an_unused_entry_stops_instead_of_being_dropped():
    """A Mask R-CNN file for a Faster R-CNN model: its 12 mask-head entries would be dropped."""
    from training.model.weights import WeightsError
    with pytest.raises(WeightsError, match=r"coco.npz has 'maskrcnn/conv/W' and 11 more entries that this model has "
                                           r"no variable for, and would drop them: set MODE_FPN, MODE_MASK"):
        _plan(_file_shapes(), "MODE_MASK=False")


def test_the_check_before_training_reads_the_file_and_its_normalisation(coco_file):
    from training.model.weights import WeightsError, check_model_file
    path, _ = coco_file
    assert check_model_file(path, _config(["BG", "a", "b"])).summary() == \
        "restored 301 of 307 variables; re-initialised 6 class-specific ones"
    with pytest.raises(WeightsError, match=f"TRAIN.LOAD_MODEL {path} holds a backbone trained with BatchNorm, which "
                                           f"fits BACKBONE.NORM=FreezeBN or SyncBN, not BACKBONE.NORM=GN"):
        check_model_file(path, _config(["BG", "a"], "BACKBONE.NORM='GN'"))


def test_the_coco_model_as_backbone_weights_stops_and_names_load_model(coco_file):
    """tensorpack and AWS's samples load it through BACKBONE.WEIGHTS; here that would keep only its
    backbone, so it says where the file belongs."""
    from training.config import finalize, new_config
    from training.model.weights import WeightsError, check_weights_file
    path, _ = coco_file
    cfg = new_config()
    cfg.update_args([f"BACKBONE.WEIGHTS={path!r}", "DATA.VAL=()"])
    finalize(cfg, num_ranks=1, class_names=["BG", "a"], has_gpu=False)
    with pytest.raises(WeightsError, match=f"BACKBONE.WEIGHTS {path} is a whole detector \\('fastrcnn/fc6/W' and 41 "
                                           f"more head variables\\), not backbone weights: to fine-tune from it set "
                                           f"TRAIN.LOAD_MODEL={path} and BACKBONE.WEIGHTS=''"):
        check_weights_file(path, cfg)


def test_backbone_weights_and_a_model_together_are_refused():
    from training.config import ConfigError, finalize, new_config
    cfg = new_config()
    cfg.update_args(["BACKBONE.WEIGHTS='ImageNet-R50-AlignPadding.npz'", "TRAIN.LOAD_MODEL='coco.npz'"])
    with pytest.raises(ConfigError, match="both set, but the model file holds the backbone too: set BACKBONE.WEIGHTS='' "
                                          "to fine-tune from the model"):
        finalize(cfg, num_ranks=1, has_gpu=False)


# ------------------------------------------------------------------ training from scratch at full size
def test_a_full_size_run_without_weights_is_warned_about():
    from training.config import finalize, new_config
    from training.model.weights import from_scratch_warning
    scratch = finalize(new_config(), num_ranks=1, has_gpu=False)   # the defaults: R50-FPN, 800 px
    assert from_scratch_warning(scratch).startswith("warning: neither BACKBONE.WEIGHTS nor TRAIN.LOAD_MODEL is set: "
                                                    "this full-size ResNet trains from scratch, which needs a much "
                                                    "longer schedule")
    assert from_scratch_warning(_config(COCO_CLASSES)) is None   # fine-tuning
    from training.configs.cpu_synthetic import OVERRIDES
    cpu = new_config()
    cpu.update_args(OVERRIDES)
    assert from_scratch_warning(finalize(cpu, num_ranks=1, has_gpu=False)) is None   # small by design


# ------------------------------------------------------------------ the trainer
def test_the_trainer_stops_on_a_model_file_that_does_not_fit(coco_file, tmp_path):
    """python -m training.train with the CPU preset (GroupNorm) and the BatchNorm COCO model: exit 2
    and one line, before any graph is built."""
    from test_train_run import run_module
    from training.data.synthetic import SyntheticSpec, generate
    path, _ = coco_file
    generate(tmp_path / "data", SyntheticSpec(train=2, val=1, size=64, min_object_size=12, max_object_size=32))
    proc = run_module("training.train", "--logdir", str(tmp_path / "log"), "--preset", "cpu_synthetic", "--config",
                      f"DATA.BASEDIR={str(tmp_path / 'data')!r}", f"TRAIN.LOAD_MODEL={path!r}")
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert (
        f"error: TRAIN.LOAD_MODEL {path} holds a backbone trained with BatchNorm, which fits BACKBONE.NORM=FreezeBN or "
        f"SyncBN, not BACKBONE.NORM=GN: it would drop or misuse its normalisation parameters and train a damaged "
        f"network. Set BACKBONE.NORM=FreezeBN, or for GN use GroupNorm weights such as tensorpack's "
        f"ImageNet-R50-GroupNorm32-AlignPadding.npz.") in proc.stderr.splitlines()
    assert "Traceback" not in proc.stderr and not (tmp_path / "log" / "config.json").exists()


@pytest.mark.slow
def test_the_trainer_fine_tunes_the_full_model_from_the_coco_file(coco_file, tmp_path):
    """python -m training.train, the default architecture on small images, one step."""
    from test_train_run import run_module
    from training.data.synthetic import SyntheticSpec, generate
    path, _ = coco_file
    generate(tmp_path / "data", SyntheticSpec(train=2, val=1, size=96, min_object_size=16, max_object_size=48))
    proc = run_module("training.train", "--logdir", str(tmp_path / "log"), "--config",
                      f"DATA.BASEDIR={str(tmp_path / 'data')!r}", f"TRAIN.LOAD_MODEL={path!r}", "DATA.VAL=()",
                      "TRAIN.IMAGES_PER_EPOCH=1", "TRAIN.LR_EPOCH_SCHEDULE=[(1, None)]", "DATA.NUM_WORKERS=0",
                      "PREPROC.TRAIN_SHORT_EDGE_SIZE=[96, 96]", "PREPROC.TEST_SHORT_EDGE_SIZE=96", "PREPROC.MAX_SIZE=96",
                      "FRCNN.BATCH_PER_IM=64", "RPN.TRAIN_PER_LEVEL_NMS_TOPK=200")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert f"fine-tuning from {path}" in lines
    assert "restored 301 of 307 variables; re-initialised 6 class-specific ones" in lines
    assert not any(line.startswith("warning: neither") for line in lines)
