"""The one config tree for training.

Every default lives here, in commented sections. A run's config is: these defaults, then
overrides (``KEY=VALUE`` strings whose values are parsed with ``ast.literal_eval``, never eval),
then ``finalize()``, which validates, derives values (rank count, steps per epoch, LR schedule)
and freezes the tree so that a typo'd key fails loudly instead of being silently ignored.
"""
from __future__ import annotations

import ast
import copy
from typing import Any, Iterable


class ConfigError(ValueError):
    """A configuration value or key is wrong; the message names it and what is allowed."""


class AttrDict:
    """A nested attribute dictionary that can be frozen.

    While unfrozen, reading a missing attribute creates a sub-tree (so defaults can be declared as
    ``_C.RPN.ANCHOR_STRIDE = 16``); once frozen, unknown keys raise ``ConfigError``.
    """

    _frozen = False

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if self._frozen:
            raise ConfigError(f"unknown config key {name!r}")
        child = AttrDict()
        object.__setattr__(self, name, child)
        return child

    def __setattr__(self, name: str, value: Any) -> None:
        if self._frozen and name not in self.__dict__:
            raise ConfigError(f"unknown config key {name!r}")
        if self._frozen and isinstance(self.__dict__[name], AttrDict):
            raise ConfigError(f"{name!r} is a config section, not a value")
        object.__setattr__(self, name, value)

    def to_dict(self) -> dict:
        return {k: v.to_dict() if isinstance(v, AttrDict) else copy.deepcopy(v)
                for k, v in self.__dict__.items() if not k.startswith("_")}

    def keys_flat(self, prefix: str = "") -> list[str]:
        out = []
        for k, v in self.__dict__.items():
            if k.startswith("_"):
                continue
            out += v.keys_flat(prefix + k + ".") if isinstance(v, AttrDict) else [prefix + k]
        return out

    def get(self, dotted: str) -> Any:
        node = self
        for part in dotted.split("."):
            if not isinstance(node, AttrDict) or part not in node.__dict__:
                raise ConfigError(f"unknown config key {dotted!r}")
            node = node.__dict__[part]
        return node

    def freeze(self, frozen: bool = True) -> None:
        object.__setattr__(self, "_frozen", frozen)
        for v in self.__dict__.values():
            if isinstance(v, AttrDict):
                v.freeze(frozen)

    def clone(self) -> "AttrDict":
        return copy.deepcopy(self)

    def __repr__(self) -> str:
        return "\n".join(f"{k} = {self.get(k)!r}" for k in self.keys_flat())

    def update_args(self, args: Iterable[str]) -> None:
        """Apply ``KEY=VALUE`` overrides; only existing keys may be set."""
        for arg in args:
            if "=" not in arg:
                raise ConfigError(f"config override {arg!r} is not of the form KEY=VALUE")
            key, raw = (s.strip() for s in arg.split("=", 1))
            self.set_value(key, raw)

    def set_value(self, key: str, raw: Any) -> None:
        """Set dotted ``key``; a string ``raw`` is parsed as a Python literal when it is one."""
        *parents, leaf = key.split(".")
        node = self
        for part in parents:
            child = node.__dict__.get(part)
            if not isinstance(child, AttrDict):
                raise ConfigError(f"unknown config key {key!r} (no section {part!r}); "
                                  f"known keys: see training/config.py")
            node = child
        if leaf not in node.__dict__ or isinstance(node.__dict__[leaf], AttrDict):
            raise ConfigError(f"unknown config key {key!r}; known keys: see training/config.py")
        old = node.__dict__[leaf]
        value = parse_value(raw, like=old, key=key)
        object.__setattr__(node, leaf, value)


def parse_value(raw: Any, *, like: Any, key: str) -> Any:
    """Parse a string as a literal of the same kind as the default ``like``.

    Strings that are not literals stay strings where the default is a string (``FreezeBN``);
    anything else that fails to parse is a ``ConfigError`` naming the key.
    """
    if not isinstance(raw, str):
        value = raw
    else:
        try:
            value = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            if isinstance(like, str) or like is None:
                return raw
            raise ConfigError(f"cannot parse {raw!r} for {key}: expected a value like {like!r}") from None
    if isinstance(like, bool):
        if isinstance(value, str) and value.lower() in ("true", "false"):
            value = value.lower() == "true"
        if not isinstance(value, bool):
            raise ConfigError(f"{key} must be True or False, got {raw!r}")
    elif isinstance(like, (int, float)) and not isinstance(like, bool):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key} must be a number like {like!r}, got {raw!r}")
        if isinstance(like, float):
            value = float(value)
    elif isinstance(like, (list, tuple)):
        if isinstance(value, str) and isinstance(like, (list, tuple)) and all(isinstance(x, str) for x in like):
            value = (value,)  # a single split name where a list of names is expected
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key} must be a list like {list(like)!r}, got {raw!r}")
        value = type(like)(value) if isinstance(like, tuple) else list(value)
    elif isinstance(like, str) and not isinstance(value, str):
        value = raw if isinstance(raw, str) else str(value)
    return value


config = AttrDict()
_C = config

# fmt: off
# ---------------------------------------------------------------------------------------------
# Model mode
_C.MODE_MASK = True           # False: Faster R-CNN (no mask head)
_C.MODE_FPN = True            # False: C4 head on res4 features

# ---------------------------------------------------------------------------------------------
# Dataset: COCO-format. DATA.BASEDIR holds annotations/instances_<split>.json and <split>/ images;
# a split named coco_train2017 resolves to train2017 (see training/data/coco.py).
_C.DATA.BASEDIR = "data/synthetic"
_C.DATA.TRAIN = ("coco_train2017",)
_C.DATA.VAL = ("coco_val2017",)
_C.DATA.NUM_CATEGORY = 0      # derived from the training annotations in finalize
_C.DATA.CLASS_NAMES = []      # derived: ["BG", ...category names]
_C.DATA.NUM_WORKERS = 2       # decode/augment threads per rank (threads, never forked processes)

# ---------------------------------------------------------------------------------------------
# Backbone
_C.BACKBONE.WEIGHTS = ""      # .npz with ImageNet-R50-AlignPadding.npz variable names; "" = from scratch
_C.BACKBONE.RESNET_NUM_BLOCKS = [3, 4, 6, 3]   # resnet50; resnet101 = [3, 4, 23, 3]
_C.BACKBONE.WIDTH = 64        # channels of the stem; 64 is standard ResNet, smaller for CPU runs
_C.BACKBONE.NORM = "FreezeBN" # FreezeBN, SyncBN, GN, None
_C.BACKBONE.FREEZE_AT = 2     # stages whose weights are frozen (0 = none); only with pretrained weights
_C.BACKBONE.DATA_FORMAT = "auto"  # NHWC, NCHW or auto (NCHW on GPU, NHWC on CPU: NCHW is ~440x slower on CPU)

# ---------------------------------------------------------------------------------------------
# Training schedule. Steps count global batches (all ranks together).
_C.TRAIN.NUM_GPUS = 0         # derived: Horovod size
_C.TRAIN.BATCH_SIZE_PER_GPU = 1
_C.TRAIN.SEED = 42
_C.TRAIN.WEIGHT_DECAY = 1e-4
_C.TRAIN.BASE_LR = 1e-2       # for a global batch of 8 images; scaled linearly with the global batch
_C.TRAIN.WARMUP = 1000        # steps of linear warmup (at global batch 8; scaled inversely)
_C.TRAIN.WARMUP_INIT_LR = 1e-5
_C.TRAIN.IMAGES_PER_EPOCH = 120000   # "epoch" = this many images (not a pass over the data)
_C.TRAIN.STEPS_PER_EPOCH = 0  # derived: IMAGES_PER_EPOCH / global batch
_C.TRAIN.LR_SCHEDULE = [240000, 320000, 360000]  # step boundaries at global batch 8; last = end
_C.TRAIN.LR_EPOCH_SCHEDULE = []  # [(epoch, lr_multiplier), ..., (last_epoch, None)]; overrides LR_SCHEDULE
_C.TRAIN.EVAL_PERIOD = 1      # epochs between COCO evaluations (0 = only at the end)
_C.TRAIN.CHECKPOINT_PERIOD = 1  # epochs between checkpoints
_C.TRAIN.GRADIENT_CLIP = 0.0  # global-norm clip; 0 = off (use ~1.5 for large global batches)
_C.TRAIN.LOAD_MODEL = ""      # checkpoint or .npz to start from (resume from LOGDIR wins)
_C.TRAIN.MIXED_PRECISION = False  # GPU only
_C.TRAIN.XLA = False              # GPU only

# ---------------------------------------------------------------------------------------------
# Preprocessing
_C.PREPROC.TRAIN_SHORT_EDGE_SIZE = [800, 800]   # [min, max] sampled per image
_C.PREPROC.TEST_SHORT_EDGE_SIZE = 800
_C.PREPROC.MAX_SIZE = 1333
_C.PREPROC.PIXEL_MEAN = [123.675, 116.28, 103.53]   # RGB
_C.PREPROC.PIXEL_STD = [58.395, 57.12, 57.375]
_C.PREPROC.HORIZONTAL_FLIP = True

# ---------------------------------------------------------------------------------------------
# Anchors and RPN
_C.RPN.ANCHOR_STRIDE = 16                       # C4 only
_C.RPN.ANCHOR_SIZES = (32, 64, 128, 256, 512)
_C.RPN.ANCHOR_RATIOS = (0.5, 1., 2.)
_C.RPN.POSITIVE_ANCHOR_THRESH = 0.7
_C.RPN.NEGATIVE_ANCHOR_THRESH = 0.3
_C.RPN.FG_RATIO = 0.5
_C.RPN.BATCH_PER_IM = 256
_C.RPN.MIN_SIZE = 0
_C.RPN.PROPOSAL_NMS_THRESH = 0.7
_C.RPN.CROWD_OVERLAP_THRESH = 9.99  # boxes overlapping crowd regions are ignored (>1: disabled)
_C.RPN.HEAD_DIM = 1024              # C4 only
_C.RPN.TRAIN_PRE_NMS_TOPK = 12000
_C.RPN.TRAIN_POST_NMS_TOPK = 2000
_C.RPN.TEST_PRE_NMS_TOPK = 6000
_C.RPN.TEST_POST_NMS_TOPK = 1000
_C.RPN.TRAIN_PER_LEVEL_NMS_TOPK = 2000  # FPN
_C.RPN.TEST_PER_LEVEL_NMS_TOPK = 1000   # FPN

# ---------------------------------------------------------------------------------------------
# Fast R-CNN box head
_C.FRCNN.BATCH_PER_IM = 512
_C.FRCNN.BBOX_REG_WEIGHTS = [10., 10., 5., 5.]
_C.FRCNN.FG_THRESH = 0.5
_C.FRCNN.FG_RATIO = 0.25

# ---------------------------------------------------------------------------------------------
# FPN
_C.FPN.ANCHOR_STRIDES = (4, 8, 16, 32, 64)
_C.FPN.PROPOSAL_MODE = "Level"      # Level or Joint
_C.FPN.NUM_CHANNEL = 256
_C.FPN.NORM = "None"                # None or GN
_C.FPN.FRCNN_HEAD_FUNC = "fastrcnn_2fc_head"
_C.FPN.FRCNN_CONV_HEAD_DIM = 256
_C.FPN.FRCNN_FC_HEAD_DIM = 1024
_C.FPN.MRCNN_HEAD_FUNC = "maskrcnn_up4conv_head"

# ---------------------------------------------------------------------------------------------
# Mask head
_C.MRCNN.HEAD_DIM = 256
_C.MRCNN.MASK_SIZE = 28             # output resolution of the mask head (14x14 ROIAlign, upsampled 2x)
_C.MRCNN.ACCURATE_PASTE = True

# ---------------------------------------------------------------------------------------------
# Inference
_C.TEST.FRCNN_NMS_THRESH = 0.5
_C.TEST.RESULT_SCORE_THRESH = 0.05
_C.TEST.RESULT_SCORE_THRESH_VIS = 0.5
_C.TEST.RESULTS_PER_IM = 100
# fmt: on

_C.freeze()

NORM_CHOICES = ("FreezeBN", "SyncBN", "GN", "None")


def new_config() -> AttrDict:
    """A fresh, unfrozen copy of the defaults."""
    cfg = config.clone()
    cfg.freeze(False)
    # Unknown keys are rejected even before finalize: only existing keys may be overridden.
    cfg.freeze()
    return cfg
