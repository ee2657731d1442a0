"""A training batch as one flat buffer: where each input array lives, and how one slot is filled.

The parent process plans a batch (sizes, padded shape, ground-truth counts), allocates one
zero-filled buffer for all of it and hands each image's slot to a worker; the worker maps the same
buffer and writes its image, ground truth, packed masks and sampled RPN anchors in place
(:func:`fill_slot`). The parent never copies an image: the arrays it yields are views of the
buffer. Buffers are reused, so a slot is written whole: its padding, unused ground-truth rows
and unused RPN sample rows are cleared, not assumed zero.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from training.data import packed_masks
from training.data.examples import Augmentation, augmented_example
from training.data.rpn_sampling import AnchorSet, sample_rpn_targets
from training.model.anchors import feature_size, level_anchor_specs

ALIGN = 64  # each array starts on a cache line


@dataclasses.dataclass(frozen=True)
class BatchLayout:
    """Shapes of the model's training inputs (see ``MaskRCNN.inputs``) for one planned batch."""

    batch: int
    height: int         # padded
    width: int
    max_gt: int         # ground-truth rows per image (at least 1)
    num_anchors: int    # RPN anchors per image, all levels
    rpn_samples: int    # sampled RPN anchor rows per image (RPN.BATCH_PER_IM)
    mask: bool

    def specs(self) -> list[tuple[tuple, np.dtype]]:
        b, hp, wp, g, k = self.batch, self.height, self.width, self.max_gt, self.rpn_samples
        return [
            ((b, hp, wp, 3), np.uint8),                                                   # images, BGR
            ((b, 2), np.int32),                                                           # image_hw
            ((b, g, 4), np.float32),                                                      # gt_boxes
            ((b, g), np.int32),                                                           # gt_labels
            ((b,), np.int32),                                                             # num_gt
            ((b, g, hp, wp // packed_masks.BITS) if self.mask else (b, g, 1, 1), np.uint8),  # gt_masks, packed
            ((b,), np.int32),                                                             # num_anchors
            ((b, k), np.int32),                                                           # anchor_index
            ((b, k), np.int32),                                                           # anchor_labels
            ((b, k, 4), np.float32),                                                      # anchor_targets
        ]

    def _offsets(self) -> tuple[list[int], int]:
        offsets, end = [], 0
        for shape, dtype in self.specs():
            offsets.append(end)
            end += -(-int(np.prod(shape)) * np.dtype(dtype).itemsize // ALIGN) * ALIGN
        return offsets, max(end, ALIGN)

    @property
    def nbytes(self) -> int:
        return self._offsets()[1]

    def views(self, buffer) -> list[np.ndarray]:
        """The batch's arrays over ``buffer`` (``nbytes`` long, writable: an mmap, bytearray, array)."""
        offsets, _ = self._offsets()
        return [np.frombuffer(buffer, dtype, int(np.prod(shape)), offset).reshape(shape)
                for (shape, dtype), offset in zip(self.specs(), offsets)]


def anchor_count(cfg, padded_h: int, padded_w: int) -> int:
    """RPN anchors of a padded input, counted as ``AnchorSet.build`` lays them out (without building them)."""
    ratios = len(cfg.RPN.ANCHOR_RATIOS)
    return sum(feature_size(padded_h, stride) * feature_size(padded_w, stride) * len(sizes) * ratios
               for stride, sizes in level_anchor_specs(cfg))


def fill_slot(arrays: list[np.ndarray], i: int, record: dict, aug: Augmentation, rng: np.random.Generator,
              anchors: AnchorSet, cfg) -> None:
    """Read and augment ``record`` into slot ``i`` of the batch ``arrays`` (a worker's task)."""
    place_example(arrays, i, augmented_example(record, cfg, aug), rng, anchors, cfg)


def place_example(arrays: list[np.ndarray], i: int, example: dict, rng: np.random.Generator,
                  anchors: AnchorSet, cfg) -> None:
    """Write a prepared example into slot ``i`` of the batch ``arrays`` (whatever it held before),
    with its sampled RPN targets (``image_hw`` and ``num_gt`` are the planner's)."""
    images, _, gt_boxes, gt_labels, _, gt_masks, _, anchor_index, anchor_labels, anchor_targets = arrays
    h, w = example["image"].shape[:2]
    images[i, :h, :w] = example["image"]
    images[i, h:] = 0
    images[i, :h, w:] = 0
    for cleared in (gt_boxes, gt_labels, gt_masks):
        cleared[i] = 0
    keep = ~example["is_crowd"]
    n = int(keep.sum())
    gt_boxes[i, :n] = example["boxes"][keep]
    gt_labels[i, :n] = example["class"][keep]
    for j, (y0, xb0, packed) in enumerate(example["masks"]):
        gt_masks[i, j, y0:y0 + packed.shape[0], xb0:xb0 + packed.shape[1]] = packed
    r = cfg.RPN
    sample_rpn_targets(anchors, example["boxes"], example["is_crowd"], (h, w), rng=rng,
                       index_out=anchor_index[i], labels_out=anchor_labels[i], targets_out=anchor_targets[i],
                       positive_thresh=r.POSITIVE_ANCHOR_THRESH, negative_thresh=r.NEGATIVE_ANCHOR_THRESH,
                       batch_per_im=r.BATCH_PER_IM, fg_ratio=r.FG_RATIO, crowd_overlap_thresh=r.CROWD_OVERLAP_THRESH)


class AnchorCache:
    """AnchorSets of recently used padded shapes (few at a fixed short edge, more with a range)."""

    def __init__(self, cfg, size: int = 32):
        self.cfg, self.size = cfg, size
        self._sets: dict[tuple[int, int], AnchorSet] = {}

    def get(self, height: int, width: int) -> AnchorSet:
        key = (height, width)
        anchors = self._sets.pop(key, None) or AnchorSet.build(self.cfg, height, width)
        self._sets[key] = anchors  # most recent last
        if len(self._sets) > self.size:
            del self._sets[next(iter(self._sets))]
        return anchors
