"""ResNet backbone with a choice of normalisation, depth, width and data format.

Variable names follow tensorpack's ResNet (``conv0/W``, ``conv0/bn/gamma``,
``group0/block0/conv1/W``, ``.../convshortcut/W``), which are the names in
``ImageNet-R50-AlignPadding.npz``, so those weights load by name.

Normalisation (``BACKBONE.NORM``):
* ``FreezeBN``: BatchNorm with its statistics and affine parameters frozen (pretrained weights);
* ``SyncBN``: BatchNorm whose batch statistics are averaged over all Horovod ranks;
* ``GN``: GroupNorm (works from scratch and at batch size 1);
* ``None``: convolutions with biases, no normalisation.

Frozen stages (``FREEZE_AT``) keep their variables and, with either BatchNorm, normalise with the
stored statistics: only the trained stages of ``SyncBN`` average batch statistics across ranks
(tensorpack's ``backbone_scope``).

Padding is tensorpack's ``TF_PAD_MODE=False``, under which the "-AlignPadding" weights were trained:
every stride-2 window with a kernel wider than 1 is zero-padded explicitly (``(k - 1) // 2`` cells
before, ``k - 2 - (k - 1) // 2`` after: 3/2 for the 7x7 stem, 1/0 for pool0 and the strided 3x3
convolutions) and run VALID, so output cell ``i`` is centred on input cell ``2i``, the cell the
block's stride-2 1x1 shortcut samples. TF's SAME pads the other way on even sides and would shift
each strided branch one input cell off its shortcut.
"""
from __future__ import annotations

import contextlib
import functools

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


def norm_layer(x, *, norm: str, data_format: str, gn_groups: int, zero_init: bool = False,
               frozen: bool = False):
    """The backbone's normalisation named by ``norm`` (no-op for ``None``).

    ``frozen``: the layer belongs to a frozen stage, whose BatchNorm (FreezeBN or SyncBN) uses its
    stored statistics, as in tensorpack.
    """
    if norm == "None":
        return x
    if norm == "GN":
        return group_norm("gn", x, groups=gn_groups, data_format=data_format, gamma_init=0.0 if zero_init else 1.0)
    gamma_init = tf1.zeros_initializer() if zero_init else tf1.ones_initializer()
    fmt = "channels_first" if channels_axis(data_format) == 1 else "channels_last"
    if norm == "FreezeBN" or frozen:
        return BatchNorm("bn", x, training=False, data_format=fmt, gamma_initializer=gamma_init)
    # SyncBN: statistics averaged over every Horovod rank ("internal" EMA update needs no UPDATE_OPS run)
    return BatchNorm("bn", x, data_format=fmt, gamma_initializer=gamma_init, sync_statistics="horovod",
                     ema_update="internal")


def aligned_padding(kernel: int) -> tuple[int, int]:
    """``(before, after)`` zero padding of an even side for a stride-2 window of side ``kernel`` > 1.

    ``kernel - 2`` cells in all give ``side / 2`` outputs; more of them before puts output ``i``'s
    centre on input ``2i`` (tensorpack's TF_PAD_MODE=False: 3/2 for 7x7, 1/0 for 3x3).
    """
    before = (kernel - 1) // 2
    return before, kernel - 2 - before


def pad_spatial(x, before: int, after: int, data_format: str):
    """Zero-pad the two spatial axes of ``x`` by ``before`` at the top/left and ``after`` at the bottom/right."""
    spatial = [[before, after], [before, after]]
    if channels_axis(data_format) == 1:
        return tf.pad(x, [[0, 0], [0, 0]] + spatial)
    return tf.pad(x, [[0, 0]] + spatial + [[0, 0]])


def drop_last_row_and_column(x, data_format: str):
    """What a stride-2 1x1 shortcut sees: on an odd side the last cell has no strided-branch output
    (``floor(side / 2)`` of them), so it is dropped (tensorpack's C4 ``resnet_shortcut``); on an even
    side the shortcut never samples it, so nothing changes."""
    return x[:, :, :-1, :-1] if channels_axis(data_format) == 1 else x[:, :-1, :-1, :]


def zero_outside_images(x, image_hw, data_format: str):
    """Set the padding around each image of a batch to 0, the mean colour after normalisation.

    tensorpack pads the normalised image with zeros (``resnet_fpn_backbone``); a batch padded with
    black pixels before normalisation holds ``-mean / std`` there instead.
    """
    nchw = channels_axis(data_format) == 1
    shape = tf.shape(x)
    height, width = (shape[2], shape[3]) if nchw else (shape[1], shape[2])
    image_hw = tf.cast(image_hw, tf.int32)
    rows = tf.range(height)[None, :] < image_hw[:, :1]       # [B, H]
    cols = tf.range(width)[None, :] < image_hw[:, 1:]        # [B, W]
    inside = tf.cast(tf.logical_and(rows[:, :, None], cols[:, None, :]), x.dtype)
    return x * (inside[:, None] if nchw else inside[..., None])


def _kernel_initializer():
    """tensorpack's backbone initializer: He-normal over fan-out (``tf.compat.v1`` default: truncated)."""
    return tf1.variance_scaling_initializer(scale=2.0, mode="fan_out", distribution="truncated_normal")


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

    def _cn(self, name, x, filters, kernel, *, frozen: bool, strides=1, relu=True, zero_init=False):
        # tensorpack naming: <name>/W and <name>/bn/* (or <name>/gn/*)
        if strides == 2 and kernel > 1:
            x = pad_spatial(x, *aligned_padding(kernel), self.data_format)
            padding = "VALID"
        else:
            # stride 1 (odd kernel: SAME pads evenly) or a 1x1 window (SAME never pads)
            padding = "SAME"
        # zero_init: the residual branch starts at zero (tensorpack) through its norm's gamma or,
        # without a norm, its last kernel
        init = {"kernel_initializer": tf1.zeros_initializer()} if zero_init and self.norm == "None" else {}
        x = Conv2D(name, x, filters, kernel, strides=strides, padding=padding, use_bias=self.use_bias, **init)
        with tf1.variable_scope(name):
            x = norm_layer(x, norm=self.norm, data_format=self.data_format, gn_groups=self.gn_groups,
                           zero_init=zero_init, frozen=frozen)
        return tf.nn.relu(x) if relu else x

    def _block(self, x, channels: int, stride: int, frozen: bool):
        cn = functools.partial(self._cn, frozen=frozen)
        in_ch = x.shape[channels_axis(self.data_format)]
        out_ch = channels * 4 if self.block == "bottleneck" else channels
        if self.block == "bottleneck":
            y = cn("conv1", x, channels, 1)
            y = cn("conv2", y, channels, 3, strides=stride)
            y = cn("conv3", y, out_ch, 1, relu=False, zero_init=True)
        else:
            y = cn("conv1", x, channels, 3, strides=stride)
            y = cn("conv2", y, out_ch, 3, relu=False, zero_init=True)
        if in_ch != out_ch or stride != 1:
            if stride == 2:
                x = drop_last_row_and_column(x, self.data_format)
            shortcut = cn("convshortcut", x, out_ch, 1, strides=stride, relu=False)
        else:
            shortcut = x
        return tf.nn.relu(y + shortcut)

    @contextlib.contextmanager
    def _scope(self, frozen: bool):
        """Layer defaults; a frozen stage's variables are not trainable."""
        with argscope([Conv2D, MaxPooling], data_format=self.data_format), \
                argscope(Conv2D, kernel_initializer=_kernel_initializer()), _frozen_variables(frozen):
            yield

    def _group(self, x, stage: int, first_stride: int, frozen: bool):
        with self._scope(frozen), tf1.variable_scope(f"group{stage}"):
            for i in range(self.num_blocks[stage]):
                with tf1.variable_scope(f"block{i}"):
                    x = self._block(x, self.width * (2 ** stage), first_stride if i == 0 else 1, frozen)
        return x

    def _stem(self, image, frozen: bool):
        """conv0 (7x7/2) and pool0 (3x3/2 max), both aligned-padded: 1/4 of the image's side."""
        with self._scope(frozen):
            x = self._cn("conv0", image, self.width, 7, strides=2, frozen=frozen)
            # zero padding is max-neutral here: the input is a ReLU output
            x = pad_spatial(x, *aligned_padding(3), self.data_format)
            return MaxPooling("pool0", x, 3, strides=2, padding="VALID")

    def __call__(self, image, *, num_stages: int = 4, image_hw=None):
        """``image``: preprocessed batch in this backbone's data format, sides divisible by 32.
        ``image_hw`` ``[B, 2]`` (optional): each image's size before padding; the padding is then
        zeroed first, as tensorpack pads its normalised image.

        Returns the outputs of the first ``num_stages`` stages (C2, C3, C4, C5).
        """
        if image_hw is not None:
            image = zero_outside_images(image, image_hw, self.data_format)
        x = self._stem(image, self.freeze_at >= 1)
        if self.freeze_at >= 1:
            x = tf.stop_gradient(x)
        outputs = []
        for stage in range(num_stages):
            frozen = self.freeze_at >= stage + 2
            x = self._group(x, stage, 2 if stage > 0 else 1, frozen)
            if frozen:
                x = tf.stop_gradient(x)
            outputs.append(x)
        return outputs

    def stage(self, x, stage: int):
        """Run one more stage alone (the C4 model's res5 head on pooled ROIs; trained, as in tensorpack)."""
        return self._group(x, stage, 2, frozen=False)
