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

A whole detector, such as tensorpack's COCO-trained ``COCO-R50FPN-MaskRCNN-Standard.npz``, is a
model file (``TRAIN.LOAD_MODEL``), restored by :func:`plan_finetune` with the same strictness over
every variable of the model: each must be in the file with its shape, and each entry of an
``.npz`` must be used. Only the layers whose shape follows the class count (:data:`CLASS_SPECIFIC`)
are re-initialised, when the file was trained for another number of categories.

The files' keys are tensor names (``conv0/W:0``: tensorpack's ``dump_session_params`` and
``dump-model-params.py`` write ``Variable.name``) or, from some converters, op names (``conv0/W``).
:func:`variable_names` maps both to the op name once, when a file is read; everything after it
(the checks, the restore, fine-tuning in train.py) works with op names.
"""
from __future__ import annotations

import dataclasses
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


# The scopes of a detector's layers after the backbone (tensorpack's names and this model's).
HEAD_SCOPES = ("fpn", "rpn", "fastrcnn", "maskrcnn")
# The layers whose shape follows the class count: tensorpack's fastrcnn_outputs (FPN models put it
# under fastrcnn/outputs/, C4 models under fastrcnn/) and the mask predictor maskrcnn/conv.
CLASS_SPECIFIC = re.compile(r"^(fastrcnn/(outputs/)?(class|box)|maskrcnn/conv)/(W|b)$")
# Their class logits' bias: categories + 1 (the background) entries.
CLASS_LOGITS_BIAS = ("fastrcnn/outputs/class/b", "fastrcnn/class/b")
# Entries of a model file that are no model variable and are never restored: fine-tuning starts at
# step 0 (dump-model-params.py without --meta keeps global_step:0).
NOT_RESTORED = ("global_step",)
# Config keys that decide a shape in each part of the model: what to set when a shape differs.
SHAPE_KEYS = {
    "fpn": "FPN.NUM_CHANNEL, FPN.NORM",
    "rpn": "FPN.NUM_CHANNEL (RPN.HEAD_DIM for C4), RPN.ANCHOR_RATIOS, RPN.ANCHOR_SIZES",
    "fastrcnn": "FPN.FRCNN_HEAD_FUNC, FPN.FRCNN_FC_HEAD_DIM, FPN.FRCNN_CONV_HEAD_DIM, FRCNN.POOLED_SIZE",
    "maskrcnn": "FPN.MRCNN_HEAD_FUNC, MRCNN.HEAD_DIM, MRCNN.NUM_CONV",
}
BACKBONE_SHAPE_KEYS = "BACKBONE.RESNET_NUM_BLOCKS, BACKBONE.WIDTH, BACKBONE.BLOCK, BACKBONE.NORM"
ARCHITECTURE_KEYS = ("MODE_FPN, MODE_MASK, BACKBONE.RESNET_NUM_BLOCKS, BACKBONE.NORM, FPN.NORM, FPN.FRCNN_HEAD_FUNC, "
                     "FPN.MRCNN_HEAD_FUNC, MRCNN.NUM_CONV")
FITS_DEFAULTS = "tensorpack's COCO-R50FPN-MaskRCNN-Standard.npz fits the defaults: R50-FPN, FreezeBN, mask head"


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


def check_norm(names, *, norm: str, path: str, key: str = "BACKBONE.WEIGHTS") -> None:
    """Refuse weights whose normalisation the configured ``BACKBONE.NORM`` cannot use."""
    kind = norm_kind(n for n in names if BACKBONE_VARIABLE.match(n))
    if norm not in NORMS_FOR_KIND[kind]:
        fits = " or ".join(NORMS_FOR_KIND[kind])
        raise WeightsError(
            f"{key} {path} holds a backbone trained with {kind}, which fits BACKBONE.NORM={fits}, "
            f"not BACKBONE.NORM={norm}: it would drop or misuse its normalisation parameters and train a damaged "
            f"network. Set BACKBONE.NORM={NORMS_FOR_KIND[kind][0]}, or for {norm} use {WEIGHTS_FOR_NORM[norm]}.")


def plan_restore(file_shapes: dict[str, tuple], model_shapes: dict[str, tuple], *, norm: str,
                 path: str) -> tuple[list[str], list[str]]:
    """``(names to restore, names in the file not loaded)``; raises :class:`WeightsError` when a
    backbone variable of the model is missing or misshapen in the file, or a backbone entry of the
    file has no variable in the model. ``file_shapes`` is keyed by op name (:func:`npz_shapes`)."""
    check_has_backbone(file_shapes, path=path)
    heads = sorted(n for n in file_shapes if n.split("/")[0] in HEAD_SCOPES)
    if heads:  # restoring its backbone alone would throw its trained heads away without a word
        raise WeightsError(f"BACKBONE.WEIGHTS {path} is a whole detector ({heads[0]!r} and {len(heads) - 1} more head "
                           f"variables), not backbone weights: to fine-tune from it set TRAIN.LOAD_MODEL={path} "
                           f"and BACKBONE.WEIGHTS=''")
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


def _fed_assigns(variables: dict, names, scope: str) -> tuple[list, list]:
    """For each name, a placeholder and the op that assigns its value to the variable: the file's
    values are fed at session start, not baked into the graph as constants. Returns
    ``([(name, placeholder)], [assign op])``."""
    from training.compat import tf, tf1
    feeds, assigns = [], []
    with tf.name_scope(scope):
        for name in names:
            var = variables[name]
            value = tf1.placeholder(var.dtype.base_dtype, var.shape)
            feeds.append((name, value))
            assigns.append(tf1.assign(var, value))
    return feeds, assigns


def strict_backbone_init(path: str, *, norm: str):
    """A tensorpack ``SessionInit`` that restores every backbone variable of the built graph from
    ``path`` (see :func:`plan_restore`), or raises :class:`WeightsError` before the session starts."""
    from tensorpack.tfutils.sessinit import SessionInit

    from training.compat import tf1

    class StrictBackboneInit(SessionInit):
        def _setup_graph(self):
            variables = {v.op.name: v for v in tf1.global_variables()}
            names, ignored = plan_restore(npz_shapes(path), {n: tuple(v.shape) for n, v in variables.items()},
                                          norm=norm, path=path)
            self.restored, self.ignored = names, ignored
            self.model_backbone = sum(1 for n in variables if BACKBONE_VARIABLE.match(n))
            self._feeds, self._assigns = _fed_assigns(variables, names, "backbone_weights")

        def _run_init(self, sess):
            values = read_npz(path, [name for name, _ in self._feeds])
            sess.run(self._assigns, {ph: values[name] for name, ph in self._feeds})
            print(f"restored {len(values)} of {self.model_backbone} backbone variables from {path}", flush=True)
            if self.ignored:
                print(f"not loaded from {path} (not backbone variables): {', '.join(self.ignored)}", flush=True)

    return StrictBackboneInit()


# ------------------------------------------------------------------ fine-tuning from a whole model
def is_model_variable(name: str, trainable: bool) -> bool:
    """Whether a graph variable is part of the model (what a weights file holds): the trainable
    ones and the backbone's others (frozen stages, BatchNorm statistics); not the global step,
    optimizer slots or summaries' moving averages."""
    return trainable or bool(BACKBONE_VARIABLE.match(name))


def num_categories(shapes: dict[str, tuple]) -> int | None:
    """Categories (background excluded) that a set of variables classifies, from the class
    logits' bias; None when it has none."""
    for name in CLASS_LOGITS_BIAS:
        if name in shapes:
            return int(shapes[name][0]) - 1
    return None


@dataclasses.dataclass(frozen=True)
class FinetunePlan:
    restore: list[str]      # restored from the file
    reinit: list[str]       # class-specific, left as initialised: the file has another class count
    file_categories: int | None
    model_categories: int | None

    def summary(self) -> str:
        return (f"restored {len(self.restore)} of {len(self.restore) + len(self.reinit)} variables; "
                f"re-initialised {len(self.reinit)} class-specific ones")


def plan_finetune(file_shapes: dict[str, tuple], model_shapes: dict[str, tuple], *, path: str,
                  every_entry_is_a_variable: bool, key: str = "TRAIN.LOAD_MODEL") -> FinetunePlan:
    """Which model variables the model file ``path`` restores, or :class:`WeightsError`.

    ``file_shapes``: the file's entries by op name; ``model_shapes``: the model's variables
    (:func:`is_model_variable`). Every model variable must be in the file with its shape, except
    the :data:`CLASS_SPECIFIC` ones when the file classifies another number of categories (then
    only their class axis may differ, and they keep their initial values). With
    ``every_entry_is_a_variable`` (an ``.npz``: it holds model variables only) every entry of the
    file must be used too; a checkpoint also holds optimizer state, which is not."""
    file_shapes = {n: tuple(s) for n, s in file_shapes.items() if n not in NOT_RESTORED}
    file_categories, model_categories = num_categories(file_shapes), num_categories(model_shapes)
    other_classes = None not in (file_categories, model_categories) and file_categories != model_categories
    missing = sorted(n for n in model_shapes if n not in file_shapes)
    if missing:
        raise WeightsError(f"{key} {path} has no {missing[0]!r}"
                           + (f" (nor {len(missing) - 1} more variables of this model)" if len(missing) > 1 else "")
                           + f": it is not a model of this architecture; set {ARCHITECTURE_KEYS} as the file was "
                           f"trained; {FITS_DEFAULTS}")
    restore, reinit = [], []
    for name, shape in sorted(model_shapes.items()):
        shape, in_file = tuple(shape), file_shapes[name]
        if other_classes and CLASS_SPECIFIC.match(name) and in_file[:-1] == shape[:-1]:
            reinit.append(name)   # only the class axis (the last) differs
            continue
        if in_file != shape:
            scope = name.split("/")[0]
            keys = SHAPE_KEYS.get(scope, BACKBONE_SHAPE_KEYS)
            raise WeightsError(f"{key} {path}: {name!r} has shape {in_file} in the file but {shape} in the model: set "
                               f"{keys} as the file was trained; {FITS_DEFAULTS}")
        restore.append(name)
    unused = sorted(n for n in file_shapes if n not in model_shapes)
    if every_entry_is_a_variable and unused:
        raise WeightsError(f"{key} {path} has {unused[0]!r}"
                           + (f" and {len(unused) - 1} more entries" if len(unused) > 1 else "")
                           + f" that this model has no variable for, and would drop them: set {ARCHITECTURE_KEYS} "
                           f"as the file was trained; {FITS_DEFAULTS}")
    return FinetunePlan(restore, reinit, file_categories, model_categories)


def model_file_shapes(path: str) -> dict[str, tuple]:
    """Shapes by op name of an ``.npz`` (its .npy headers) or a checkpoint (its index)."""
    if path.endswith(".npz"):
        return npz_shapes(path)
    from training.compat import tf
    return {name: tuple(shape) for name, shape in tf.train.list_variables(path)}


def read_model_file(path: str, names) -> dict[str, np.ndarray]:
    if path.endswith(".npz"):
        return read_npz(path, names)
    from training.compat import tf
    reader = tf.train.load_checkpoint(path)
    return {name: reader.get_tensor(name) for name in names}


def model_variable_shapes(cfg) -> dict[str, tuple]:
    """Names and shapes of the model variables (:func:`is_model_variable`) that ``MaskRCNN(cfg)``
    builds, from the finalized config alone: the check before training compares a model file
    with them before any graph exists. tests/training/test_finetune.py holds them equal to the
    built graph's."""
    b, fpn = cfg.BACKBONE, cfg.FPN
    out = backbone_variable_shapes(num_blocks=b.RESNET_NUM_BLOCKS, width=b.WIDTH, block=b.BLOCK, norm=b.NORM)
    mult = 4 if b.BLOCK == "bottleneck" else 1
    stage_channels = [b.WIDTH * 2 ** s * mult for s in range(4)]
    categories = cfg.DATA.NUM_CATEGORY
    ratios = len(cfg.RPN.ANCHOR_RATIOS)

    def conv(name, k, cin, cout, *, norm="None"):
        out[f"{name}/W"] = (k, k, cin, cout)
        if norm == "GN":
            out.update({f"{name}/gn/gamma": (cout,), f"{name}/gn/beta": (cout,)})
        else:
            out[f"{name}/b"] = (cout,)

    def fc(name, cin, cout):
        out.update({f"{name}/W": (cin, cout), f"{name}/b": (cout,)})

    if cfg.MODE_FPN:
        c = fpn.NUM_CHANNEL
        for i, cin in enumerate(stage_channels):
            conv(f"fpn/lateral_1x1_c{i + 2}", 1, cin, c, norm=fpn.NORM)
        for i in range(4):
            conv(f"fpn/posthoc_3x3_p{i + 2}", 3, c, c, norm=fpn.NORM)
        conv("rpn/conv0", 3, c, c)
        conv("rpn/class", 1, c, ratios)
        conv("rpn/box", 1, c, 4 * ratios)
        pooled = cfg.FRCNN.POOLED_SIZE ** 2
        if fpn.FRCNN_HEAD_FUNC == "fastrcnn_2fc_head":
            fc("fastrcnn/fc6", c * pooled, fpn.FRCNN_FC_HEAD_DIM)
            fc("fastrcnn/fc7", fpn.FRCNN_FC_HEAD_DIM, fpn.FRCNN_FC_HEAD_DIM)
        else:
            cin = c
            for i in range(4):
                conv(f"fastrcnn/conv{i}", 3, cin, fpn.FRCNN_CONV_HEAD_DIM,
                     norm="GN" if fpn.FRCNN_HEAD_FUNC.endswith("gn_head") else "None")
                cin = fpn.FRCNN_CONV_HEAD_DIM
            fc("fastrcnn/fc", cin * pooled, fpn.FRCNN_FC_HEAD_DIM)
        fc("fastrcnn/outputs/class", fpn.FRCNN_FC_HEAD_DIM, categories + 1)
        fc("fastrcnn/outputs/box", fpn.FRCNN_FC_HEAD_DIM, (categories + 1) * 4)
        if cfg.MODE_MASK:
            cin = c
            for i in range(cfg.MRCNN.NUM_CONV):
                conv(f"maskrcnn/fcn{i}", 3, cin, cfg.MRCNN.HEAD_DIM,
                     norm="GN" if fpn.MRCNN_HEAD_FUNC.endswith("gn_head") else "None")
                cin = cfg.MRCNN.HEAD_DIM
            out.update({"maskrcnn/deconv/W": (2, 2, cfg.MRCNN.HEAD_DIM, cin), "maskrcnn/deconv/b": (cfg.MRCNN.HEAD_DIM,)})
            conv("maskrcnn/conv", 1, cfg.MRCNN.HEAD_DIM, categories)
    else:  # C4: the RPN on res4, res5 (group3) as the box head
        conv("rpn/conv0", 3, stage_channels[2], cfg.RPN.HEAD_DIM)
        anchors = len(cfg.RPN.ANCHOR_SIZES) * ratios
        conv("rpn/class", 1, cfg.RPN.HEAD_DIM, anchors)
        conv("rpn/box", 1, cfg.RPN.HEAD_DIM, 4 * anchors)
        fc("fastrcnn/class", stage_channels[3], categories + 1)
        fc("fastrcnn/box", stage_channels[3], (categories + 1) * 4)
        if cfg.MODE_MASK:
            out.update({"maskrcnn/deconv/W": (2, 2, cfg.MRCNN.HEAD_DIM, stage_channels[3]),
                        "maskrcnn/deconv/b": (cfg.MRCNN.HEAD_DIM,)})
            conv("maskrcnn/conv", 1, cfg.MRCNN.HEAD_DIM, categories)
    return out


def check_model_file(path: str, cfg, *, key: str = "TRAIN.LOAD_MODEL") -> FinetunePlan:
    """Before building anything: the model file ``path`` (``key``: TRAIN.LOAD_MODEL, or the
    model given to predict or export) restores every variable of the configured model (see
    :func:`plan_finetune`)."""
    shapes = model_file_shapes(path)
    if any(BACKBONE_VARIABLE.match(n) for n in shapes):
        check_norm(shapes, norm=cfg.BACKBONE.NORM, path=path, key=key)
    return plan_finetune(shapes, model_variable_shapes(cfg), path=path, every_entry_is_a_variable=path.endswith(".npz"),
                         key=key)


def strict_finetune_init(path: str):
    """A tensorpack ``SessionInit`` that restores every model variable of the built graph from the
    model file ``path`` (see :func:`plan_finetune`; the class-specific layers of another class
    count keep their initial values), or raises :class:`WeightsError` before the session starts."""
    from tensorpack.tfutils.sessinit import SessionInit

    from training.compat import tf1

    class StrictFinetuneInit(SessionInit):
        def _setup_graph(self):
            trainable = {v.op.name for v in tf1.trainable_variables()}
            variables = {v.op.name: v for v in tf1.global_variables() if is_model_variable(v.op.name, v.op.name in trainable)}
            self.plan = plan_finetune(model_file_shapes(path), {n: tuple(v.shape) for n, v in variables.items()},
                                      path=path, every_entry_is_a_variable=path.endswith(".npz"))
            self._feeds, self._assigns = _fed_assigns(variables, self.plan.restore, "model_weights")

        def _run_init(self, sess):
            values = read_model_file(path, [name for name, _ in self._feeds])
            sess.run(self._assigns, {ph: values[name] for name, ph in self._feeds})
            print(self.plan.summary(), flush=True)
            if self.plan.reinit:
                print(f"the file classifies {self.plan.file_categories} categories, this model "
                      f"{self.plan.model_categories}: re-initialised {', '.join(self.plan.reinit)}", flush=True)

    return StrictFinetuneInit()


def from_scratch_warning(cfg) -> str | None:
    """A warning for a full-size run with neither backbone nor model weights, else None.

    A standard ResNet on COCO-size images from random weights needs a far longer schedule than
    the defaults (tensorpack's from-scratch R101-FPN model trained 9x, with GroupNorm throughout),
    and FreezeBN freezes statistics that were never learned: such a run is usually a forgotten
    setting, not a plan. Small CPU configs (narrow or basic-block nets, small images) train from
    scratch by design."""
    if cfg.BACKBONE.WEIGHTS or cfg.TRAIN.LOAD_MODEL:
        return None
    if cfg.BACKBONE.BLOCK != "bottleneck" or cfg.BACKBONE.WIDTH < 64 or max(cfg.PREPROC.TRAIN_SHORT_EDGE_SIZE) < 512:
        return None
    return ("warning: neither BACKBONE.WEIGHTS nor TRAIN.LOAD_MODEL is set: this full-size ResNet trains from "
            "scratch, which needs a much longer schedule than LR_SCHEDULE "
            f"{cfg.TRAIN.LR_SCHEDULE} (tensorpack's from-scratch model trained 9x with BACKBONE.NORM=GN and FPN.NORM=GN; "
            "FreezeBN freezes statistics that were never learned). Set BACKBONE.WEIGHTS=ImageNet-R50-AlignPadding.npz "
            "or TRAIN.LOAD_MODEL=COCO-R50FPN-MaskRCNN-Standard.npz (docs/training.md)")
