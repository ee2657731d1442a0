"""SageMaker hyperparameters -> ``KEY=VALUE`` overrides for training/config.py.

The names are those of the two hyperparameter tables (tensorpack's and aws-samples') of AWS's
SageMaker example notebook "Distributed Training of Mask-RCNN in Amazon SageMaker using EFS" (the
SageMaker EFS example).

SageMaker hands every hyperparameter over as a string (``"True"``, ``"[240000, 320000, 360000]"``,
``"[(16, 0.1), (20, 0.01), (24, None)]"``, ``"FreezeBN"``); a launcher may also pass numbers. Values
are parsed with ``ast.literal_eval`` (never ``eval``); a bare word that is not a literal stays a
string. Every override is checked against a fresh config tree here, so a wrong name or value stops
the job before training with a message naming the hyperparameter and what it accepts.

``HYPERPARAMETERS`` below is the table (name -> config key, meaning) that docs/data.md shows.
``config:KEY`` sets any config key directly, e.g. ``"config:TRAIN.GRADIENT_CLIP": "1.5"``.
Hyperparameters starting with ``sagemaker_`` are the SageMaker toolkit's own (entry point,
MPI settings) and are skipped.
"""
from __future__ import annotations

import ast
import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Any, Callable, Mapping

from training.config import NORM_CHOICES, ConfigError, new_config
from training.data import splits as split_entries

CONFIG_PREFIX = "config:"
SAGEMAKER_PREFIX = "sagemaker_"

RESNET_ARCHS = {"resnet50": [3, 4, 6, 3], "resnet101": [3, 4, 23, 3]}


def literal(raw: Any) -> Any:
    """A Python literal from a SageMaker string; bare words stay strings, true/false are booleans.

    A quoted string is unwrapped once more, because some SageMaker SDK paths JSON-encode every
    value: '"4"' is 4 and '"True"' is True, as "4" and "True" are.
    """
    if not isinstance(raw, str):
        return raw
    text = raw.strip()
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return text
    if isinstance(value, str) and text[:1] in ("'", '"'):
        return literal(value)
    return value


def _bool(name: str, raw: Any) -> bool:
    value = literal(raw)
    if not isinstance(value, bool):
        raise ConfigError(f"hyperparameter {name}={raw!r}: expected True or False")
    return value


def _int(minimum: int) -> Callable[[str, Any], int]:
    def parse(name: str, raw: Any) -> int:
        value = literal(raw)
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ConfigError(f"hyperparameter {name}={raw!r}: expected an integer >= {minimum}")
        return value
    return parse


def _lr_schedule(name: str, raw: Any) -> list[int] | str:
    text = str(raw).strip().strip("'\"")
    if re.fullmatch(r"[1-9][0-9]*x", text):   # a schedule name ("1x", "2x", ...), expanded by finalize
        return text
    value = literal(raw)
    if (not isinstance(value, (list, tuple)) or not value
            or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)
            or list(value) != sorted(set(value))):
        raise ConfigError(f"hyperparameter {name}={raw!r}: expected increasing step counts such as "
                          f"'[240000, 320000, 360000]' (LR drops 10x at each but the last, which ends training) or a name "
                          f"such as '1x' or '2x'")
    return list(value)


def _lr_epoch_schedule(name: str, raw: Any) -> list[tuple]:
    value = literal(raw)
    problem = None
    if not isinstance(value, (list, tuple)) or not value:
        problem = "not a non-empty list"
    else:
        epochs = []
        for i, item in enumerate(value):
            if not isinstance(item, (list, tuple)) or len(item) != 2:
                problem = f"item {i} is not an (epoch, multiplier) pair"
                break
            epoch, mult = item
            last = i == len(value) - 1
            if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch <= 0:
                problem = f"epoch {epoch!r} is not a positive integer"
            elif last and mult is not None:
                problem = "the last pair must be (final_epoch, None)"
            elif not last and (isinstance(mult, bool) or not isinstance(mult, (int, float)) or mult <= 0):
                problem = f"multiplier {mult!r} is not a positive number"
            if problem:
                break
            epochs.append(epoch)
        if not problem and epochs != sorted(set(epochs)):
            problem = "epochs are not increasing"
    if problem:
        raise ConfigError(f"hyperparameter {name}={raw!r}: {problem}; expected e.g. "
                          f"'[(16, 0.1), (20, 0.01), (24, None)]' (at epoch 16 the LR becomes 0.1x, "
                          f"at 20 0.01x, training ends at 24)")
    return [(e, None if m is None else float(m)) for e, m in value]


def _choice(choices) -> Callable[[str, Any], str]:
    def parse(name: str, raw: Any) -> str:
        # No literal_eval for the bare word: "None" is a choice here, not Python's None.
        value = raw.strip() if isinstance(raw, str) else raw
        if isinstance(value, str) and len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        if value not in choices:
            raise ConfigError(f"hyperparameter {name}={raw!r}: must be one of {', '.join(choices)}")
        return value
    return parse


def _resnet_arch(name: str, raw: Any) -> list[int]:
    return RESNET_ARCHS[_choice(tuple(RESNET_ARCHS))(name, raw)]


def _splits(*, allow_none: bool) -> Callable[[str, Any], tuple[str, ...]]:
    """One split entry or a list of them; with ``allow_none`` also ``[]`` (no split). An entry is a
    split name or ``<annotation file>:<image folder>`` (training/data/splits.py); relative paths are
    under the data directory, which on SageMaker is the train channel."""
    def parse(name: str, raw: Any) -> tuple[str, ...]:
        value = literal(raw)
        if isinstance(value, str):
            value = (value,)
        if (not isinstance(value, (list, tuple)) or not (value or allow_none)
                or not all(isinstance(v, str) and v.strip() for v in value)):
            raise ConfigError(f"hyperparameter {name}={raw!r}: expected a split name such as 'coco_train2017', "
                              f"an entry '<annotation file>:<image folder>' such as "
                              f"'{split_entries.EXAMPLE}', or a list of them" + (" ([] for none)" if allow_none else ""))
        value = tuple(v.strip() for v in value)
        for entry in value:
            problem = split_entries.problem(entry)
            if problem:
                raise ConfigError(f"hyperparameter {name}={raw!r}: {problem}")
        return value
    return parse


def _path(name: str, raw: Any) -> str:
    value = literal(raw)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ConfigError(f"hyperparameter {name}={raw!r}: expected a file name or path")
    return value.strip()


@dataclasses.dataclass(frozen=True)
class Hyperparameter:
    name: str
    key: str             # the config key it sets
    parse: Callable[[str, Any], Any]
    meaning: str         # as in the SageMaker EFS example's tables


HYPERPARAMETERS = {h.name: h for h in (
    Hyperparameter("mode_fpn", "MODE_FPN", _bool,
                   "use a Feature Pyramid Network in the backbone (\"True\"/\"False\")"),
    Hyperparameter("mode_mask", "MODE_MASK", _bool,
                   "\"True\": Mask R-CNN; \"False\": Faster R-CNN (no mask head)"),
    Hyperparameter("eval_period", "TRAIN.EVAL_PERIOD", _int(0),
                   "epochs between COCO evaluations during training (0: only at the end)"),
    Hyperparameter("lr_schedule", "TRAIN.LR_SCHEDULE", _lr_schedule,
                   "learning-rate schedule in training steps at global batch 8, e.g. [240000, 320000, 360000], "
                   "or a name: 1x = [120000, 160000, 180000], 2x = [240000, 320000, 360000] (the default)"),
    Hyperparameter("lr_epoch_schedule", "TRAIN.LR_EPOCH_SCHEDULE", _lr_epoch_schedule,
                   "learning-rate schedule in epochs, e.g. [(16, 0.1), (20, 0.01), (24, None)]; "
                   "overrides lr_schedule"),
    Hyperparameter("batch_norm", "BACKBONE.NORM", _choice(NORM_CHOICES),
                   "backbone normalisation: " + ", ".join(NORM_CHOICES)),
    Hyperparameter("images_per_epoch", "TRAIN.IMAGES_PER_EPOCH", _int(1),
                   "images per epoch"),
    Hyperparameter("data_train", "DATA.TRAIN", _splits(allow_none=False),
                   "training split(s) under the data directory, e.g. coco_train2017, or "
                   "<annotation file>:<image folder> relative to it, e.g. labels/train.json:photos/train"),
    Hyperparameter("data_val", "DATA.VAL", _splits(allow_none=True),
                   "validation split(s) under the data directory, e.g. coco_val2017 or "
                   "labels/val.json:photos/val; [] trains without evaluating"),
    Hyperparameter("resnet_arch", "BACKBONE.RESNET_NUM_BLOCKS", _resnet_arch,
                   "resnet50 or resnet101"),
    Hyperparameter("backbone_weights", "BACKBONE.WEIGHTS", _path,
                   "ResNet backbone weights (.npz), e.g. ImageNet-R50-AlignPadding.npz; a relative "
                   "name is looked up in the data directory"),
    Hyperparameter("load_model", "TRAIN.LOAD_MODEL", _path,
                   "whole model (checkpoint or .npz, e.g. COCO-R50FPN-MaskRCNN-Standard.npz) to fine-tune from at "
                   "step 0, restored strictly, its class layers re-initialised for another class count; leave "
                   "backbone_weights empty; a relative name is looked up in the data directory"),
    Hyperparameter("batch_size_per_gpu", "TRAIN.BATCH_SIZE_PER_GPU", _int(1),
                   "images per GPU (or per process on CPU) and step"),
)}

# Named hyperparameters whose checks also apply to config:KEY; resnet_arch is left out because
# config:BACKBONE.RESNET_NUM_BLOCKS may give any depths (small ones for CPU runs).
_BY_KEY = {h.key: h for h in HYPERPARAMETERS.values() if h.name != "resnet_arch"}

# Hyperparameters whose value names a file that the caller resolves with resolve_data_file().
FILE_HYPERPARAMETERS = ("backbone_weights", "load_model")


def to_overrides(hyperparameters: Mapping[str, Any]) -> list[str]:
    """``KEY=VALUE`` overrides (for ``AttrDict.update_args``) from SageMaker hyperparameters.

    Raises ``ConfigError`` naming the hyperparameter for an unknown name, an unknown config key,
    a value that does not parse, or two hyperparameters that set the same key.
    """
    check = new_config()
    overrides, set_by = [], {}
    for name in sorted(hyperparameters):
        raw = hyperparameters[name]
        if name.startswith(SAGEMAKER_PREFIX):
            continue
        if name.startswith(CONFIG_PREFIX):
            key = name[len(CONFIG_PREFIX):].strip()
            if not key:
                raise ConfigError(f"hyperparameter {name!r}: give a config key after 'config:', "
                                  f"e.g. config:TRAIN.BASE_LR")
            # A key that a named hyperparameter also sets gets that one's checks (NORM choices, ...).
            named = _BY_KEY.get(key)
            value = named.parse(name, raw) if named else literal(raw)
        elif name in HYPERPARAMETERS:
            spec = HYPERPARAMETERS[name]
            key, value = spec.key, spec.parse(name, raw)
        else:
            raise ConfigError(f"unknown hyperparameter {name!r}; known: {', '.join(HYPERPARAMETERS)}, "
                              f"or config:<KEY> for any key of training/config.py")
        if key in set_by:
            raise ConfigError(f"hyperparameters {set_by[key]!r} and {name!r} both set {key}; keep one")
        set_by[key] = name
        override = f"{key}={value!r}"
        try:
            check.update_args([override])
        except ConfigError as err:
            raise ConfigError(f"hyperparameter {name}={raw!r}: {err}") from None
        overrides.append(override)
    return overrides


def load_hyperparameters_json(path: str | os.PathLike) -> dict[str, Any]:
    """Read SageMaker's hyperparameters.json (/opt/ml/input/config/hyperparameters.json)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"hyperparameters file {path} does not exist") from None
    except json.JSONDecodeError as err:
        raise ConfigError(f"hyperparameters file {path} is not JSON: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"hyperparameters file {path} must hold a JSON object, got {type(data).__name__}")
    return data


def resolve_data_file(value: str, data_dir: str | os.PathLike) -> str:
    """A file named by backbone_weights/load_model: absolute paths as given, names under ``data_dir``.

    "" stays "" (no file). Existence is not checked here: the trainer reports a missing file.
    """
    if not value:
        return ""
    path = Path(value).expanduser()
    return str(path if path.is_absolute() else Path(data_dir) / path)
