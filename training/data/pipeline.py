"""Input pipelines: COCO records -> augmented, padded batches with RPN targets.

Decoding and augmentation run in a pool of threads (OpenCV and pycocotools release the GIL), never
in forked processes: forking a process that holds Horovod/MPI state is unsafe, and forked loaders
were how the original setup exhausted host memory. Each rank shuffles with its own seed, so ranks
see different images.
"""
from __future__ import annotations

import collections
import concurrent.futures
import itertools
import logging

import cv2
import numpy as np
from tensorpack.dataflow import DataFlow

from training.data import augment
from training.model.anchors import all_anchors, rpn_targets

log = logging.getLogger(__name__)

SIZE_DIVISOR = 32  # the largest backbone stride: padded sides divide by it so every level aligns


class ImageReadError(IOError):
    pass


def read_image(path: str) -> np.ndarray:
    """An RGB uint8 image; a clear error if the file is missing or unreadable."""
    image = cv2.imread(path, cv2.IMREAD_COLOR)
    if image is None:
        raise ImageReadError(f"cannot read image {path}: missing or not an image file")
    return cv2.cvtColor(image, cv2.COLOR_BGR2RGB)


def padded_size(height: int, width: int, divisor: int = SIZE_DIVISOR) -> tuple[int, int]:
    return -(-height // divisor) * divisor, -(-width // divisor) * divisor


def prepare_training_example(record: dict, cfg, rng: np.random.Generator) -> dict:
    """Read, resize (random shorter side in the configured range), maybe flip; masks rasterised."""
    image = read_image(record["file_name"])
    short = augment.sample_short_size(rng, cfg.PREPROC.TRAIN_SHORT_EDGE_SIZE)
    flip = bool(cfg.PREPROC.HORIZONTAL_FLIP and rng.random() < 0.5)
    out = augment.augment_record(image, record, short, cfg.PREPROC.MAX_SIZE, flip, with_masks=cfg.MODE_MASK)
    crowd = np.asarray(record["is_crowd"], bool)
    return {"image": out["image"], "boxes": out["boxes"], "class": np.asarray(record["class"], np.int32),
            "is_crowd": crowd, "masks": out["masks"]}


def collate_training_batch(examples: list[dict], cfg, rng: np.random.Generator) -> list[np.ndarray]:
    """Pad a list of prepared examples into the model's training inputs (see MaskRCNN.inputs)."""
    b = len(examples)
    hp, wp = padded_size(max(e["image"].shape[0] for e in examples), max(e["image"].shape[1] for e in examples))
    anchors = np.concatenate(all_anchors(cfg, hp, wp), axis=0)
    num_gt = [int((~e["is_crowd"]).sum()) for e in examples]
    g = max(1, max(num_gt))
    images = np.zeros((b, hp, wp, 3), np.float32)
    image_hw = np.zeros((b, 2), np.int32)
    gt_boxes = np.zeros((b, g, 4), np.float32)
    gt_labels = np.zeros((b, g), np.int32)
    gt_masks = np.zeros((b, g, hp, wp) if cfg.MODE_MASK else (b, g, 1, 1), np.uint8)
    anchor_labels = np.zeros((b, len(anchors)), np.int32)
    anchor_targets = np.zeros((b, len(anchors), 4), np.float32)
    r = cfg.RPN
    for i, e in enumerate(examples):
        h, w = e["image"].shape[:2]
        images[i, :h, :w] = e["image"]
        image_hw[i] = (h, w)
        keep = ~e["is_crowd"]
        n = num_gt[i]
        gt_boxes[i, :n] = e["boxes"][keep]
        gt_labels[i, :n] = e["class"][keep]
        if cfg.MODE_MASK:
            gt_masks[i, :n, :h, :w] = e["masks"][keep]
        anchor_labels[i], anchor_targets[i] = rpn_targets(
            anchors, e["boxes"], e["is_crowd"], (h, w), rng=rng, positive_thresh=r.POSITIVE_ANCHOR_THRESH,
            negative_thresh=r.NEGATIVE_ANCHOR_THRESH, batch_per_im=r.BATCH_PER_IM, fg_ratio=r.FG_RATIO,
            crowd_overlap_thresh=r.CROWD_OVERLAP_THRESH)
    return [images, image_hw, gt_boxes, gt_labels, np.asarray(num_gt, np.int32), gt_masks,
            anchor_labels, anchor_targets]


class TrainingBatches(DataFlow):
    """Endless shuffled training batches of ``BATCH_SIZE_PER_GPU`` images for one rank.

    ``NUM_WORKERS`` threads prepare examples ahead of the consumer (bounded prefetch); batches
    are assembled in the consumer thread in a deterministic order for a given seed.
    """

    def __init__(self, roidb: list[dict], cfg, *, seed: int, prefetch: int = 8):
        if not roidb:
            raise ValueError("the training set is empty: no image has a usable annotation")
        self.roidb = roidb
        self.cfg = cfg
        self.seed = seed
        self.prefetch = max(prefetch, cfg.TRAIN.BATCH_SIZE_PER_GPU * 2)

    def __len__(self):
        return len(self.roidb) // self.cfg.TRAIN.BATCH_SIZE_PER_GPU

    def _record_stream(self, rng):
        while True:
            for idx in rng.permutation(len(self.roidb)):
                yield self.roidb[idx]

    def __iter__(self):
        rng = np.random.default_rng(self.seed)
        seeds = itertools.count(self.seed * 1000003)  # one augmentation seed per example
        records = self._record_stream(rng)
        bs = self.cfg.TRAIN.BATCH_SIZE_PER_GPU
        with concurrent.futures.ThreadPoolExecutor(self.cfg.DATA.NUM_WORKERS, thread_name_prefix="prep") as pool:
            pending = collections.deque()
            while True:
                while len(pending) < self.prefetch:
                    rec = next(records)
                    pending.append(pool.submit(prepare_training_example, rec, self.cfg,
                                               np.random.default_rng(next(seeds))))
                examples = [pending.popleft().result() for _ in range(bs)]
                yield collate_training_batch(examples, self.cfg, rng)


def prepare_test_image(image: np.ndarray, cfg) -> tuple[np.ndarray, np.ndarray, tuple]:
    """Resize for inference; returns the padded ``[1, H, W, 3]`` batch, ``image_hw [1, 2]`` and the scale."""
    resized, scale = augment.resize_shorter_side(image, cfg.PREPROC.TEST_SHORT_EDGE_SIZE, cfg.PREPROC.MAX_SIZE)
    h, w = resized.shape[:2]
    hp, wp = padded_size(h, w)
    batch = np.zeros((1, hp, wp, 3), np.float32)
    batch[0, :h, :w] = resized
    return batch, np.asarray([[h, w]], np.int32), scale


def iterate_test_images(paths: list, *, num_workers: int = 2, ahead: int = 4):
    """Yield ``(index, RGB image)`` in order, decoding up to ``ahead`` images in threads."""
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
