"""Backbone weights from tensorpack's ImageNet ``.npz`` files, restored strictly.

tensorpack's ``ImageNet-R50-AlignPadding.npz`` / ``ImageNet-R101-AlignPadding.npz`` hold, for every
convolution of the ResNet (``conv0``, ``group{s}/block{b}/conv{1,2,3}``, ``.../convshortcut``), its
kernel ``W`` and its BatchNorm ``bn/gamma``, ``bn/beta``, ``bn/mean/EMA``, ``bn/variance/EMA``
(backbone.py uses the same names). A loader that skips what does not match (tensorpack's
``SmartInit`` only warns) trains a partly random backbone without anyone noticing, so here:

* every backbone variable of the model must be in the file with the same shape;
* every backbone entry of the file must be used (a ResNet-101 file for a ResNet-50 model is
  an error, not 33 silently dropped blocks);
* the file's normalisation must fit ``BACKBONE.NORM``: BatchNorm statistics need FreezeBN or
  SyncBN. GN or no normalisation would drop the statistics and leave the frozen stages wrong.

Anything else in the file (an ImageNet classifier, a step counter) is reported and not loaded.
A violation is a :class:`WeightsError` that names the variable and the fix.

The files' keys are tensor names (``conv0/W:0``: tensorpack's ``dump_session_params`` and
``dump-model-params.py`` write ``Variable.name``) or, from some converters, op names (``conv0/W``).
:func:`variable_names` maps both to the op name once, when a file is read; everything after it
(the checks, the restore, fine-tuning in train.py) works with op names.
"""
from __future__ import annotations

import re

import numpy as np

from training.config import ConfigError

# A backbone variable: the stem, or a block's conv, with its kernel/bias or its norm's parameters.
BACKBONE_VARIABLE = re.compile(
    r"^(conv0|group\d+/block\d+/(conv\d|convshortcut))/(W|b|(bn|gn)/(gamma|beta|mean/EMA|variance/EMA))$")
# Which BACKBONE.NORM values each kind of weights fits, and which published files fit each norm.
NORMS_FOR_KIND = {"BatchNorm": ("FreezeBN", "SyncBN"), "GroupNorm": ("GN",), "no normalisation": ("None",)}
WEIGHTS_FOR_NORM = {
    "FreezeBN": "tensorpack's ImageNet-R50-AlignPadding.npz or ImageNet-R101-AlignPadding.npz",
    "SyncBN": "tensorpack's ImageNet-R50-AlignPadding.npz or ImageNet-R101-AlignPadding.npz",
    "GN": "GroupNorm weights such as tensorpack's ImageNet-R50-GroupNorm32-AlignPadding.npz",
    "None": "no published ImageNet weights: train it from scratch (BACKBONE.WEIGHTS='')",
}


class WeightsError(ConfigError):
    """Backbone weights do not fit the model; the message names the variable and the fix."""


def backbone_variable_shapes(*, num_blocks, width: int = 64, block: str = "bottleneck",
                             norm: str = "FreezeBN") -> dict[str, tuple]:
    """Names and shapes of a ResNet backbone's variables, in tensorpack's naming.

    With the defaults and ``num_blocks=[3, 4, 6, 3]`` (``[3, 4, 23, 3]``) these are exactly the
    265 (520) backbone entries of ``ImageNet-R50-AlignPadding.npz`` (``-R101-``), as op names.
    """
    out: dict[str, tuple] = {}

    def conv(name, k, cin, cout):
        out[f"{name}/W"] = (k, k, cin, cout)
        if norm == "None":
            out[f"{name}/b"] = (cout,)
        elif norm == "GN":
            out.update({f"{name}/gn/gamma": (cout,), f"{name}/gn/beta": (cout,)})
        else:
            out.update({f"{name}/bn/{p}": (cout,) for p in ("gamma", "beta", "mean/EMA", "variance/EMA")})

    conv("conv0", 7, 3, width)
    cin = width
    mult = 4 if block == "bottleneck" else 1
    for stage, blocks in enumerate(num_blocks):
        ch = width * 2 ** stage
        for b in range(blocks):
            prefix = f"group{stage}/block{b}"
            if block == "bottleneck":
                conv(f"{prefix}/conv1", 1, cin, ch)
                conv(f"{prefix}/conv2", 3, ch, ch)
                conv(f"{prefix}/conv3", 1, ch, ch * mult)
            else:
                conv(f"{prefix}/conv1", 3, cin, ch)
                conv(f"{prefix}/conv2", 3, ch, ch)
            if b == 0 and (cin != ch * mult or stage > 0):
                conv(f"{prefix}/convshortcut", 1, cin, ch * mult)
            cin = ch * mult
    return out


def norm_kind(names) -> str:
    """What normalisation a weights file was trained with, from its variable names."""
    names = list(names)
    if any("/bn/" in n for n in names):
        return "BatchNorm"
    if any("/gn/" in n for n in names):
        return "GroupNorm"
    return "no normalisation"


def check_has_backbone(names, *, path: str) -> None:
    """Refuse a file with no backbone entry at all: its normalisation cannot be told, and what is
    wrong is the file (another network, a scope prefix such as ``tower0/``), so say that."""
    names = sorted(names)
    if not any(BACKBONE_VARIABLE.match(n) for n in names):
        shown = ", ".join(repr(n) for n in names[:5]) + (", ..." if len(names) > 5 else "")
        raise WeightsError(
            f"BACKBONE.WEIGHTS {path} holds no backbone variable (conv0/W, group0/block0/conv1/W, ... in "
            f"tensorpack's ResNet naming); its {len(names)} entries: {shown or 'none'}")


def check_norm(names, *, norm: str, path: str) -> None:
    """Refuse weights whose normalisation the configured ``BACKBONE.NORM`` cannot use."""
    kind = norm_kind(n for n in names if BACKBONE_VARIABLE.match(n))
    if norm not in NORMS_FOR_KIND[kind]:
        fits = " or ".join(NORMS_FOR_KIND[kind])
        raise WeightsError(
            f"BACKBONE.WEIGHTS {path} holds a backbone trained with {kind}, which fits BACKBONE.NORM={fits}, "
            f"not BACKBONE.NORM={norm}: it would drop or misuse its normalisation parameters and train a damaged "
            f"network. Set BACKBONE.NORM={NORMS_FOR_KIND[kind][0]}, or for {norm} use {WEIGHTS_FOR_NORM[norm]}.")


def plan_restore(file_shapes: dict[str, tuple], model_shapes: dict[str, tuple], *, norm: str,
                 path: str) -> tuple[list[str], list[str]]:
    """``(names to restore, names in the file not loaded)``; raises :class:`WeightsError` when a
    backbone variable of the model is missing or misshapen in the file, or a backbone entry of the
    file has no variable in the model. ``file_shapes`` is keyed by op name (:func:`npz_shapes`)."""
    check_has_backbone(file_shapes, path=path)
    check_norm(file_shapes, norm=norm, path=path)
    model_backbone = {n: s for n, s in model_shapes.items() if BACKBONE_VARIABLE.match(n)}
    missing = sorted(n for n in model_backbone if n not in file_shapes)
    if missing:
        raise WeightsError(f"BACKBONE.WEIGHTS {path} has no {missing[0]!r}"
                           + (f" (nor {len(missing) - 1} more backbone variables)" if len(missing) > 1 else "")
                           + ": it is not a backbone of this model's depth and width "
                           "(BACKBONE.RESNET_NUM_BLOCKS, BACKBONE.WIDTH, BACKBONE.BLOCK)")
    for name, shape in sorted(model_backbone.items()):
        if tuple(file_shapes[name]) != tuple(shape):
            raise WeightsError(f"BACKBONE.WEIGHTS {path}: {name!r} has shape {tuple(file_shapes[name])} in the file "
                               f"but {tuple(shape)} in the model (BACKBONE.WIDTH / BACKBONE.BLOCK differ)")
    unused = sorted(n for n in file_shapes if BACKBONE_VARIABLE.match(n) and n not in model_backbone)
    if unused:
        raise WeightsError(f"BACKBONE.WEIGHTS {path} has {unused[0]!r}"
                           + (f" and {len(unused) - 1} more backbone entries" if len(unused) > 1 else "")
                           + " that this model has no variable for: a deeper ResNet? "
                           "(BACKBONE.RESNET_NUM_BLOCKS: [3, 4, 6, 3] = R50, [3, 4, 23, 3] = R101)")
    ignored = sorted(n for n in file_shapes if not BACKBONE_VARIABLE.match(n))
    return sorted(model_backbone), ignored


def variable_names(keys, *, path: str) -> dict[str, str]:
    """``{op name: key}`` for the keys of the weights file ``path``: ``conv0/W:0`` and ``conv0/W``
    both name variable ``conv0/W`` (a variable's value is output 0 of its op).

    Raises :class:`WeightsError` when two keys name one variable (which value is meant cannot be
    told; tensorpack's DictRestore would silently keep one) or a key names another output (``:1``),
    which no variable has."""
    names: dict[str, str] = {}
    for key in keys:
        name = key.removesuffix(":0")
        if ":" in name:
            raise WeightsError(f"{path}: {key!r} is not a variable's value (a variable's key is "
                               "'name' or 'name:0'): not a weights file written from variables")
        if name in names:
            raise WeightsError(f"{path} holds {name!r} twice, as {names[name]!r} and {key!r}: "
                               "which one is the variable's value is ambiguous; keep one of them")
        names[name] = key
    return names


def read_npz(path: str, names=None) -> dict[str, np.ndarray]:
    """The arrays of the weights file ``path`` by op name (only ``names`` when given)."""
    with np.load(path) as f:
        keys = variable_names(f.files, path=path)
        wanted = keys if names is None else {n: keys[n] for n in names}
        return {name: f[key] for name, key in wanted.items()}


def npz_shapes(path: str) -> dict[str, tuple]:
    """Each array's shape by op name, from its .npy header alone: the checks before training and
    before the session read no weights (a backbone file is ~100 MB, often on EFS); only the
    restore does."""
    import zipfile
    fmt = np.lib.format
    read_header = {(1, 0): fmt.read_array_header_1_0, (2, 0): fmt.read_array_header_2_0}
    shapes = {}
    with zipfile.ZipFile(path) as archive:
        for member in archive.namelist():
            with archive.open(member) as f:
                version = fmt.read_magic(f)
                if version in read_header:
                    shape = read_header[version](f)[0]
                else:  # a newer .npy format: read the array to learn its shape
                    with archive.open(member) as whole:
                        shape = fmt.read_array(whole).shape
            shapes[member[:-len(".npy")] if member.endswith(".npy") else member] = tuple(shape)
    return {name: shapes[key] for name, key in variable_names(shapes, path=path).items()}


def check_weights_file(path: str, cfg) -> None:
    """Before building anything: the file's backbone must be exactly the configured one."""
    b = cfg.BACKBONE
    expected = backbone_variable_shapes(num_blocks=b.RESNET_NUM_BLOCKS, width=b.WIDTH, block=b.BLOCK, norm=b.NORM)
    plan_restore(npz_shapes(path), expected, norm=b.NORM, path=path)


def strict_backbone_init(path: str, *, norm: str):
    """A tensorpack ``SessionInit`` that restores every backbone variable of the built graph from
    ``path`` (see :func:`plan_restore`), or raises :class:`WeightsError` before the session starts."""
    from tensorpack.tfutils.sessinit import SessionInit

    from training.compat import tf, tf1

    class StrictBackboneInit(SessionInit):
        def _setup_graph(self):
            variables = {v.op.name: v for v in tf1.global_variables()}
            names, ignored = plan_restore(npz_shapes(path), {n: tuple(v.shape) for n, v in variables.items()},
                                          norm=norm, path=path)
            self.restored, self.ignored = names, ignored
            self.model_backbone = sum(1 for n in variables if BACKBONE_VARIABLE.match(n))
            self._feeds = []
            self._assigns = []
            with tf.name_scope("backbone_weights"):
                for name in names:
                    var = variables[name]
                    value = tf1.placeholder(var.dtype.base_dtype, var.shape)
                    self._feeds.append((name, value))
                    self._assigns.append(tf1.assign(var, value))

        def _run_init(self, sess):
            values = read_npz(path, [name for name, _ in self._feeds])
            sess.run(self._assigns, {ph: values[name] for name, ph in self._feeds})
            print(f"restored {len(values)} of {self.model_backbone} backbone variables from {path}", flush=True)
            if self.ignored:
                print(f"not loaded from {path} (not backbone variables): {', '.join(self.ignored)}", flush=True)

    return StrictBackboneInit()
