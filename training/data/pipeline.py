"""Input pipelines: COCO records -> augmented, padded batches with RPN targets.

Every per-image step (decode, resize, flip, masks, RPN targets) runs in a pool of threads (OpenCV
releases the GIL, NumPy does on whole arrays), never in forked processes: forking a process that
holds Horovod/MPI state is unsafe, and forked loaders were how the original setup exhausted host
memory. Batches leave as the model takes them: BGR uint8 images and bit-packed masks
(``training.data.packed_masks``), a small fraction of float32 images and byte masks. Each rank
shuffles with its own seed, so ranks see different images.
"""
from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import itertools
import logging

import cv2
import numpy as np
from tensorpack.dataflow import DataFlow

from training.data import augment, packed_masks
from training.data.rpn_sampling import AnchorSet, sample_rpn_targets

log = logging.getLogger(__name__)

SIZE_DIVISOR = 32  # the largest backbone stride: padded sides divide by it so every level aligns
ANCHOR_CACHE_SIZE = 32  # padded shapes whose anchors are kept (few at a fixed short edge)


class ImageReadError(IOError):
    pass


def read_image(path: str) -> np.ndarray:
    """A BGR uint8 image (OpenCV's order, which the ImageNet weights and PIXEL_MEAN/STD expect;
    grayscale files come back as 3 equal channels); a clear error if missing or unreadable."""
    image = cv2.imread(path, cv2.IMREAD_COLOR)
    if image is None:
        raise ImageReadError(f"cannot read image {path}: missing or not an image file")
    return image


def padded_size(height: int, width: int, divisor: int = SIZE_DIVISOR) -> tuple[int, int]:
    return -(-height // divisor) * divisor, -(-width // divisor) * divisor


def batch_padded_size(sizes, cfg) -> tuple[int, int]:
    """Padded side lengths of a training batch of images of ``sizes`` ``[(h, w), ...]``.

    The smallest multiples of 32 that hold them; with TRAIN.XLA, one of at most four fixed shapes
    instead, ``{S, L} x {S, L}`` where S and L are the longest short and long edge the resizing can
    give (PREPROC.TRAIN_SHORT_EDGE_SIZE[1] and PREPROC.MAX_SIZE, rounded up to 32): (S, L) for a
    landscape batch, (L, S) portrait, (L, L) mixed. XLA compiles each cluster once per input
    shape; with free shapes it would recompile at almost every step.
    """
    hp, wp = padded_size(max(h for h, _ in sizes), max(w for _, w in sizes))
    if not cfg.TRAIN.XLA:
        return hp, wp
    short, long = padded_size(cfg.PREPROC.TRAIN_SHORT_EDGE_SIZE[1], cfg.PREPROC.MAX_SIZE)
    return (short if hp <= short else long), (short if wp <= short else long)


@dataclasses.dataclass(frozen=True)
class Augmentation:
    """What happens to one training image, drawn before it is read: the batch's shape follows."""

    short_size: int
    flip: bool
    height: int     # after the resize
    width: int


def draw_augmentation(record: dict, cfg, rng: np.random.Generator) -> Augmentation:
    short = augment.sample_short_size(rng, cfg.PREPROC.TRAIN_SHORT_EDGE_SIZE)
    flip = bool(cfg.PREPROC.HORIZONTAL_FLIP and rng.random() < 0.5)
    h, w = augment.resized_shape(int(record["height"]), int(record["width"]), short, cfg.PREPROC.MAX_SIZE)
    return Augmentation(short, flip, h, w)


def _packed_polygon_mask(polygons, height: int, width: int):
    """``(y0, byte column, packed crop)``: one instance's polygons rasterised by pycocotools
    in the smallest byte-aligned window around them instead of the whole image (the same pixels up
    to pycocotools' vertex rounding after the shift: a rare edge pixel)."""
    xy = np.concatenate([np.asarray(p, np.float64).reshape(-1, 2) for p in polygons])
    x0 = int(np.clip(np.floor(xy[:, 0].min()) - 1, 0, width)) // packed_masks.BITS * packed_masks.BITS
    y0 = int(np.clip(np.floor(xy[:, 1].min()) - 1, 0, height))
    x1 = int(np.clip(np.ceil(xy[:, 0].max()) + 1, 0, width))
    y1 = int(np.clip(np.ceil(xy[:, 1].max()) + 1, 0, height))
    crop_w = -(-max(x1 - x0, 1) // packed_masks.BITS) * packed_masks.BITS
    crop_h = max(y1 - y0, 1)
    shifted = [(np.asarray(p, np.float64).reshape(-1, 2) - (x0, y0)).reshape(-1).tolist() for p in polygons]
    mask = augment.segmentation_to_mask(shifted, crop_h, crop_w)
    mask[:, max(width - x0, 0):] = 0  # the byte-aligned window may reach past the right edge
    return y0, x0 // packed_masks.BITS, packed_masks.pack(mask)


def _augmented_example(record: dict, cfg, aug: Augmentation) -> dict:
    """Read, resize, maybe flip; the non-crowd instances' masks rasterised and packed."""
    image = read_image(record["file_name"])
    if image.shape[:2] != (int(record["height"]), int(record["width"])):
        raise ImageReadError(f"{record['file_name']} is {image.shape[1]}x{image.shape[0]} pixels but its annotation "
                             f"says {record['width']}x{record['height']}: fix the annotation file or the image")
    out = augment.augment_record(image, record, aug.short_size, cfg.PREPROC.MAX_SIZE, aug.flip, with_masks=False)
    crowd = np.asarray(record["is_crowd"], bool)
    masks = []
    if cfg.MODE_MASK:
        height, width = image.shape[:2]
        scale = out["scale"]
        for segm, is_crowd in zip(record["segmentation"], crowd):
            if is_crowd:  # crowd regions only silence RPN anchors; they have no mask target
                continue
            if isinstance(segm, dict):  # RLE: decoded at the input size, resized and flipped like the image
                mask = augment.transform_segmentation(segm, height, width, scale, aug.height, aug.width, aug.flip)
                masks.append((0, 0, packed_masks.pack(mask)))
            else:
                polygons = augment.scale_polygons(segm, scale)
                if aug.flip:
                    polygons = augment.flip_polygons(polygons, aug.width)
                masks.append(_packed_polygon_mask(polygons, aug.height, aug.width))
    return {"image": out["image"], "boxes": out["boxes"], "class": np.asarray(record["class"], np.int32),
            "is_crowd": crowd, "masks": masks}


def prepare_training_example(record: dict, cfg, rng: np.random.Generator) -> dict:
    """Read, resize (random shorter side in the configured range), maybe flip; masks rasterised."""
    return _augmented_example(record, cfg, draw_augmentation(record, cfg, rng))


def _empty_batch(sizes: list[tuple[int, int]], num_gt: list[int], anchors: AnchorSet, cfg) -> list[np.ndarray]:
    b = len(sizes)
    hp, wp = batch_padded_size(sizes, cfg)
    g = max(1, max(num_gt))
    return [
        np.zeros((b, hp, wp, 3), np.uint8),                                  # images, BGR
        np.asarray(sizes, np.int32).reshape(b, 2),                           # image_hw
        np.zeros((b, g, 4), np.float32),                                     # gt_boxes
        np.zeros((b, g), np.int32),                                          # gt_labels
        np.asarray(num_gt, np.int32),                                        # num_gt
        np.zeros((b, g, hp, wp // packed_masks.BITS) if cfg.MODE_MASK else (b, g, 1, 1), np.uint8),  # packed
        np.full((b, len(anchors)), -1, np.int32),                            # anchor_labels
        np.zeros((b, len(anchors), 4), np.float32),                          # anchor_targets
    ]


def _place(batch: list[np.ndarray], i: int, example: dict, anchors: AnchorSet, cfg, rng) -> None:
    """Write one prepared example into slot ``i`` of ``batch``, with its sampled RPN targets."""
    images, _, gt_boxes, gt_labels, num_gt, gt_masks, anchor_labels, anchor_targets = batch
    h, w = example["image"].shape[:2]
    images[i, :h, :w] = example["image"]
    keep = ~example["is_crowd"]
    n = int(num_gt[i])
    gt_boxes[i, :n] = example["boxes"][keep]
    gt_labels[i, :n] = example["class"][keep]
    for j, (y0, xb0, packed) in enumerate(example["masks"]):
        gt_masks[i, j, y0:y0 + packed.shape[0], xb0:xb0 + packed.shape[1]] = packed
    r = cfg.RPN
    sample_rpn_targets(anchors, example["boxes"], example["is_crowd"], (h, w), rng=rng,
                       labels_out=anchor_labels[i], targets_out=anchor_targets[i],
                       positive_thresh=r.POSITIVE_ANCHOR_THRESH, negative_thresh=r.NEGATIVE_ANCHOR_THRESH,
                       batch_per_im=r.BATCH_PER_IM, fg_ratio=r.FG_RATIO, crowd_overlap_thresh=r.CROWD_OVERLAP_THRESH)


def collate_training_batch(examples: list[dict], cfg, rng: np.random.Generator) -> list[np.ndarray]:
    """Pad prepared examples into the model's training inputs (see MaskRCNN.inputs), in this thread."""
    sizes = [e["image"].shape[:2] for e in examples]
    hp, wp = batch_padded_size(sizes, cfg)
    anchors = AnchorSet.build(cfg, hp, wp)
    batch = _empty_batch(sizes, [int((~e["is_crowd"]).sum()) for e in examples], anchors, cfg)
    for i, e in enumerate(examples):
        _place(batch, i, e, anchors, cfg, rng)
    return batch


def _fill_slot(batch, i, record, aug, anchors, cfg, rng) -> None:
    _place(batch, i, _augmented_example(record, cfg, aug), anchors, cfg, rng)


class TrainingBatches(DataFlow):
    """Endless shuffled training batches of ``BATCH_SIZE_PER_GPU`` images for one rank.

    All per-image work (read, resize, flip, masks, RPN targets) runs in ``NUM_WORKERS`` threads,
    each writing straight into its slot of a batch allocated up front: the resize of every image is
    drawn when its batch is planned, so the batch's padded shape (and anchors) are known before any
    image is read. This thread only plans, allocates and hands over finished batches, in an order
    fixed by the seed. At most ``batches_ahead`` batches are in flight (bounded host memory).
    """

    def __init__(self, roidb: list[dict], cfg, *, seed: int, batches_ahead: int = 0):
        if not roidb:
            raise ValueError("the training set is empty: no image has a usable annotation")
        self.roidb = roidb
        self.cfg = cfg
        self.seed = seed
        bs = cfg.TRAIN.BATCH_SIZE_PER_GPU
        # enough images in flight to keep every worker busy while the oldest batch completes
        self.batches_ahead = batches_ahead or 1 + -(-2 * cfg.DATA.NUM_WORKERS // bs)
        self._anchors: collections.OrderedDict = collections.OrderedDict()

    def __len__(self):
        return len(self.roidb) // self.cfg.TRAIN.BATCH_SIZE_PER_GPU

    def _record_stream(self, rng):
        while True:
            for idx in rng.permutation(len(self.roidb)):
                yield self.roidb[idx]

    def _anchor_set(self, hp: int, wp: int) -> AnchorSet:
        key = (hp, wp)
        if key not in self._anchors:
            self._anchors[key] = AnchorSet.build(self.cfg, hp, wp)
            if len(self._anchors) > ANCHOR_CACHE_SIZE:  # random short edges: many shapes, keep the recent
                self._anchors.popitem(last=False)
        self._anchors.move_to_end(key)
        return self._anchors[key]

    def _submit_batch(self, pool, records, seeds):
        cfg = self.cfg
        picked = [next(records) for _ in range(cfg.TRAIN.BATCH_SIZE_PER_GPU)]
        rngs = [np.random.default_rng(next(seeds)) for _ in picked]
        augs = [draw_augmentation(rec, cfg, rng) for rec, rng in zip(picked, rngs)]
        sizes = [(a.height, a.width) for a in augs]
        anchors = self._anchor_set(*batch_padded_size(sizes, cfg))
        batch = _empty_batch(sizes, [int(np.sum(np.asarray(r["is_crowd"]) == 0)) for r in picked], anchors, cfg)
        futures = [pool.submit(_fill_slot, batch, i, rec, aug, anchors, cfg, rng)
                   for i, (rec, aug, rng) in enumerate(zip(picked, augs, rngs))]
        return batch, futures

    def __iter__(self):
        # Parallelism comes from the workers (and from the ranks sharing a node): OpenCV's own
        # thread pool per call would put ranks x cores threads on the cores.
        cv2.setNumThreads(1)
        rng = np.random.default_rng(self.seed)
        seeds = itertools.count(self.seed * 1000003)  # one augmentation seed per example
        records = self._record_stream(rng)
        with concurrent.futures.ThreadPoolExecutor(self.cfg.DATA.NUM_WORKERS, thread_name_prefix="prep") as pool:
            pending = collections.deque()
            while True:
                while len(pending) < self.batches_ahead:
                    pending.append(self._submit_batch(pool, records, seeds))
                batch, futures = pending.popleft()
                for future in futures:
                    future.result()
                yield batch


def prepare_test_image(image: np.ndarray, cfg) -> tuple[np.ndarray, np.ndarray, tuple]:
    """Resize for inference; returns the padded ``[1, H, W, 3]`` batch, ``image_hw [1, 2]`` and the scale."""
    resized, scale = augment.resize_shorter_side(image, cfg.PREPROC.TEST_SHORT_EDGE_SIZE, cfg.PREPROC.MAX_SIZE)
    h, w = resized.shape[:2]
    hp, wp = padded_size(h, w)
    batch = np.zeros((1, hp, wp, 3), np.uint8)
    batch[0, :h, :w] = resized
    return batch, np.asarray([[h, w]], np.int32), scale


def iterate_test_images(paths: list, *, num_workers: int = 2, ahead: int = 4):
    """Yield ``(index, BGR image)`` in order, decoding up to ``ahead`` images in threads."""
    with concurrent.futures.ThreadPoolExecutor(max(1, num_workers), thread_name_prefix="read") as pool:
        pending = collections.deque()
        it = iter(enumerate(paths))
        for idx, path in itertools.islice(it, ahead):
            pending.append((idx, pool.submit(read_image, str(path))))
        while pending:
            idx, fut = pending.popleft()
            nxt = next(it, None)
            if nxt is not None:
                pending.append((nxt[0], pool.submit(read_image, str(nxt[1]))))
            yield idx, fut.result()
