"""ResNet backbone with a choice of normalisation, depth, width and data format.

Variable names follow tensorpack's ResNet (``conv0/W``, ``conv0/bn/gamma``,
``group0/block0/conv1/W``, ``.../convshortcut/W``), which are the names in
``ImageNet-R50-AlignPadding.npz``, so those weights load by name.

Normalisation (``BACKBONE.NORM``):
* ``FreezeBN``: BatchNorm with its statistics and affine parameters frozen (pretrained weights);
* ``SyncBN``: BatchNorm whose batch statistics are averaged over all Horovod ranks;
* ``GN``: GroupNorm (works from scratch and at batch size 1);
* ``None``: convolutions with biases, no normalisation.
"""
from __future__ import annotations

import contextlib

from tensorpack.models import BatchNorm, Conv2D, MaxPooling
from tensorpack.tfutils.argscope import argscope

from training.compat import tf, tf1


def channels_axis(data_format: str) -> int:
    return 1 if data_format in ("NCHW", "channels_first") else 3


def group_norm(name: str, x, *, groups: int, data_format: str, gamma_init=1.0):
    """GroupNorm (Wu & He, 2018) for NHWC or NCHW 4-D tensors."""
    nchw = channels_axis(data_format) == 1
    with tf1.variable_scope(name):
        shape = tf.shape(x)
        chan = x.shape[1] if nchw else x.shape[3]
        g = min(groups, chan)
        while chan % g:
            g -= 1
        if nchw:
            xg = tf.reshape(x, [shape[0], g, chan // g, shape[2], shape[3]])
            axes = [2, 3, 4]
            pshape = [1, chan, 1, 1]
        else:
            xg = tf.reshape(x, [shape[0], shape[1], shape[2], g, chan // g])
            axes = [1, 2, 4]
            pshape = [1, 1, 1, chan]
        mean, var = tf.nn.moments(xg, axes, keepdims=True)
        xg = (xg - mean) * tf.math.rsqrt(var + 1e-5)
        x = tf.reshape(xg, shape)
        gamma = tf1.get_variable("gamma", [chan], initializer=tf1.constant_initializer(gamma_init))
        beta = tf1.get_variable("beta", [chan], initializer=tf1.zeros_initializer())
        return x * tf.reshape(gamma, pshape) + tf.reshape(beta, pshape)


def norm_layer(x, *, norm: str, data_format: str, gn_groups: int, zero_init: bool = False):
    """The backbone's normalisation named by ``norm`` (no-op for ``None``)."""
    if norm == "None":
        return x
    if norm == "GN":
        return group_norm("gn", x, groups=gn_groups, data_format=data_format, gamma_init=0.0 if zero_init else 1.0)
    gamma_init = tf1.zeros_initializer() if zero_init else tf1.ones_initializer()
    fmt = "channels_first" if channels_axis(data_format) == 1 else "channels_last"
    if norm == "FreezeBN":
        return BatchNorm("bn", x, training=False, data_format=fmt, gamma_initializer=gamma_init)
    # SyncBN: statistics averaged over every Horovod rank ("internal" EMA update needs no UPDATE_OPS run)
    return BatchNorm("bn", x, data_format=fmt, gamma_initializer=gamma_init, sync_statistics="horovod",
                     ema_update="internal")


@contextlib.contextmanager
def _frozen_variables(frozen: bool):
    """Variables created inside are not trainable (pretrained stages kept as they are)."""
    if not frozen:
        yield
        return

    def getter(getter, *args, **kwargs):  # TF passes the next getter as the keyword "getter"
        kwargs["trainable"] = False
        return getter(*args, **kwargs)

    with tf1.variable_scope(tf1.get_variable_scope(), custom_getter=getter):
        yield


class ResNet:
    """Builds the stages of a ResNet on a preprocessed image batch.

    ``num_blocks``: blocks per stage (4 stages), ``width``: stem channels (64 standard),
    ``block``: ``bottleneck`` (1x1-3x3-1x1, output 4x) or ``basic`` (3x3-3x3).
    """

    def __init__(self, *, num_blocks, width: int, block: str, norm: str, data_format: str,
                 gn_groups: int = 32, freeze_at: int = 0):
        self.num_blocks = list(num_blocks)
        self.width = width
        self.block = block
        self.norm = norm
        self.data_format = data_format
        self.gn_groups = gn_groups
        self.freeze_at = freeze_at
        # FreezeBN's frozen statistics or no norm at all: the convs need biases only without norm
        self.use_bias = norm == "None"

    @classmethod
    def from_config(cls, cfg) -> "ResNet":
        b = cfg.BACKBONE
        return cls(num_blocks=b.RESNET_NUM_BLOCKS, width=b.WIDTH, block=b.BLOCK, norm=b.NORM,
                   data_format=b.DATA_FORMAT, gn_groups=b.GN_GROUPS, freeze_at=b.FREEZE_AT)

    def stage_channels(self, stage: int) -> int:
        """Output channels of stage 0..3 (C2..C5)."""
        mult = 4 if self.block == "bottleneck" else 1
        return self.width * (2 ** stage) * mult

    def _cn(self, name, x, filters, kernel, *, strides=1, relu=True, zero_init=False):
        # tensorpack naming: <name>/W and <name>/bn/* (or <name>/gn/*)
        x = Conv2D(name, x, filters, kernel, strides=strides, use_bias=self.use_bias)
        with tf1.variable_scope(name):
            x = norm_layer(x, norm=self.norm, data_format=self.data_format, gn_groups=self.gn_groups,
                           zero_init=zero_init)
        return tf.nn.relu(x) if relu else x

    def _block(self, x, channels: int, stride: int):
        in_ch = x.shape[channels_axis(self.data_format)]
        out_ch = channels * 4 if self.block == "bottleneck" else channels
        if self.block == "bottleneck":
            y = self._cn("conv1", x, channels, 1)
            y = self._cn("conv2", y, channels, 3, strides=stride)
            y = self._cn("conv3", y, out_ch, 1, relu=False, zero_init=self.norm != "None")
        else:
            y = self._cn("conv1", x, channels, 3, strides=stride)
            y = self._cn("conv2", y, out_ch, 3, relu=False, zero_init=self.norm != "None")
        if in_ch != out_ch or stride != 1:
            shortcut = self._cn("convshortcut", x, out_ch, 1, strides=stride, relu=False)
        else:
            shortcut = x
        return tf.nn.relu(y + shortcut)

    def __call__(self, image, *, num_stages: int = 4):
        """``image``: preprocessed batch in this backbone's data format, sides divisible by 32.

        Returns the outputs of the first ``num_stages`` stages (C2, C3, C4, C5).
        """
        with argscope([Conv2D, MaxPooling], data_format=self.data_format), \
                argscope(Conv2D, kernel_initializer=tf1.variance_scaling_initializer(scale=2.0, distribution="untruncated_normal")):
            with _frozen_variables(self.freeze_at >= 1):
                x = self._cn("conv0", image, self.width, 7, strides=2)
                x = MaxPooling("pool0", x, 3, strides=2, padding="SAME")
            if self.freeze_at >= 1:
                x = tf.stop_gradient(x)
            outputs = []
            for stage in range(num_stages):
                frozen = self.freeze_at >= stage + 2
                with _frozen_variables(frozen), tf1.variable_scope(f"group{stage}"):
                    for i in range(self.num_blocks[stage]):
                        with tf1.variable_scope(f"block{i}"):
                            x = self._block(x, self.width * (2 ** stage), 2 if (i == 0 and stage > 0) else 1)
                if frozen:
                    x = tf.stop_gradient(x)
                outputs.append(x)
            return outputs

    def stage(self, x, stage: int):
        """Run one more stage alone (the C4 model's res5 head on pooled ROIs)."""
        with argscope([Conv2D, MaxPooling], data_format=self.data_format), \
                argscope(Conv2D, kernel_initializer=tf1.variance_scaling_initializer(scale=2.0, distribution="untruncated_normal")), \
                tf1.variable_scope(f"group{stage}"):
            for i in range(self.num_blocks[stage]):
                with tf1.variable_scope(f"block{i}"):
                    x = self._block(x, self.width * (2 ** stage), 2 if i == 0 else 1)
        return x
