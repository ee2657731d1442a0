"""The backbone's variables carry tensorpack's ImageNet-R50-AlignPadding.npz names, so those
weights load; files are written as tensorpack writes them (tests/training/tensorpack_weights.py)."""
import re

import numpy as np
import pytest

from tensorpack_weights import R50, R101, imagenet_resnet_entries, op_names, write_imagenet_resnet, write_npz

# A sample of the keys (and shapes) of tensorpack's ImageNet-R50-AlignPadding.npz: tensor names.
R50_NPZ_SAMPLE = {
    "conv0/W:0": (7, 7, 3, 64),
    "conv0/bn/gamma:0": (64,),
    "conv0/bn/mean/EMA:0": (64,),
    "group0/block0/conv1/W:0": (1, 1, 64, 64),
    "group0/block0/conv2/W:0": (3, 3, 64, 64),
    "group0/block0/convshortcut/W:0": (1, 1, 64, 256),
    "group1/block3/conv3/bn/variance/EMA:0": (512,),
    "group2/block5/conv2/W:0": (3, 3, 256, 256),
    "group3/block2/conv3/W:0": (1, 1, 512, 2048),
    "group3/block0/convshortcut/bn/beta:0": (2048,),
    "linear/W:0": (2048, 1000),
    "linear/b:0": (1000,),
}
CLASSIFIER = ("linear/W", "linear/b")
# the CPU preset's backbone (4 basic blocks, 16 wide): 12 convs (stem, 4 blocks x 2, 3 shortcuts)
CPU_NET = dict(num_blocks=(1, 1, 1, 1), width=16, block="basic")


def _backbone_of(entries):
    """A file's backbone entries under op names (the classifier left out)."""
    return {n: s for n, s in op_names(entries).items() if n not in CLASSIFIER}


def _build_resnet(tf, num_blocks=R50, width=64, block="bottleneck", norm="FreezeBN"):
    from tensorpack.tfutils.tower import TowerContext
    from training.model.backbone import ResNet
    images = tf.compat.v1.placeholder(tf.float32, [1, 64, 64, 3])
    with TowerContext("", is_training=True):
        feats = ResNet(num_blocks=list(num_blocks), width=width, block=block, norm=norm,
                       data_format="NHWC", freeze_at=2)(images)
    return images, feats


def test_the_tensorpack_listing_has_the_published_files_keys():
    r50, r101 = imagenet_resnet_entries(R50), imagenet_resnet_entries(R101)
    # 53 (R50) / 104 (R101) convolutions, each W + bn/gamma, beta, mean/EMA, variance/EMA; the classifier
    assert len(r50) == 53 * 5 + 2 and len(r101) == 104 * 5 + 2
    for key, shape in R50_NPZ_SAMPLE.items():
        assert r50[key] == shape and r101[key] == shape, key
    assert r101["group2/block22/conv3/W:0"] == (1, 1, 256, 1024) and "group2/block6/conv1/W:0" not in r50


@pytest.mark.parametrize("depth", [R50, R101], ids=["R50", "R101"])
def test_the_expected_backbone_is_the_published_files_backbone(depth):
    """What check_weights_file expects before training = the file's backbone entries, as op names."""
    from training.model.weights import backbone_variable_shapes
    assert backbone_variable_shapes(num_blocks=list(depth)) == _backbone_of(imagenet_resnet_entries(depth))


def test_resnet50_variable_names_and_shapes_match_the_npz(tf_session):
    tf, sess = tf_session
    _, feats = _build_resnet(tf)
    assert [f.shape[-1] for f in feats] == [256, 512, 1024, 2048]
    variables = {v.op.name: tuple(v.shape) for v in tf.compat.v1.global_variables()}
    assert variables == _backbone_of(imagenet_resnet_entries(R50))
    trainable = {v.op.name for v in tf.compat.v1.trainable_variables()}
    # FREEZE_AT=2 keeps the stem and group0 as pretrained
    assert "conv0/W" not in trainable and "group0/block0/conv1/W" not in trainable
    assert "group1/block0/conv1/W" in trainable


# SyncBN needs Horovod initialised: tests/training/test_startup_devices.py trains with it on 2 ranks.
@pytest.mark.parametrize("norm", ["GN", "None"])
def test_other_norms_build(tf_session, norm):
    tf, sess = tf_session
    from tensorpack.tfutils.tower import TowerContext
    from training.model.backbone import ResNet
    images = tf.compat.v1.placeholder(tf.float32, [2, 64, 64, 3])
    with TowerContext("", is_training=True):
        feats = ResNet(num_blocks=[1, 1, 1, 1], width=8, block="basic", norm=norm, data_format="NHWC",
                       gn_groups=4)(images)
    sess.run(tf.compat.v1.global_variables_initializer())
    outs = sess.run(feats, {images: np.random.default_rng(0).normal(size=(2, 64, 64, 3))})
    assert [o.shape for o in outs] == [(2, 16, 16, 8), (2, 8, 8, 16), (2, 4, 4, 32), (2, 2, 2, 64)]
    assert all(np.isfinite(o).all() for o in outs)


# ------------------------------------------------------------------ strict restore (training/model/weights.py)
@pytest.fixture(scope="module")
def r50_npz(tmp_path_factory):
    """A random ImageNet-R50-AlignPadding.npz as tensorpack wrote it: `:0` keys, the classifier too."""
    path = tmp_path_factory.mktemp("weights") / "ImageNet-R50-AlignPadding.npz"
    return str(path), write_imagenet_resnet(path, R50, seed=1)


def _restore(tf, sess, path, norm="FreezeBN"):
    """strict_backbone_init as the trainer runs it: set up on the built graph, then run on the session."""
    from training.model.weights import strict_backbone_init
    init = strict_backbone_init(path, norm=norm)
    init._setup_graph()
    sess.run(tf.compat.v1.global_variables_initializer())
    init._run_init(sess)
    return init, {v.op.name: sess.run(v) for v in tf.compat.v1.global_variables()}


def test_the_tensorpack_file_loads_every_backbone_variable_by_name(tf_session, r50_npz, capsys):
    tf, sess = tf_session
    path, values = r50_npz
    _build_resnet(tf)
    init, restored = _restore(tf, sess, path)
    assert len(init.restored) == 265 and init.ignored == list(CLASSIFIER)
    assert sorted(restored) == sorted(init.restored)
    for name, value in restored.items():
        np.testing.assert_array_equal(value, values[f"{name}:0"], err_msg=name)
    out = capsys.readouterr().out.splitlines()
    assert f"restored 265 of 265 backbone variables from {path}" in out
    assert f"not loaded from {path} (not backbone variables): linear/W, linear/b" in out


def test_a_file_with_op_names_still_loads(tf_session, tmp_path, capsys):
    """Op-name keys, as examples/ResNet/load-resnet.py --convert writes them."""
    tf, sess = tf_session
    path = str(tmp_path / "converted.npz")
    values = write_npz(path, op_names(write_imagenet_resnet(tmp_path / "tensor_names.npz", **CPU_NET)))
    _build_resnet(tf, **CPU_NET)
    init, restored = _restore(tf, sess, path)
    assert len(restored) == 60
    for name, value in restored.items():
        np.testing.assert_array_equal(value, values[name], err_msg=name)
    assert f"restored 60 of 60 backbone variables from {path}" in capsys.readouterr().out.splitlines()


def test_the_check_before_training_accepts_the_tensorpack_file(r50_npz):
    from training.config import new_config
    from training.model.weights import check_weights_file, npz_shapes
    path, values = r50_npz
    assert npz_shapes(path) == op_names({k: v.shape for k, v in values.items()})
    check_weights_file(path, new_config())  # the defaults: R50, FreezeBN


def test_the_norm_check_sees_batchnorm_in_the_tensorpack_file(r50_npz):
    from training.config import new_config
    from training.model.weights import WeightsError, check_weights_file, norm_kind, npz_shapes
    path, _ = r50_npz
    assert norm_kind(npz_shapes(path)) == "BatchNorm"
    cfg = new_config()
    cfg.BACKBONE.NORM = "GN"
    with pytest.raises(WeightsError, match=re.escape(path) + " holds a backbone trained with BatchNorm, which fits "
                                           "BACKBONE.NORM=FreezeBN or SyncBN, not BACKBONE.NORM=GN"):
        check_weights_file(path, cfg)


def _tiny_file(tmp_path, keys):
    path = str(tmp_path / "w.npz")
    np.savez(path, **{k: np.full((2,), i, np.float32) for i, k in enumerate(keys)})
    return path


def test_a_variable_under_both_key_forms_is_an_error(tmp_path):
    """Which of the two values is the variable's? Neither is taken silently (tensorpack's
    DictRestore would keep whichever came last)."""
    from training.model.weights import WeightsError, npz_shapes, read_npz
    path = _tiny_file(tmp_path, ["conv0/W", "conv0/bn/gamma:0", "conv0/W:0"])
    for read in (npz_shapes, read_npz):  # the checks before training, and the restores
        with pytest.raises(WeightsError, match=re.escape(path) + " holds 'conv0/W' twice, as 'conv0/W' and "
                                                                 "'conv0/W:0'"):
            read(path)


def test_a_key_naming_another_tensor_is_an_error(tmp_path):
    from training.model.weights import WeightsError, npz_shapes
    path = _tiny_file(tmp_path, ["conv0/W:0", "conv0/W:1"])
    with pytest.raises(WeightsError, match=re.escape(path) + ": 'conv0/W:1' is not a variable's value"):
        npz_shapes(path)


def test_a_file_without_backbone_variables_says_so(tmp_path):
    """Not "trained with no normalisation": the file holds no backbone (here: another scope)."""
    from training.config import new_config
    from training.model.weights import WeightsError, check_weights_file
    path = _tiny_file(tmp_path, ["tower0/conv0/W:0", "tower0/conv0/bn/gamma:0", "global_step:0"])
    with pytest.raises(WeightsError, match=re.escape(path) + " holds no backbone variable .* 3 entries: "
                                           "'global_step', 'tower0/conv0/W', 'tower0/conv0/bn/gamma'"):
        check_weights_file(path, new_config())


def test_a_deeper_file_is_an_error_naming_the_first_extra_block(tmp_path):
    from training.model.weights import WeightsError, backbone_variable_shapes, plan_restore
    r101 = backbone_variable_shapes(num_blocks=[3, 4, 23, 3])
    r50 = backbone_variable_shapes(num_blocks=[3, 4, 6, 3])
    with pytest.raises(WeightsError, match=r"'group2/block10/conv1/W' and 254 more .* \[3, 4, 23, 3\] = R101"):
        plan_restore(r101, r50, norm="FreezeBN", path="ImageNet-R101-AlignPadding.npz")


def test_a_missing_or_misshapen_variable_is_an_error_naming_it():
    from training.model.weights import WeightsError, backbone_variable_shapes, plan_restore
    r50 = backbone_variable_shapes(num_blocks=[3, 4, 6, 3])
    partial = {k: v for k, v in r50.items() if k != "group1/block2/conv2/bn/variance/EMA"}
    with pytest.raises(WeightsError, match="has no 'group1/block2/conv2/bn/variance/EMA'"):
        plan_restore(partial, r50, norm="FreezeBN", path="w.npz")
    narrow = backbone_variable_shapes(num_blocks=[3, 4, 6, 3], width=32)
    with pytest.raises(WeightsError, match=r"'conv0/W' has shape \(7, 7, 3, 32\) in the file but \(7, 7, 3, 64\)"):
        plan_restore(narrow, r50, norm="FreezeBN", path="w.npz")


@pytest.mark.parametrize("norm", ["GN", "None"])
def test_batchnorm_weights_refuse_gn_and_no_norm(norm):
    from training.model.weights import WeightsError, backbone_variable_shapes, plan_restore
    file_shapes = backbone_variable_shapes(num_blocks=[3, 4, 6, 3])
    model = backbone_variable_shapes(num_blocks=[3, 4, 6, 3], norm=norm)
    with pytest.raises(WeightsError, match=f"trained with BatchNorm, which fits BACKBONE.NORM=FreezeBN or SyncBN, "
                                           f"not BACKBONE.NORM={norm}.*Set BACKBONE.NORM=FreezeBN"):
        plan_restore(file_shapes, model, norm=norm, path="ImageNet-R50-AlignPadding.npz")
    # the other way round: GroupNorm weights fit GN only
    gn_file = backbone_variable_shapes(num_blocks=[3, 4, 6, 3], norm="GN")
    with pytest.raises(WeightsError, match="trained with GroupNorm, which fits BACKBONE.NORM=GN"):
        plan_restore(gn_file, file_shapes, norm="FreezeBN", path="ImageNet-R50-GroupNorm32-AlignPadding.npz")


# ------------------------------------------------------------------ fine-tuning (weights.strict_finetune_init)
def _model_graph(tf):
    """A few variables named as in a Mask R-CNN, and the global step."""
    tf1 = tf.compat.v1
    shapes = {"conv0/W": (7, 7, 3, 4), "fpn/lateral_1x1_c2/W": (1, 1, 4, 8), "maskrcnn/conv/b": (8,)}
    variables = {n: tf1.get_variable(n, s, initializer=tf1.zeros_initializer()) for n, s in shapes.items()}
    return variables, tf1.train.get_or_create_global_step()


def test_fine_tuning_restores_a_tensorpack_model_file_but_not_its_step(tf_session, tmp_path, capsys):
    """A COCO model file as dump-model-params.py writes it without --meta: tensor names, the step too."""
    from training.model.weights import strict_finetune_init
    tf, sess = tf_session
    variables, step = _model_graph(tf)
    rng = np.random.default_rng(3)
    values = {f"{n}:0": rng.normal(size=v.shape).astype(np.float32) for n, v in variables.items()}
    path = str(tmp_path / "COCO-MaskRCNN-R50FPN2x.npz")
    write_npz(path, {**values, "global_step:0": np.int64(90000)})
    init = strict_finetune_init(path)
    init._setup_graph()
    sess.run(tf.compat.v1.global_variables_initializer())
    init._run_init(sess)
    for name, var in variables.items():
        np.testing.assert_array_equal(sess.run(var), values[f"{name}:0"], err_msg=name)
    assert sess.run(step) == 0
    assert "restored 3 of 3 variables; re-initialised 0 class-specific ones" in capsys.readouterr().out.splitlines()


def test_fine_tuning_refuses_a_file_with_both_key_forms(tf_session, tmp_path):
    from training.model.weights import WeightsError, strict_finetune_init
    tf, _ = tf_session
    _model_graph(tf)
    path = _tiny_file(tmp_path, ["maskrcnn/conv/b:0", "maskrcnn/conv/b"])
    with pytest.raises(WeightsError, match=re.escape(path) + " holds 'maskrcnn/conv/b' twice"):
        strict_finetune_init(path)._setup_graph()


# ------------------------------------------------------------------ the trainer's real path
def _train_with_weights(tmp_path, norm, *extra):
    """``python -m training.train`` for one step of the CPU preset with BatchNorm backbone weights."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    from training.data.synthetic import SyntheticSpec, generate
    repo = Path(__file__).resolve().parents[2]
    generate(tmp_path / "data", SyntheticSpec(train=2, val=1, size=64, min_object_size=12, max_object_size=32))
    # the CPU preset's backbone, trained with BatchNorm on ImageNet, saved as tensorpack saves it
    write_imagenet_resnet(tmp_path / "bn.npz", **CPU_NET)
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(repo))
    return subprocess.run(
        [sys.executable, "-m", "training.train", "--logdir", str(tmp_path / "log"), "--preset", "cpu_synthetic",
         "--config", f"DATA.BASEDIR={str(tmp_path / 'data')!r}", f"BACKBONE.WEIGHTS={str(tmp_path / 'bn.npz')!r}",
         f"BACKBONE.NORM={norm!r}", "TRAIN.IMAGES_PER_EPOCH=2", "TRAIN.LR_EPOCH_SCHEDULE=[(1, None)]",
         "PREPROC.TRAIN_SHORT_EDGE_SIZE=[64, 64]", "PREPROC.TEST_SHORT_EDGE_SIZE=64", "PREPROC.MAX_SIZE=64",
         *extra], cwd=repo, env=env, capture_output=True, text=True, timeout=600)


def test_training_with_gn_and_batchnorm_weights_stops_before_training(tmp_path):
    """The trainer refuses BACKBONE.NORM=GN with BatchNorm weights (exit 2, one clear line)
    instead of training a network whose frozen stages lost their statistics."""
    proc = _train_with_weights(tmp_path, "GN")
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "trained with BatchNorm, which fits BACKBONE.NORM=FreezeBN or SyncBN, not BACKBONE.NORM=GN" in proc.stderr


def test_training_stops_before_building_on_an_ambiguous_model_file(tmp_path):
    """A TRAIN.LOAD_MODEL file holding one variable under both key forms stops the run at start-up
    (exit 2, one line naming the file and both keys), not with a traceback on every rank later."""
    model = _tiny_file(tmp_path, ["conv0/W", "conv0/W:0"])
    proc = _train_with_weights(tmp_path, "FreezeBN", f"TRAIN.LOAD_MODEL={str(model)!r}", "BACKBONE.WEIGHTS=''")
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "holds 'conv0/W' twice, as 'conv0/W' and 'conv0/W:0'" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_training_with_freezebn_weights_restores_the_whole_backbone(tmp_path):
    """The trainer's real path: frozen stages (FREEZE_AT=2) built, every backbone variable restored."""
    proc = _train_with_weights(tmp_path, "FreezeBN")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    # 12 convs (stem, 4 blocks x 2, 3 shortcuts) x (W + 4 BatchNorm parameters); the classifier left out
    lines = proc.stdout.splitlines()
    assert f"restored 60 of 60 backbone variables from {tmp_path / 'bn.npz'}" in lines
    assert f"not loaded from {tmp_path / 'bn.npz'} (not backbone variables): linear/W, linear/b" in lines
