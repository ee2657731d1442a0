"""The backbone's variables carry ImageNet-R50-AlignPadding.npz's names, so those weights load."""
import numpy as np
import pytest

# A sample of the names (and shapes) in tensorpack's ImageNet-R50-AlignPadding.npz.
R50_NPZ_SAMPLE = {
    "conv0/W": (7, 7, 3, 64),
    "conv0/bn/gamma": (64,),
    "conv0/bn/mean/EMA": (64,),
    "group0/block0/conv1/W": (1, 1, 64, 64),
    "group0/block0/conv2/W": (3, 3, 64, 64),
    "group0/block0/convshortcut/W": (1, 1, 64, 256),
    "group1/block3/conv3/bn/variance/EMA": (512,),
    "group2/block5/conv2/W": (3, 3, 256, 256),
    "group3/block2/conv3/W": (1, 1, 512, 2048),
    "group3/block0/convshortcut/bn/beta": (2048,),
}


def _build_r50(tf, norm="FreezeBN"):
    from tensorpack.tfutils.tower import TowerContext
    from training.model.backbone import ResNet
    images = tf.compat.v1.placeholder(tf.float32, [1, 64, 64, 3])
    with TowerContext("", is_training=True):
        feats = ResNet(num_blocks=[3, 4, 6, 3], width=64, block="bottleneck", norm=norm,
                       data_format="NHWC", freeze_at=2)(images)
    return images, feats


def test_resnet50_variable_names_and_shapes_match_the_npz(tf_session):
    tf, sess = tf_session
    _, feats = _build_r50(tf)
    assert [f.shape[-1] for f in feats] == [256, 512, 1024, 2048]
    variables = {v.op.name: tuple(v.shape) for v in tf.compat.v1.global_variables()}
    for name, shape in R50_NPZ_SAMPLE.items():
        assert variables.get(name) == shape, name
    trainable = {v.op.name for v in tf.compat.v1.trainable_variables()}
    # FREEZE_AT=2 keeps the stem and group0 as pretrained
    assert "conv0/W" not in trainable and "group0/block0/conv1/W" not in trainable
    assert "group1/block0/conv1/W" in trainable


# SyncBN needs Horovod initialised: tests/training/test_horovod.py trains with it on 2 ranks.
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
def test_fixture_has_the_published_files_names_and_shapes():
    from training.model.weights import backbone_variable_shapes
    r50 = backbone_variable_shapes(num_blocks=[3, 4, 6, 3])
    r101 = backbone_variable_shapes(num_blocks=[3, 4, 23, 3])
    # 53 (R50) / 104 (R101) convolutions, each W + bn/gamma, beta, mean/EMA, variance/EMA
    assert len(r50) == 53 * 5 and len(r101) == 104 * 5
    for name, shape in R50_NPZ_SAMPLE.items():
        assert r50[name] == shape and r101[name] == shape, name
    assert r101["group2/block22/conv3/W"] == (1, 1, 256, 1024) and "group2/block6/conv1/W" not in r50


@pytest.fixture(scope="module")
def r50_npz(tmp_path_factory):
    from training.model.weights import backbone_variable_shapes, write_random_npz
    path = tmp_path_factory.mktemp("weights") / "ImageNet-R50-AlignPadding.npz"
    shapes = {**backbone_variable_shapes(num_blocks=[3, 4, 6, 3]), "linear/W": (2048, 1000), "linear/b": (1000,)}
    return str(path), write_random_npz(path, shapes, seed=1)


def test_npz_weights_load_by_name_every_backbone_variable(tf_session, r50_npz, capsys):
    tf, sess = tf_session
    from training.model.weights import strict_backbone_init
    path, values = r50_npz
    _build_r50(tf)
    init = strict_backbone_init(path, norm="FreezeBN")
    init._setup_graph()
    sess.run(tf.compat.v1.global_variables_initializer())
    init._run_init(sess)
    variables = {v.op.name: v for v in tf.compat.v1.global_variables()}
    assert len(init.restored) == 265 and init.ignored == ["linear/W", "linear/b"]
    for name in init.restored:
        np.testing.assert_array_equal(sess.run(variables[name]), values[name])
    assert "restored all 265 backbone variables" in capsys.readouterr().out


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


def _train_with_weights(tmp_path, norm):
    """``python -m training.train`` for one step of the CPU preset with BatchNorm backbone weights."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    from training.data.synthetic import SyntheticSpec, generate
    from training.model.weights import backbone_variable_shapes, write_random_npz
    repo = Path(__file__).resolve().parents[2]
    generate(tmp_path / "data", SyntheticSpec(train=2, val=1, size=64, min_object_size=12, max_object_size=32))
    # the CPU preset's backbone (4 basic blocks, 16 wide), trained with BatchNorm
    write_random_npz(tmp_path / "bn.npz", backbone_variable_shapes(num_blocks=[1, 1, 1, 1], width=16, block="basic"))
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(repo))
    return subprocess.run(
        [sys.executable, "-m", "training.train", "--logdir", str(tmp_path / "log"), "--preset", "cpu_synthetic",
         "--config", f"DATA.BASEDIR={str(tmp_path / 'data')!r}", f"BACKBONE.WEIGHTS={str(tmp_path / 'bn.npz')!r}",
         f"BACKBONE.NORM={norm!r}", "TRAIN.IMAGES_PER_EPOCH=2", "TRAIN.LR_EPOCH_SCHEDULE=[(1, None)]",
         "PREPROC.TRAIN_SHORT_EDGE_SIZE=[64, 64]", "PREPROC.TEST_SHORT_EDGE_SIZE=64", "PREPROC.MAX_SIZE=64"],
        cwd=repo, env=env, capture_output=True, text=True, timeout=600)


def test_training_with_gn_and_batchnorm_weights_stops_before_training(tmp_path):
    """The trainer refuses BACKBONE.NORM=GN with BatchNorm weights (exit 2, one clear line)
    instead of training a network whose frozen stages lost their statistics."""
    proc = _train_with_weights(tmp_path, "GN")
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "trained with BatchNorm, which fits BACKBONE.NORM=FreezeBN or SyncBN, not BACKBONE.NORM=GN" in proc.stderr


@pytest.mark.slow
def test_training_with_freezebn_weights_restores_the_whole_backbone(tmp_path):
    """The trainer's real path: frozen stages (FREEZE_AT=2) built, every backbone variable restored."""
    proc = _train_with_weights(tmp_path, "FreezeBN")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    # 12 convs (stem, 4 blocks x 2, 3 shortcuts) x (W + 4 BatchNorm parameters)
    assert "backbone weights: restored all 60 backbone variables" in proc.stdout
