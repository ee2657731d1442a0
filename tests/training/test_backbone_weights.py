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


def test_npz_weights_load_by_name(tf_session, tmp_path):
    tf, sess = tf_session
    from tensorpack.tfutils.sessinit import SmartInit
    _build_r50(tf)
    rng = np.random.default_rng(0)
    weights = {name: rng.normal(size=shape).astype(np.float32) for name, shape in R50_NPZ_SAMPLE.items()}
    path = tmp_path / "ImageNet-R50-AlignPadding.npz"
    np.savez(path, **weights)
    sess.run(tf.compat.v1.global_variables_initializer())
    SmartInit(str(path), ignore_mismatch=True).init(sess)
    variables = {v.op.name: v for v in tf.compat.v1.global_variables()}
    for name, value in weights.items():
        np.testing.assert_array_equal(sess.run(variables[name]), value)


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
