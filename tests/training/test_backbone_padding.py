"""The backbone computes what tensorpack's ResNet computes (examples/FasterRCNN/modeling/backbone.py).

* Padding: the "-AlignPadding" ImageNet weights were trained with ``TF_PAD_MODE=False``: conv0
  (7x7/2) padded 3 before / 2 after, pool0 (3x3/2 max) and every stride-2 3x3 convolution 1 before /
  0 after, all run VALID; stride-1 convolutions SAME; the stride-2 1x1 shortcut samples every other
  cell (tensorpack's C4 head drops an odd side's last cell first). The expected outputs come from a
  NumPy implementation of exactly that, written here (no backbone code), or are derived by hand.
* ``backbone_scope``: frozen stages' BatchNorm uses the stored statistics (also with SyncBN), and
  only trained stages synchronise batch statistics across ranks.
* Initialisers: ``variance_scaling(scale=2.0, mode='fan_out')`` (``tf.compat.v1``: truncated
  normal); without a norm, the residual branch's last kernel starts at zero.
"""
import os
import zlib

import numpy as np
import pytest

from onednn import run_with_onednn

# NCHW convolutions and max-pooling exist on a CPU only with oneDNN's kernels, which the suite
# keeps off (tests/conftest.py): test_nchw_under_onednn runs the NCHW cases in a process of their own.
ONEDNN = os.environ.get("TF_ENABLE_ONEDNN_OPTS") == "1"
FORMATS = ["NHWC"] + (["NCHW"] if ONEDNN else [])
BN_EPSILON = 1e-5  # tensorpack BatchNorm's default


# ------------------------------------------------------------------ NumPy reference (tensorpack, TF_PAD_MODE=False)
def np_conv(x, w, *, stride=1, pad=(0, 0), b=None):
    """``x [H, W, Cin]`` zero-padded by ``pad = (before, after)`` on H and W, then a VALID
    cross-correlation with ``w [k, k, Cin, Cout]`` at ``stride``."""
    x = np.pad(x, (pad, pad, (0, 0)))
    k = w.shape[0]
    windows = np.lib.stride_tricks.sliding_window_view(x, (k, k), axis=(0, 1))[::stride, ::stride]
    out = np.einsum("hwcij,ijco->hwo", windows, w)
    return out if b is None else out + b


def np_maxpool(x, *, size, stride, pad):
    x = np.pad(x, (pad, pad, (0, 0)))   # zeros: the input is a ReLU output
    windows = np.lib.stride_tricks.sliding_window_view(x, (size, size), axis=(0, 1))[::stride, ::stride]
    return windows.max(axis=(3, 4))


class NumpyResNet:
    """tensorpack's ResNet on one image ``[H, W, 3]``, weights by tensorpack's variable names."""

    def __init__(self, weights, *, norm, block, num_blocks, width):
        self.p, self.norm, self.block, self.num_blocks, self.width = weights, norm, block, num_blocks, width

    def cn(self, name, x, *, stride=1, relu=True):
        w = self.p[f"{name}/W"]
        k = w.shape[0]
        if stride == 2 and k == 7:
            pad = (3, 2)
        elif stride == 2 and k == 3:
            pad = (1, 0)
        else:   # stride 1 SAME (odd kernel) or a 1x1 window
            pad = ((k - 1) // 2, (k - 1) // 2)
        y = np_conv(x, w, stride=stride, pad=pad, b=self.p.get(f"{name}/b"))
        if self.norm == "FreezeBN":
            bn = lambda s: self.p[f"{name}/bn/{s}"]  # noqa: E731
            y = (y - bn("mean/EMA")) / np.sqrt(bn("variance/EMA") + BN_EPSILON) * bn("gamma") + bn("beta")
        return np.maximum(y, 0) if relu else y

    def unit(self, prefix, x, channels, stride, *, c4_head=False):
        if self.block == "bottleneck":
            out_ch = channels * 4
            y = self.cn(f"{prefix}/conv1", x)
            y = self.cn(f"{prefix}/conv2", y, stride=stride)
            y = self.cn(f"{prefix}/conv3", y, relu=False)
        else:
            out_ch = channels
            y = self.cn(f"{prefix}/conv1", x, stride=stride)
            y = self.cn(f"{prefix}/conv2", y, relu=False)
        if x.shape[2] != out_ch or stride != 1:
            if c4_head and stride == 2:
                x = x[:-1, :-1]    # resnet_shortcut when not FPN
            shortcut = self.cn(f"{prefix}/convshortcut", x, stride=stride, relu=False)
        else:
            shortcut = x
        return np.maximum(y + shortcut, 0)

    def group(self, x, stage, stride, *, c4_head=False):
        for i in range(self.num_blocks[stage]):
            x = self.unit(f"group{stage}/block{i}", x, self.width * 2 ** stage, stride if i == 0 else 1,
                          c4_head=c4_head)
        return x

    def __call__(self, image):
        x = self.cn("conv0", image, stride=2)
        x = np_maxpool(x, size=3, stride=2, pad=(1, 0))
        outputs = []
        for stage in range(4):
            x = self.group(x, stage, 2 if stage > 0 else 1)
            outputs.append(x)
        return outputs


def fixed_weights(shapes):
    """Deterministic values for each variable name (seeded by the name, so independent of order)."""
    out = {}
    for name, shape in shapes.items():
        rng = np.random.default_rng(zlib.crc32(name.encode()))
        if name.endswith("/W"):
            fan_in = int(np.prod(shape[:-1]))
            out[name] = rng.normal(size=shape) * np.sqrt(2.0 / fan_in)
        elif name.endswith("gamma"):
            out[name] = rng.uniform(0.5, 1.5, size=shape)
        elif name.endswith("variance/EMA"):
            out[name] = rng.uniform(0.5, 2.0, size=shape)
        else:   # biases, beta, mean/EMA
            out[name] = rng.normal(size=shape) * 0.1
    return out


# ------------------------------------------------------------------ helpers running the project's backbone
def _to_format(tf, x, data_format):
    return tf.transpose(x, [0, 3, 1, 2]) if data_format == "NCHW" else x


def _to_nhwc(tf, x, data_format):
    return tf.transpose(x, [0, 2, 3, 1]) if data_format == "NCHW" else x


def _load(tf, sess, values=None):
    """Assign ``values`` (default: :func:`fixed_weights`) to every variable of the graph; returns them."""
    variables = {v.op.name: v for v in tf.compat.v1.global_variables()}
    if values is None:
        values = fixed_weights({n: tuple(v.shape) for n, v in variables.items()})
    sess.run([tf.compat.v1.assign(v, values[n].astype(np.float32)) for n, v in variables.items()])
    return values


def _resnet(data_format, **kw):
    from training.model.backbone import ResNet
    args = dict(num_blocks=[1, 1, 1, 1], width=4, block="bottleneck", norm="None", data_format=data_format)
    return ResNet(**{**args, **kw})


# ------------------------------------------------------------------ padding
@pytest.mark.parametrize("data_format", FORMATS)
@pytest.mark.parametrize("norm,block", [("None", "bottleneck"), ("FreezeBN", "bottleneck"), ("None", "basic")])
def test_c2_to_c5_match_numpy_tensorpack_reference(tf_session, data_format, norm, block):
    tf, sess = tf_session
    from tensorpack.tfutils.tower import TowerContext
    image = np.random.default_rng(0).normal(size=(1, 64, 96, 3))
    net = _resnet(data_format, norm=norm, block=block, num_blocks=[2, 1, 1, 1])
    with TowerContext("", is_training=False):
        feats = net(_to_format(tf, tf.constant(image, tf.float32), data_format))
    weights = _load(tf, sess)
    outs = sess.run([_to_nhwc(tf, f, data_format) for f in feats])
    refs = NumpyResNet(weights, norm=norm, block=block, num_blocks=[2, 1, 1, 1], width=4)(image[0])
    for level, (out, ref) in enumerate(zip(outs, refs), start=2):
        assert out[0].shape == ref.shape, f"C{level}"
        np.testing.assert_allclose(out[0], ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max(), err_msg=f"C{level}")


@pytest.mark.parametrize("data_format", FORMATS)
@pytest.mark.parametrize("side", [14, 13])
def test_c4_head_stage_matches_numpy_tensorpack_reference(tf_session, data_format, side):
    """``ResNet.stage`` (res5 on pooled ROIs, 14x14 in the C4 model) as tensorpack's ``resnet_conv5``:
    on an odd side the stride-2 shortcut drops the last row and column, as the branch has no output there."""
    tf, sess = tf_session
    from tensorpack.tfutils.tower import TowerContext
    net = _resnet(data_format, num_blocks=[1, 1, 1, 2])
    rois = np.random.default_rng(1).normal(size=(2, side, side, net.stage_channels(2)))
    with TowerContext("", is_training=False):
        res5 = _to_nhwc(tf, net.stage(_to_format(tf, tf.constant(rois, tf.float32), data_format), 3), data_format)
    weights = _load(tf, sess)
    out = sess.run(res5)
    ref_net = NumpyResNet(weights, norm="None", block="bottleneck", num_blocks=[1, 1, 1, 2], width=4)
    for k in range(2):
        ref = ref_net.group(rois[k], 3, 2, c4_head=True)
        assert out[k].shape == ref.shape == (side // 2, side // 2, net.stage_channels(3))
        np.testing.assert_allclose(out[k], ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


TAPS = 1.0 + np.arange(9.0).reshape(3, 3)   # distinct 3x3 tap values: the centre tap is 5


@pytest.mark.parametrize("data_format", FORMATS)
@pytest.mark.parametrize("block", ["bottleneck", "basic"])
def test_strided_branch_and_shortcut_read_the_same_input_cell(tf_session, data_format, block):
    """A stage's first block on a delta at input cell (4, 6): the strided 3x3 conv's centre tap and
    the 1x1 shortcut both land on output cell (2, 3) and nowhere else. The branch carries channel 0
    to output channel 0 through the strided 3x3 kernel ``TAPS`` (every other kernel passes it
    through one tap), the shortcut carries it to output channel 1. Expected by hand: output
    (2, 3) = [5 (centre tap), 1], zero elsewhere. TF's SAME pads 0 before on this even side, which
    would centre output i on input 2i + 1: the delta would reach (2, 3) through tap (0, 0) and (1, 2)
    through tap (2, 2)."""
    tf, sess = tf_session
    from tensorpack.tfutils.tower import TowerContext
    net = _resnet(data_format, block=block, width=2)
    in_ch = net.stage_channels(0)
    delta = np.zeros((1, 8, 8, in_ch))
    delta[0, 4, 6, 0] = 1.0
    with TowerContext("", is_training=False):
        out = _to_nhwc(tf, net.stage(_to_format(tf, tf.constant(delta, tf.float32), data_format), 1), data_format)
    variables = {v.op.name: v for v in tf.compat.v1.global_variables()}
    values = {n: np.zeros(tuple(v.shape)) for n, v in variables.items()}   # biases 0
    prefix = "group1/block0"
    if block == "bottleneck":
        values[f"{prefix}/conv1/W"][0, 0, 0, 0] = 1.0
        values[f"{prefix}/conv2/W"][:, :, 0, 0] = TAPS        # the strided 3x3
        values[f"{prefix}/conv3/W"][0, 0, 0, 0] = 1.0
    else:
        values[f"{prefix}/conv1/W"][:, :, 0, 0] = TAPS        # the strided 3x3
        values[f"{prefix}/conv2/W"][1, 1, 0, 0] = 1.0         # centre tap: passes the cell through
    values[f"{prefix}/convshortcut/W"][0, 0, 0, 1] = 1.0
    _load(tf, sess, values)
    result = sess.run(out)[0]
    expected = np.zeros((4, 4, net.stage_channels(1)))
    expected[2, 3, :2] = [TAPS[1, 1], 1.0]
    np.testing.assert_allclose(result, expected, atol=1e-6)


@pytest.mark.parametrize("data_format", FORMATS)
def test_batch_padding_reads_zero_as_in_tensorpack(tf_session, data_format):
    """tensorpack pads the normalised image with zeros; a batch padded with black pixels holds
    -mean/std there. With ``image_hw`` the backbone sees zeros there: C2..C5 equal the reference on
    each image zero-padded to the batch's shape."""
    tf, sess = tf_session
    from tensorpack.tfutils.tower import TowerContext
    rng = np.random.default_rng(3)
    hw = np.array([[40, 56], [64, 64]], np.int32)
    images = np.full((2, 64, 64, 3), -2.0)          # what black padding becomes after normalisation
    zero_padded = np.zeros_like(images)
    for k, (h, w) in enumerate(hw):
        images[k, :h, :w] = zero_padded[k, :h, :w] = rng.normal(size=(h, w, 3))
    net = _resnet(data_format)
    with TowerContext("", is_training=False):
        feats = net(_to_format(tf, tf.constant(images, tf.float32), data_format), image_hw=tf.constant(hw))
    weights = _load(tf, sess)
    outs = sess.run([_to_nhwc(tf, f, data_format) for f in feats])
    ref_net = NumpyResNet(weights, norm="None", block="bottleneck", num_blocks=[1, 1, 1, 1], width=4)
    for k in range(2):
        for level, (out, ref) in enumerate(zip(outs, ref_net(zero_padded[k])), start=2):
            np.testing.assert_allclose(out[k], ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max(),
                                       err_msg=f"image {k} C{level}")


if not ONEDNN:  # with oneDNN on in this process the NCHW cases are parametrized above
    def test_nchw_under_onednn():
        run = run_with_onednn(__file__, "NCHW")
        assert "8 passed" in run.stdout, run.stdout[-2000:]


# ------------------------------------------------------------------ SyncBN in frozen stages
def _source_variable(tensor):
    """The variable a tensor reads, through Identity / ReadVariableOp; None if it is computed."""
    op = tensor.op
    while op.type in ("Identity", "ReadVariableOp", "Enter"):
        op = op.inputs[0].op
    return op.name if op.type in ("VarHandleOp", "VariableV2") else None


def _norm_ops(graph, variable_prefix):
    """The ops of one BatchNorm layer, found through the variables it owns (op name scopes may carry
    suffixes such as ``conv1_1`` where variable scopes are reopened)."""
    gamma = f"{variable_prefix}/bn/gamma"
    readers = [op.name for op in graph.get_operations() if not op.name.startswith(gamma + "/")
               and any(_source_variable(t) == gamma for t in op.inputs)]
    assert readers, gamma
    scope = readers[0][:readers[0].index("/bn/") + len("/bn/")]
    return [op for op in graph.get_operations() if op.name.startswith(scope)]


def test_syncbn_frozen_stages_use_stored_statistics_and_do_not_sync(tf_session, monkeypatch):
    """tensorpack's backbone_scope(freeze=True) builds BatchNorm(training=False) also under SyncBN:
    with FREEZE_AT=2, conv0 and group0 normalise with mean/EMA and variance/EMA and run no
    allreduce; group1..3 average their batch statistics across ranks (two allreduces: mean and
    mean of squares)."""
    tf, sess = tf_session
    import horovod.tensorflow as hvd
    from tensorpack.tfutils.tower import TowerContext
    hvd.init()
    # tensorpack syncs only with more than one rank; the graph is built, never run
    monkeypatch.setattr(hvd, "size", lambda: 2)
    net = _resnet("NHWC", norm="SyncBN", freeze_at=2)
    with TowerContext("", is_training=True):
        net(tf.compat.v1.placeholder(tf.float32, [2, 64, 64, 3]))
    graph = tf.compat.v1.get_default_graph()
    for layer in ("conv0", "group0/block0/conv1", "group0/block0/conv3", "group0/block0/convshortcut"):
        ops = _norm_ops(graph, layer)
        assert not [op for op in ops if "Allreduce" in op.type], layer
        fused = [op for op in ops if op.type.startswith("FusedBatchNorm")]
        assert len(fused) == 1 and not fused[0].get_attr("is_training"), layer
        statistics = [_source_variable(t) for t in fused[0].inputs[3:5]]
        assert statistics == [f"{layer}/bn/mean/EMA", f"{layer}/bn/variance/EMA"], layer
    for layer in ("group1/block0/conv1", "group1/block0/conv2", "group2/block0/convshortcut", "group3/block0/conv3"):
        ops = _norm_ops(graph, layer)
        assert len([op for op in ops if op.type == "HorovodAllreduce"]) == 2, layer
        assert not [op for op in ops if op.type.startswith("FusedBatchNorm")], layer


# ------------------------------------------------------------------ initialisers (matter without pretrained weights)
def test_kernels_are_initialised_as_in_tensorpack(tf_session):
    """variance_scaling(scale=2.0, mode='fan_out'), truncated normal (tf.compat.v1's default): the
    standard deviation is sqrt(2 / fan_out) and no value lies beyond 2 / 0.8796 of it (the truncation
    at two standard deviations of the rescaled normal)."""
    tf, sess = tf_session
    from tensorpack.tfutils.tower import TowerContext
    net = _resnet("NHWC", width=64, norm="FreezeBN")
    with TowerContext("", is_training=True):
        net(tf.compat.v1.placeholder(tf.float32, [1, 64, 64, 3]))
    variables = {v.op.name: v for v in tf.compat.v1.global_variables()}
    # fan_out = k * k * out_channels, unlike fan_in: conv0 49 * 64 vs 49 * 3, conv3 256 vs 64
    for name, fan_out in [("conv0/W", 7 * 7 * 64), ("group0/block0/conv3/W", 256)]:
        sess.run(variables[name].initializer)
        w = sess.run(variables[name])
        std = np.sqrt(2.0 / fan_out)
        assert w.std() == pytest.approx(std, rel=0.05), name
        assert np.abs(w).max() <= 2 * std / 0.87962566 * (1 + 1e-5), name


@pytest.mark.parametrize("block,last", [("bottleneck", "conv3"), ("basic", "conv2")])
def test_without_norm_the_branch_ends_with_a_zero_kernel(tf_session, block, last):
    """tensorpack, NORM='None': conv3's kernel_initializer is constant 0 (with a norm, its gamma is)."""
    tf, sess = tf_session
    from tensorpack.tfutils.tower import TowerContext
    with TowerContext("", is_training=True):
        _resnet("NHWC", block=block)(tf.compat.v1.placeholder(tf.float32, [1, 64, 64, 3]))
    sess.run(tf.compat.v1.global_variables_initializer())
    variables = {v.op.name: v for v in tf.compat.v1.global_variables()}
    assert not sess.run(variables[f"group1/block0/{last}/W"]).any()
    assert sess.run(variables["group1/block0/conv1/W"]).any()
