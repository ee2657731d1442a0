"""Stand-ins for tensorpack's weights files, written the way tensorpack writes them.

What a tensorpack ``.npz`` holds (read from tensorpack's sources, not from this project's model):

* Keys are TENSOR names, ``conv0/W:0``: ``varmanip.dump_session_params`` stores ``v.name`` of every
  global variable that is TRAINABLE or MODEL (so no ``global_step``, no optimizer slots), and
  ``scripts/dump-model-params.py`` turns every key into a tensor name before saving (with
  ``--meta`` it keeps the same TRAINABLE + MODEL variables; without it, everything in the
  checkpoint, ``global_step:0`` included). Both save with ``np.savez_compressed``.
* The ImageNet ResNets (``examples/ResNet/resnet_model.py``, ``resnet_backbone``): ``conv0`` (7x7,
  64), then ``group0..3/block{i}`` of ``conv1..3`` (bottleneck: 1x1, 3x3, 1x1 x4) or ``conv1..2``
  (basic: 3x3, 3x3), a 1x1 ``convshortcut`` wherever a block changes the channel count; convs have
  no bias (``use_bias=False``) and each is followed by a BatchNorm named ``bn`` (``gamma``,
  ``beta``, ``mean/EMA``, ``variance/EMA``); last the classifier ``FullyConnected('linear', ...,
  1000)``: ``linear/W``, ``linear/b``. That is 265 + 2 entries for R50 and 520 + 2 for R101.
* ``examples/ResNet/load-resnet.py --convert`` (Caffe's ResNets) writes the same names as OP names
  (``conv0/W``), which tensorpack's ``DictRestore`` accepts too.
"""
from __future__ import annotations

import numpy as np

R50 = (3, 4, 6, 3)
R101 = (3, 4, 23, 3)
BATCHNORM = ("gamma", "beta", "mean/EMA", "variance/EMA")
IMAGENET_CLASSES = 1000


def imagenet_resnet_entries(num_blocks=R50, *, width: int = 64, block: str = "bottleneck") -> dict[str, tuple]:
    """Key -> shape of a tensorpack ImageNet ResNet file (``ImageNet-R50-AlignPadding.npz`` for the
    defaults), tensor names with ``:0``, the classifier included."""
    entries: dict[str, tuple] = {}

    def conv(name, kernel, cin, cout):
        entries[f"{name}/W:0"] = (kernel, kernel, cin, cout)
        entries.update({f"{name}/bn/{p}:0": (cout,) for p in BATCHNORM})

    conv("conv0", 7, 3, width)
    channels = width
    for group, count in enumerate(num_blocks):
        features = width * 2 ** group
        out = features * 4 if block == "bottleneck" else features
        for i in range(count):
            prefix = f"group{group}/block{i}"
            if block == "bottleneck":
                conv(f"{prefix}/conv1", 1, channels, features)
                conv(f"{prefix}/conv2", 3, features, features)
                conv(f"{prefix}/conv3", 1, features, out)
            else:
                conv(f"{prefix}/conv1", 3, channels, features)
                conv(f"{prefix}/conv2", 3, features, features)
            if channels != out:  # resnet_shortcut: a projection only where the channel count changes
                conv(f"{prefix}/convshortcut", 1, channels, out)
            channels = out
    entries["linear/W:0"] = (channels, IMAGENET_CLASSES)
    entries["linear/b:0"] = (IMAGENET_CLASSES,)
    return entries


def random_values(entries: dict[str, tuple], *, seed: int = 0) -> dict[str, np.ndarray]:
    """float32 values of these shapes that a network can run with (other numbers than the published
    files): He-scaled kernels, gammas near 1, positive variances."""
    rng = np.random.default_rng(seed)
    values = {}
    for key, shape in entries.items():
        name = key.removesuffix(":0")
        if name.endswith("variance/EMA"):
            value = rng.uniform(0.5, 2.0, size=shape)
        elif name.endswith("/W"):
            value = rng.normal(size=shape) * np.sqrt(2.0 / np.prod(shape[:-1]))
        else:
            value = rng.normal(scale=0.1, size=shape) + (1.0 if name.endswith("gamma") else 0.0)
        values[key] = value.astype(np.float32)
    return values


def op_names(values: dict) -> dict:
    """The same entries under op names (``conv0/W``), as load-resnet.py writes them."""
    return {key.removesuffix(":0"): value for key, value in values.items()}


def write_npz(path, values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Save as tensorpack does (``np.savez_compressed``, keys as given); returns ``values``."""
    np.savez_compressed(path, **values)
    return values


def write_imagenet_resnet(path, num_blocks=R50, *, width: int = 64, block: str = "bottleneck",
                          seed: int = 0) -> dict[str, np.ndarray]:
    """A random tensorpack-format ImageNet ResNet file at ``path``; returns its key -> value."""
    return write_npz(path, random_values(imagenet_resnet_entries(num_blocks, width=width, block=block), seed=seed))
