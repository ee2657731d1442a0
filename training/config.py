"""The one config tree for training.

Every default lives here, in commented sections. A run's config is: these defaults, then
overrides (``KEY=VALUE`` strings whose values are parsed with ``ast.literal_eval``, never eval),
then ``finalize()``, which validates, derives values (rank count, steps per epoch, LR schedule)
and freezes the tree so that a typo'd key fails loudly instead of being silently ignored.
"""
from __future__ import annotations

import ast
import copy
import math
from typing import Any, Iterable

from training.data import splits as split_entries


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


def _names(like: Any) -> bool:
    return isinstance(like, (list, tuple)) and bool(like) and all(isinstance(x, str) for x in like)


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
            if _names(like) and not raw.strip().startswith(("(", "[", "'", '"')):
                # One bare split name or entry (DATA.TRAIN=labels/train.json:photos/train): what a
                # shell leaves of an unquoted value.
                return (raw.strip(),) if isinstance(like, tuple) else [raw.strip()]
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
    elif isinstance(like, str) and key in NAME_OR_LIST_KEYS and isinstance(value, (list, tuple)):
        value = list(value)
    elif isinstance(like, str) and not isinstance(value, str):
        value = raw if isinstance(raw, str) else str(value)
    return value


# Keys whose value is a name or a list (finalize expands the name): "2x" or [240000, 320000, 360000].
NAME_OR_LIST_KEYS = frozenset({"TRAIN.LR_SCHEDULE"})


config = AttrDict()
_C = config

# fmt: off
# ---------------------------------------------------------------------------------------------
# Model mode
_C.MODE_MASK = True           # False: Faster R-CNN (no mask head)
_C.MODE_FPN = True            # False: C4 head on res4 features

# ---------------------------------------------------------------------------------------------
# Dataset: COCO-format. A split entry is a name (DATA.BASEDIR holds annotations/instances_<split>.json
# and <split>/ images; coco_train2017 resolves to train2017) or '<annotation file>:<image folder>',
# paths relative to DATA.BASEDIR or absolute, e.g. 'labels/train.json:photos/train' (training/data/splits.py).
_C.DATA.BASEDIR = "data/synthetic"
_C.DATA.TRAIN = ("coco_train2017",)
_C.DATA.VAL = ("coco_val2017",)    # evaluated during training (first split); () = train without evaluating
_C.DATA.NUM_CATEGORY = 0      # derived from the training annotations in finalize
_C.DATA.CLASS_NAMES = []      # derived: ["BG", ...category names]
_C.DATA.NUM_WORKERS = 2       # input worker processes per rank (fresh interpreters, no TF); 0: in the trainer
_C.DATA.QUEUE_BATCHES = 3     # prepared batches queued per rank (host RAM: docs/training.md; 50 held ~4 GB)
# With several images per rank, landscape and portrait images go in separate batches (detectron2's
# default): a mixed batch pads every image to the long side both ways (docs/training.md)
_C.DATA.ASPECT_RATIO_GROUPING = True

# ---------------------------------------------------------------------------------------------
# Backbone
_C.BACKBONE.WEIGHTS = ""      # .npz with ImageNet-R50-AlignPadding.npz variable names; "" = none
_C.BACKBONE.RESNET_NUM_BLOCKS = [3, 4, 6, 3]   # resnet50; resnet101 = [3, 4, 23, 3]
_C.BACKBONE.WIDTH = 64        # channels of the stem; 64 is standard ResNet, smaller for CPU runs
_C.BACKBONE.BLOCK = "bottleneck"  # bottleneck (ResNet-50/101) or basic (two 3x3 convs; tiny CPU nets)
_C.BACKBONE.GN_GROUPS = 32    # GroupNorm groups (capped at the channel count for narrow nets)
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
_C.TRAIN.WARMUP = 1000        # steps of linear warmup, at any global batch (large batches need all of it)
_C.TRAIN.WARMUP_INIT_LR = 1e-5
_C.TRAIN.IMAGES_PER_EPOCH = 120000   # "epoch" = this many images (not a pass over the data)
_C.TRAIN.STEPS_PER_EPOCH = 0  # derived: IMAGES_PER_EPOCH / global batch
# Steps at global batch 8 where the LR drops 10x, the last ending training: a list, or one of
# tensorpack's (Detectron's) names: "1x" = [120000, 160000, 180000] (~12 COCO epochs),
# "Nx" (N >= 2) = [180N - 120, 180N - 40, 180N] thousand. The default is "2x" = [240000, 320000, 360000].
_C.TRAIN.LR_SCHEDULE = "2x"
_C.TRAIN.LR_EPOCH_SCHEDULE = []  # [(epoch, lr_multiplier), ..., (last_epoch, None)]; overrides LR_SCHEDULE
# > 0: a schedule sized to the training data, for fine-tuning (the finetune preset: 8): an epoch is one
# pass over the training images, this many passes, LR x0.1 for the last eighth, warmup at most one pass;
# sets IMAGES_PER_EPOCH, LR_EPOCH_SCHEDULE and WARMUP in finalize (training/schedule.py)
_C.TRAIN.DATASET_PASSES = 0
_C.TRAIN.EVAL_PERIOD = 1      # epochs between COCO evaluations (0 = only at the end)
_C.TRAIN.CHECKPOINT_PERIOD = 1  # epochs between checkpoints
_C.TRAIN.CHECKPOINT_MINUTES = 30  # also a checkpoint once this many minutes passed since the last one (0 = off)
_C.TRAIN.GRADIENT_CLIP = 0.0  # global-norm clip; 0 = off (use ~1.5 for large global batches)
# A whole trained model to start from at step 0 (fine-tuning), e.g. tensorpack's
# COCO-R50FPN-MaskRCNN-Standard.npz or a checkpoint; restored strictly, class layers re-initialised
# for another class count (training/model/weights.py). A checkpoint in the log dir resumes instead.
_C.TRAIN.LOAD_MODEL = ""
_C.TRAIN.MIXED_PRECISION = False  # GPU only: float16 compute through the grappler AMP rewrite + loss scaling
_C.TRAIN.XLA = False              # GPU only: XLA for the training tower's static-shape parts (backbone, FPN, RPN, box head)
# In-graph consistency checks (training/model/consistency.py): the pipeline's anchor labels against
# the RPN's logits, the sampled ROIs, the mask targets. Each runs on the host and waits for the GPU,
# so they are for debugging a changed pipeline or model, off in training.
_C.TRAIN.DEBUG_CHECKS = False
# Horovod allreduce in fp16: "fp16", "none", "auto" = fp16 across nodes under MIXED_PRECISION on GPU,
# where the gradients are still loss-scaled (unscaled fp32 gradients underflow in fp16: training/gradients.py)
_C.TRAIN.GRADIENT_COMPRESSION = "auto"
_C.TRAIN.MOMENTUM = 0.9
_C.TRAIN.LOG_PERIOD = 20          # steps between progress lines (step, losses, images/s, ETA)
_C.TRAIN.MAX_STEPS = 0            # derived: last step of the LR schedule
_C.TRAIN.MAX_EPOCH = 0            # derived: MAX_STEPS / STEPS_PER_EPOCH, rounded up
_C.TRAIN.LR_BOUNDARIES = []       # derived: global steps where the LR multiplier changes
_C.TRAIN.LR_MULTIPLIERS = []      # derived: multipliers of the scaled base LR; one more than boundaries
_C.TRAIN.WARMUP_STEPS = 0         # derived: WARMUP, capped at MAX_STEPS
_C.TRAIN.SCALED_LR = 0.0          # derived: BASE_LR * global batch / 8
_C.TRAIN.EVAL_MAX_IMAGES = 0      # evaluate on at most this many validation images (0 = all)

# ---------------------------------------------------------------------------------------------
# Preprocessing
_C.PREPROC.TRAIN_SHORT_EDGE_SIZE = [800, 800]   # [min, max] sampled per image
_C.PREPROC.TEST_SHORT_EDGE_SIZE = 800
_C.PREPROC.MAX_SIZE = 1333   # with MODE_FPN rounded up to a multiple of COARSEST_STRIDE (1344), as tensorpack does
# Images are BGR (OpenCV's order, kept by the input pipeline) and so are these statistics: the
# order tensorpack's ImageNet-*-AlignPadding.npz weights were trained with. Their conv0 is frozen
# (FREEZE_AT=2), so RGB input or RGB-ordered statistics could never be corrected by training.
_C.PREPROC.PIXEL_MEAN = [103.53, 116.28, 123.675]   # B, G, R
_C.PREPROC.PIXEL_STD = [57.375, 57.12, 58.395]      # B, G, R
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
_C.RPN.PROPOSAL_NMS = "auto"        # padded (one call, all images and levels), greedy (row by row) or auto (padded on GPU)
_C.RPN.CROWD_OVERLAP_THRESH = 9.99  # anchors with more than this share of their area in a crowd box are ignored (>1: disabled)
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
_C.FRCNN.POOLED_SIZE = 7            # ROIAlign output side for the box head (the mask head uses MASK_SIZE / 2)
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
_C.FPN.ROI_CANONICAL_SIZE = 224.    # an ROI of this side length is pooled from P4 (smaller ones from P2/P3)

# ---------------------------------------------------------------------------------------------
# Mask head
_C.MRCNN.HEAD_DIM = 256
_C.MRCNN.NUM_CONV = 4               # 3x3 convs before the 2x upsampling (4 in the paper's FPN head)
_C.MRCNN.MASK_SIZE = 28             # output resolution of the mask head (14x14 ROIAlign, upsampled 2x)
_C.MRCNN.ACCURATE_PASTE = True       # bilinear sampling at image-pixel centres; False: resize to the rounded box

# ---------------------------------------------------------------------------------------------
# Inference
_C.TEST.FRCNN_NMS_THRESH = 0.5
_C.TEST.RESULT_SCORE_THRESH = 0.05
_C.TEST.RESULTS_PER_IM = 100
# Images per session run when predicting (training.predict, the evaluation during training). A batch
# holds images whose padded sizes are equal, so each image's detections are what it gets alone.
_C.TEST.BATCH_SIZE = 1
# fmt: on

_C.freeze()

NORM_CHOICES = ("FreezeBN", "SyncBN", "GN", "None")
GRADIENT_COMPRESSION_CHOICES = ("auto", "fp16", "none")


def new_config() -> AttrDict:
    """A fresh copy of the defaults, frozen like them: existing keys may be overridden
    (``update_args``), unknown keys are rejected even before ``finalize``."""
    return config.clone()


BLOCK_CHOICES = ("bottleneck", "basic")
DATA_FORMAT_CHOICES = ("NHWC", "NCHW", "auto")
PROPOSAL_NMS_CHOICES = ("padded", "greedy", "auto")
FPN_LEVEL_STRIDES = (4, 8, 16, 32, 64)   # P2..P6
# The backbone's coarsest feature stride (res5): padded image sides divide by it so every level aligns.
COARSEST_STRIDE = 32
FRCNN_HEAD_CHOICES = ("fastrcnn_2fc_head", "fastrcnn_4conv1fc_head", "fastrcnn_4conv1fc_gn_head")
MRCNN_HEAD_CHOICES = ("maskrcnn_up4conv_head", "maskrcnn_up4conv_gn_head")
# Reference global batch for BASE_LR, LR_SCHEDULE and WARMUP (tensorpack's 8 GPUs x 1 image).
REFERENCE_GLOBAL_BATCH = 8


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _gpu_available() -> bool:
    from training.compat import tf  # lazy: config parsing must not need TensorFlow
    return bool(tf.config.list_physical_devices("GPU"))


# tensorpack's rule (examples/FasterRCNN/config.py, finalize_configs): with training short edges
# spread over more than this many pixels, cuDNN autotuning is off, since every new padded shape
# would be autotuned again (bench/gpu_readiness.py counts the shapes).
AUTOTUNE_MAX_SHORT_EDGE_RANGE = 100


def gpu_environment(cfg: AttrDict) -> dict[str, str]:
    """Environment for TensorFlow's GPU kernels in training, to set before the session runs."""
    low, high = cfg.PREPROC.TRAIN_SHORT_EDGE_SIZE
    env = {"TF_AUTOTUNE_THRESHOLD": "1"}  # autotune on a shape's first use, not after a few runs
    if high - low > AUTOTUNE_MAX_SHORT_EDGE_RANGE:
        env["TF_CUDNN_USE_AUTOTUNE"] = "0"
    return env


def finalize(cfg: AttrDict, *, num_ranks: int, class_names: list[str] | None = None,
             has_gpu: bool | None = None, num_train_images: int | None = None) -> AttrDict:
    """Validate ``cfg``, derive the values marked "derived" above, and freeze it.

    ``num_ranks`` is the Horovod size; ``class_names`` (``["BG", ...]``) comes from the training
    annotations, ``num_train_images`` from the training records (the schedule of
    ``TRAIN.DATASET_PASSES``; without it, e.g. a finished run's config.json, the schedule keys are
    used as they are). Raises ``ConfigError`` naming the bad key and what is allowed.
    """
    cfg.freeze(False)
    try:
        _finalize(cfg, num_ranks=num_ranks, class_names=class_names, has_gpu=has_gpu,
                  num_train_images=num_train_images)
    finally:
        cfg.freeze()
    return cfg


def _finalize(cfg: AttrDict, *, num_ranks: int, class_names, has_gpu, num_train_images=None) -> None:
    _require(_is_int(num_ranks) and num_ranks >= 1, f"num_ranks must be >= 1, got {num_ranks!r}")
    for key in ("MODE_MASK", "MODE_FPN", "PREPROC.HORIZONTAL_FLIP", "TRAIN.MIXED_PRECISION", "TRAIN.XLA",
                "TRAIN.DEBUG_CHECKS"):
        _require(isinstance(cfg.get(key), bool), f"{key} must be True or False, got {cfg.get(key)!r}")

    # -- data
    names = cfg.DATA.TRAIN
    _require(isinstance(names, (list, tuple)) and len(names) > 0 and all(isinstance(n, str) and n for n in names),
             f"DATA.TRAIN must name at least one split (e.g. 'coco_train2017' or "
             f"'{split_entries.EXAMPLE}'), got {names!r}")
    names = cfg.DATA.VAL
    _require(isinstance(names, (list, tuple)) and all(isinstance(n, str) and n for n in names),
             f"DATA.VAL must be a list of split names (e.g. ('coco_val2017',)), or () to train without "
             f"evaluating, got {names!r}")
    cfg.DATA.TRAIN, cfg.DATA.VAL = tuple(cfg.DATA.TRAIN), tuple(cfg.DATA.VAL)
    for key in ("DATA.TRAIN", "DATA.VAL"):
        for entry in cfg.get(key):
            problem = split_entries.problem(entry)
            _require(problem is None, f"{key}: {problem}")
    _require(_is_int(cfg.DATA.NUM_WORKERS) and cfg.DATA.NUM_WORKERS >= 0,
             f"DATA.NUM_WORKERS must be >= 0 (0: prepare images in the training process), got {cfg.DATA.NUM_WORKERS!r}")
    _require(_is_int(cfg.DATA.QUEUE_BATCHES) and cfg.DATA.QUEUE_BATCHES >= 1,
             f"DATA.QUEUE_BATCHES must be >= 1, got {cfg.DATA.QUEUE_BATCHES!r}")
    _require(isinstance(cfg.DATA.ASPECT_RATIO_GROUPING, bool),
             f"DATA.ASPECT_RATIO_GROUPING must be True or False, got {cfg.DATA.ASPECT_RATIO_GROUPING!r}")
    # the image order and every augmentation draw derive from it (training/data/batch_order.py)
    _require(_is_int(cfg.TRAIN.SEED) and cfg.TRAIN.SEED >= 0, f"TRAIN.SEED must be an integer >= 0, got {cfg.TRAIN.SEED!r}")
    _require(cfg.TRAIN.GRADIENT_COMPRESSION in GRADIENT_COMPRESSION_CHOICES,
             f"TRAIN.GRADIENT_COMPRESSION must be one of {GRADIENT_COMPRESSION_CHOICES}, "
             f"got {cfg.TRAIN.GRADIENT_COMPRESSION!r}")
    if class_names is not None:
        _require(len(class_names) >= 2 and class_names[0] == "BG",
                 f"class names must start with 'BG' and name at least one category, got {class_names!r}")
        cfg.DATA.CLASS_NAMES = list(class_names)
        cfg.DATA.NUM_CATEGORY = len(class_names) - 1

    # -- backbone
    blocks = cfg.BACKBONE.RESNET_NUM_BLOCKS
    _require(isinstance(blocks, (list, tuple)) and len(blocks) == 4 and all(_is_int(b) and b >= 1 for b in blocks),
             f"unknown backbone: BACKBONE.RESNET_NUM_BLOCKS must be 4 positive block counts "
             f"([3, 4, 6, 3] = resnet50, [3, 4, 23, 3] = resnet101), got {blocks!r}")
    cfg.BACKBONE.RESNET_NUM_BLOCKS = list(blocks)
    _require(cfg.BACKBONE.BLOCK in BLOCK_CHOICES,
             f"unknown backbone block {cfg.BACKBONE.BLOCK!r}: BACKBONE.BLOCK must be one of {BLOCK_CHOICES}")
    _require(_is_int(cfg.BACKBONE.WIDTH) and cfg.BACKBONE.WIDTH >= 4,
             f"BACKBONE.WIDTH must be an integer >= 4, got {cfg.BACKBONE.WIDTH!r}")
    norm = "None" if cfg.BACKBONE.NORM is None else cfg.BACKBONE.NORM
    _require(norm in NORM_CHOICES,
             f"BACKBONE.NORM (batch_norm) must be one of {', '.join(NORM_CHOICES)}; got {norm!r}")
    cfg.BACKBONE.NORM = norm
    _require(_is_int(cfg.BACKBONE.FREEZE_AT) and 0 <= cfg.BACKBONE.FREEZE_AT <= 5,
             f"BACKBONE.FREEZE_AT must be 0..5, got {cfg.BACKBONE.FREEZE_AT!r}")
    # TRAIN.LOAD_MODEL restores the backbone too: with both, one of them would be silently unused
    _require(not (cfg.BACKBONE.WEIGHTS and cfg.TRAIN.LOAD_MODEL),
             f"BACKBONE.WEIGHTS ({cfg.BACKBONE.WEIGHTS!r}) and TRAIN.LOAD_MODEL ({cfg.TRAIN.LOAD_MODEL!r}) are both "
             f"set, but the model file holds the backbone too: set BACKBONE.WEIGHTS='' to fine-tune from the model, "
             f"or TRAIN.LOAD_MODEL='' to start from the backbone weights alone")
    if not cfg.BACKBONE.WEIGHTS and not cfg.TRAIN.LOAD_MODEL:
        cfg.BACKBONE.FREEZE_AT = 0  # nothing pretrained to protect: train every stage
    _require(cfg.BACKBONE.DATA_FORMAT in DATA_FORMAT_CHOICES,
             f"BACKBONE.DATA_FORMAT must be one of {DATA_FORMAT_CHOICES}, got {cfg.BACKBONE.DATA_FORMAT!r}")
    if cfg.BACKBONE.DATA_FORMAT == "auto":
        gpu = _gpu_available() if has_gpu is None else has_gpu
        # NCHW convolutions are ~440x slower than NHWC on CPU (TF 2.18: 46.5 s vs 0.105 s for one 3x3
        # conv at 256 channels, 64x64, forward and backward); cuDNN prefers NCHW.
        cfg.BACKBONE.DATA_FORMAT = "NCHW" if gpu else "NHWC"
    _require(cfg.RPN.PROPOSAL_NMS in PROPOSAL_NMS_CHOICES,
             f"RPN.PROPOSAL_NMS must be one of {PROPOSAL_NMS_CHOICES}, got {cfg.RPN.PROPOSAL_NMS!r}")
    if cfg.RPN.PROPOSAL_NMS == "auto":
        # the padded form waits for no output size per image and level, but a CPU computes its tiled
        # IoU matrices slower than the whole greedy pass (CPU preset, batch 2: 22.7 vs 9.7 ms;
        # 0.93x training images/s with the padded form)
        cfg.RPN.PROPOSAL_NMS = "padded" if (_gpu_available() if has_gpu is None else has_gpu) else "greedy"
    _require(_is_int(cfg.BACKBONE.GN_GROUPS) and cfg.BACKBONE.GN_GROUPS >= 1,
             f"BACKBONE.GN_GROUPS must be >= 1, got {cfg.BACKBONE.GN_GROUPS!r}")

    # -- FPN / anchors / heads
    strides = tuple(cfg.FPN.ANCHOR_STRIDES)
    _require(len(strides) >= 1 and all(s in FPN_LEVEL_STRIDES for s in strides) and list(strides) == sorted(set(strides)),
             f"FPN.ANCHOR_STRIDES must be increasing values from {FPN_LEVEL_STRIDES}, got {strides!r}")
    cfg.FPN.ANCHOR_STRIDES = strides
    sizes = tuple(cfg.RPN.ANCHOR_SIZES)
    _require(len(sizes) >= 1 and all(isinstance(s, (int, float)) and s > 0 for s in sizes),
             f"RPN.ANCHOR_SIZES must be positive numbers, got {sizes!r}")
    if cfg.MODE_FPN:
        _require(len(sizes) == len(strides),
                 f"with MODE_FPN, RPN.ANCHOR_SIZES needs one size per FPN level: {len(strides)} strides "
                 f"{strides} but {len(sizes)} sizes {sizes}")
    cfg.RPN.ANCHOR_SIZES = sizes
    ratios = tuple(cfg.RPN.ANCHOR_RATIOS)
    _require(len(ratios) >= 1 and all(isinstance(r, (int, float)) and r > 0 for r in ratios),
             f"RPN.ANCHOR_RATIOS must be positive numbers, got {ratios!r}")
    cfg.RPN.ANCHOR_RATIOS = ratios
    _require(cfg.FPN.PROPOSAL_MODE in ("Level", "Joint"), f"FPN.PROPOSAL_MODE must be Level or Joint, got {cfg.FPN.PROPOSAL_MODE!r}")
    _require(cfg.FPN.NORM in ("None", "GN"), f"FPN.NORM must be None or GN, got {cfg.FPN.NORM!r}")
    _require(cfg.FPN.FRCNN_HEAD_FUNC in FRCNN_HEAD_CHOICES,
             f"FPN.FRCNN_HEAD_FUNC must be one of {FRCNN_HEAD_CHOICES}, got {cfg.FPN.FRCNN_HEAD_FUNC!r}")
    _require(cfg.FPN.MRCNN_HEAD_FUNC in MRCNN_HEAD_CHOICES,
             f"FPN.MRCNN_HEAD_FUNC must be one of {MRCNN_HEAD_CHOICES}, got {cfg.FPN.MRCNN_HEAD_FUNC!r}")
    _require(_is_int(cfg.MRCNN.MASK_SIZE) and cfg.MRCNN.MASK_SIZE >= 4 and cfg.MRCNN.MASK_SIZE % 2 == 0,
             f"MRCNN.MASK_SIZE must be an even integer >= 4, got {cfg.MRCNN.MASK_SIZE!r}")
    for key in ("RPN.BATCH_PER_IM", "FRCNN.BATCH_PER_IM", "RPN.TRAIN_POST_NMS_TOPK", "RPN.TEST_POST_NMS_TOPK",
                "RPN.TRAIN_PRE_NMS_TOPK", "RPN.TEST_PRE_NMS_TOPK", "RPN.TRAIN_PER_LEVEL_NMS_TOPK",
                "RPN.TEST_PER_LEVEL_NMS_TOPK", "TEST.RESULTS_PER_IM", "TEST.BATCH_SIZE", "FRCNN.POOLED_SIZE",
                "MRCNN.NUM_CONV"):
        v = cfg.get(key)
        _require(_is_int(v) and v >= (0 if key == "MRCNN.NUM_CONV" else 1), f"{key} must be a positive integer, got {v!r}")
    for key in ("RPN.FG_RATIO", "FRCNN.FG_RATIO"):
        v = cfg.get(key)
        _require(isinstance(v, (int, float)) and 0 < v <= 1, f"{key} must be in (0, 1], got {v!r}")

    # -- preprocessing
    short = cfg.PREPROC.TRAIN_SHORT_EDGE_SIZE
    if isinstance(short, (int, float)):
        short = [short, short]
    _require(isinstance(short, (list, tuple)) and len(short) == 2 and all(_is_int(s) and s > 0 for s in short)
             and short[0] <= short[1],
             f"PREPROC.TRAIN_SHORT_EDGE_SIZE must be [min, max] positive integers, got {cfg.PREPROC.TRAIN_SHORT_EDGE_SIZE!r}")
    cfg.PREPROC.TRAIN_SHORT_EDGE_SIZE = list(short)
    _require(_is_int(cfg.PREPROC.TEST_SHORT_EDGE_SIZE) and cfg.PREPROC.TEST_SHORT_EDGE_SIZE > 0,
             f"PREPROC.TEST_SHORT_EDGE_SIZE must be a positive integer, got {cfg.PREPROC.TEST_SHORT_EDGE_SIZE!r}")
    _require(isinstance(cfg.PREPROC.MAX_SIZE, (int, float)) and cfg.PREPROC.MAX_SIZE >= max(short[1], cfg.PREPROC.TEST_SHORT_EDGE_SIZE),
             f"PREPROC.MAX_SIZE ({cfg.PREPROC.MAX_SIZE!r}) must be >= the short-edge sizes")
    if cfg.MODE_FPN:
        # tensorpack's finalize_configs: an FPN model's longest side is a whole number of res5 cells,
        # so the image fills its padded input exactly (1333 -> 1344). The box-decoding clip follows it.
        cfg.PREPROC.MAX_SIZE = int(math.ceil(cfg.PREPROC.MAX_SIZE / COARSEST_STRIDE) * COARSEST_STRIDE)

    # -- schedule
    bs = cfg.TRAIN.BATCH_SIZE_PER_GPU
    _require(_is_int(bs) and bs >= 1,
             f"TRAIN.BATCH_SIZE_PER_GPU (batch_size_per_gpu) must be an integer >= 1 (1 to 4 on a 16 GB GPU), got {bs!r}")
    cfg.TRAIN.NUM_GPUS = num_ranks
    global_batch = bs * num_ranks
    passes = cfg.TRAIN.DATASET_PASSES
    _require(_is_int(passes) and passes >= 0,
             f"TRAIN.DATASET_PASSES must be an integer >= 0 (passes over the training images; 0: the schedule "
             f"keys as set), got {passes!r}")
    if passes and num_train_images is not None:
        _require(_is_int(num_train_images) and num_train_images >= 1,
                 f"TRAIN.DATASET_PASSES needs training images, got {num_train_images!r}")
        from training import schedule
        schedule.fit_to_dataset(cfg, num_images=num_train_images, global_batch=global_batch)
    ipe = cfg.TRAIN.IMAGES_PER_EPOCH
    _require(_is_int(ipe) and ipe >= 1, f"TRAIN.IMAGES_PER_EPOCH must be a positive integer, got {ipe!r}")
    cfg.TRAIN.STEPS_PER_EPOCH = max(1, -(-ipe // global_batch))
    spe = cfg.TRAIN.STEPS_PER_EPOCH
    _require(isinstance(cfg.TRAIN.BASE_LR, (int, float)) and cfg.TRAIN.BASE_LR > 0,
             f"TRAIN.BASE_LR must be > 0, got {cfg.TRAIN.BASE_LR!r}")
    scale = global_batch / REFERENCE_GLOBAL_BATCH
    cfg.TRAIN.SCALED_LR = float(cfg.TRAIN.BASE_LR) * scale

    if cfg.TRAIN.LR_EPOCH_SCHEDULE:
        sched = cfg.TRAIN.LR_EPOCH_SCHEDULE
        _require(isinstance(sched, (list, tuple)) and all(isinstance(e, (list, tuple)) and len(e) == 2 for e in sched),
                 f"TRAIN.LR_EPOCH_SCHEDULE must be [(epoch, lr_multiplier), ..., (last_epoch, None)], got {sched!r}")
        epochs = [e for e, _ in sched]
        mults = [m for _, m in sched]
        _require(all(_is_int(e) and e >= 1 for e in epochs) and epochs == sorted(set(epochs)),
                 f"TRAIN.LR_EPOCH_SCHEDULE epochs must be increasing positive integers, got {epochs!r}")
        _require(mults[-1] is None and all(isinstance(m, (int, float)) and m > 0 for m in mults[:-1]),
                 f"TRAIN.LR_EPOCH_SCHEDULE: every entry but the last needs a positive multiplier and the last "
                 f"(the end of training) None, got {sched!r}")
        cfg.TRAIN.LR_BOUNDARIES = [e * spe for e in epochs[:-1]]
        cfg.TRAIN.LR_MULTIPLIERS = [1.0] + [float(m) for m in mults[:-1]]
        cfg.TRAIN.MAX_STEPS = epochs[-1] * spe
    else:
        sched = cfg.TRAIN.LR_SCHEDULE
        if isinstance(sched, str):
            sched = named_schedule(sched)
        cfg.TRAIN.LR_SCHEDULE = sched
        _require(isinstance(sched, (list, tuple)) and len(sched) >= 1 and all(_is_int(s) and s > 0 for s in sched)
                 and list(sched) == sorted(set(sched)),
                 f"TRAIN.LR_SCHEDULE (lr_schedule) must be increasing step counts like [240000, 320000, 360000] "
                 f"or a name such as '1x' or '2x', got {sched!r}")
        # Steps are stated at the reference global batch of 8: fewer, larger steps at a larger batch.
        steps = [max(1, int(round(s / scale))) for s in sched]
        cfg.TRAIN.LR_BOUNDARIES = steps[:-1]
        cfg.TRAIN.LR_MULTIPLIERS = [0.1 ** i for i in range(len(steps))]
        cfg.TRAIN.MAX_STEPS = steps[-1]
    cfg.TRAIN.MAX_EPOCH = -(-cfg.TRAIN.MAX_STEPS // spe)
    _require(_is_int(cfg.TRAIN.WARMUP) and cfg.TRAIN.WARMUP >= 0, f"TRAIN.WARMUP must be >= 0 steps, got {cfg.TRAIN.WARMUP!r}")
    # Not scaled with the global batch (tensorpack and aws-samples keep 1000 steps at any GPU count):
    # a large global batch starts at a proportionally larger LR and needs the full ramp, or the
    # first steps diverge (NaN losses at 32 GPUs x 4 images).
    cfg.TRAIN.WARMUP_STEPS = min(cfg.TRAIN.WARMUP, cfg.TRAIN.MAX_STEPS)
    for key in ("TRAIN.EVAL_PERIOD", "TRAIN.EVAL_MAX_IMAGES"):
        _require(_is_int(cfg.get(key)) and cfg.get(key) >= 0, f"{key} must be an integer >= 0, got {cfg.get(key)!r}")
    for key in ("TRAIN.CHECKPOINT_PERIOD", "TRAIN.LOG_PERIOD"):
        _require(_is_int(cfg.get(key)) and cfg.get(key) >= 1, f"{key} must be an integer >= 1, got {cfg.get(key)!r}")
    minutes = cfg.TRAIN.CHECKPOINT_MINUTES
    _require(isinstance(minutes, (int, float)) and not isinstance(minutes, bool) and minutes >= 0,
             f"TRAIN.CHECKPOINT_MINUTES must be a number of minutes >= 0 (0 = only the per-epoch checkpoints), "
             f"got {minutes!r}")
    _require(isinstance(cfg.TRAIN.GRADIENT_CLIP, (int, float)) and cfg.TRAIN.GRADIENT_CLIP >= 0,
             f"TRAIN.GRADIENT_CLIP must be >= 0 (0 = off), got {cfg.TRAIN.GRADIENT_CLIP!r}")


def named_schedule(name: str) -> list[int]:
    """tensorpack's (and Detectron's) schedule names as steps at global batch 8: "1x" is
    [120000, 160000, 180000]; "Nx" for N >= 2 ends at N x 180000 with drops 120000 and 40000 before."""
    factor = name[:-1] if name.endswith("x") else ""
    if not factor.isdigit() or int(factor) < 1:
        raise ConfigError(f"TRAIN.LR_SCHEDULE (lr_schedule) {name!r} is not a schedule name: use '1x', '2x', ... "
                          f"or increasing step counts like [240000, 320000, 360000]")
    n = int(factor)
    kilo = [120, 160, 180] if n == 1 else [180 * n - 120, 180 * n - 40, 180 * n]
    return [k * 1000 for k in kilo]


def learning_rate_at(cfg: AttrDict, step: int) -> float:
    """The LR of a finalized config at a global step (NumPy mirror of the in-graph schedule)."""
    t = cfg.TRAIN
    mult = t.LR_MULTIPLIERS[0]
    for boundary, m in zip(t.LR_BOUNDARIES, t.LR_MULTIPLIERS[1:]):
        if step >= boundary:
            mult = m
    lr = t.SCALED_LR * mult
    if step < t.WARMUP_STEPS:
        alpha = step / t.WARMUP_STEPS
        lr = t.WARMUP_INIT_LR * (1 - alpha) + lr * alpha
    return lr
