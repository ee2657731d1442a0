"""Feature Pyramid Network: P2..P5 from C2..C5 (plus P6 when an anchor level needs stride 64)."""
from __future__ import annotations

from tensorpack.models import Conv2D
from tensorpack.tfutils.argscope import argscope

from training.compat import tf, tf1
from training.model.backbone import channels_axis, group_norm


def upsample2x(x, data_format: str):
    """Nearest-neighbour 2x upsampling in either data format."""
    if channels_axis(data_format) == 1:
        return tf.repeat(tf.repeat(x, 2, axis=2), 2, axis=3)
    return tf.repeat(tf.repeat(x, 2, axis=1), 2, axis=2)


def fpn(features, *, num_channel: int, norm: str, data_format: str, with_p6: bool):
    """``features``: [C2, C3, C4, C5]; returns [P2, P3, P4, P5] (+ P6) with ``num_channel`` channels."""
    use_gn = norm == "GN"

    def maybe_gn(name, x):
        return group_norm(name, x, groups=32, data_format=data_format) if use_gn else x

    with argscope(Conv2D, data_format=data_format, use_bias=not use_gn,
                  kernel_initializer=tf1.variance_scaling_initializer(scale=1.0)), tf1.variable_scope("fpn"):
        laterals = []
        for i, c in enumerate(features):
            name = f"lateral_1x1_c{i + 2}"
            x = Conv2D(name, c, num_channel, 1)
            with tf1.variable_scope(name):
                laterals.append(maybe_gn("gn", x))
        merged = [laterals[-1]]
        for lat in laterals[-2::-1]:
            merged.insert(0, lat + upsample2x(merged[0], data_format))
        outs = []
        for i, m in enumerate(merged):
            name = f"posthoc_3x3_p{i + 2}"
            x = Conv2D(name, m, num_channel, 3)
            with tf1.variable_scope(name):
                outs.append(maybe_gn("gn", x))
        if with_p6:
            p5 = outs[-1]
            # stride-2 subsampling = a 1x1 max-pool with stride 2 (as in the FPN paper)
            outs.append(p5[:, :, ::2, ::2] if channels_axis(data_format) == 1 else p5[:, ::2, ::2, :])
        return outs
