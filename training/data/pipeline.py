"""Input pipelines: COCO records -> augmented, padded batches with RPN targets.

Every per-image step (decode, resize, flip, masks, RPN targets) runs in ``DATA.NUM_WORKERS``
worker processes (``training.data.workers``: fresh interpreters without TensorFlow, never forks of
the trainer), each writing its image straight into a shared batch buffer; ``NUM_WORKERS=0`` does
the same work in this process (for debuggers and profilers). Batches leave as the model takes
them: BGR uint8 images and bit-packed masks (``training.data.packed_masks``), a small fraction
of float32 images and byte masks. Which images form a batch, and their random draws, follow from
(seed, rank, step) alone (``training.data.batch_order``): ranks see different images, a resumed run
continues the sequence, and the worker count changes nothing.
"""
from __future__ import annotations

import collections
import concurrent.futures
import itertools
import logging
import mmap
import os
import sys

import cv2
import numpy as np
from tensorpack.dataflow import DataFlow

from training.data import augment
from training.data.batch_layout import AnchorCache, BatchLayout, anchor_count, fill_slot, place_example
from training.data.batch_order import BatchOrder, orientation_groups
# the per-image steps live in training.data.examples (TensorFlow-free, for the workers); re-exported
from training.data.examples import (SIZE_DIVISOR, Augmentation, ImageReadError, batch_padded_size,  # noqa: F401
                                    draw_augmentation, padded_size, prepare_training_example, read_image)
from training.data.examples import packed_polygon_mask as _packed_polygon_mask  # noqa: F401
from training.data.workers import WorkerPool

log = logging.getLogger(__name__)


def _plan_layout(sizes: list[tuple[int, int]], num_gt: list[int], cfg) -> BatchLayout:
    hp, wp = batch_padded_size(sizes, cfg)
    return BatchLayout(batch=len(sizes), height=hp, width=wp, max_gt=max(1, max(num_gt)),
                       num_anchors=anchor_count(cfg, hp, wp), rpn_samples=cfg.RPN.BATCH_PER_IM,
                       mask=bool(cfg.MODE_MASK))


def _write_header(arrays: list[np.ndarray], layout: BatchLayout, sizes, num_gt) -> None:
    arrays[1][:] = np.asarray(sizes, np.int32).reshape(-1, 2)   # image_hw
    arrays[4][:] = np.asarray(num_gt, np.int32)                  # num_gt
    arrays[6][:] = layout.num_anchors                            # num_anchors: the graph checks its own count against it


def collate_training_batch(examples: list[dict], cfg, rng: np.random.Generator) -> list[np.ndarray]:
    """Pad prepared examples into the model's training inputs (see MaskRCNN.inputs), in this thread."""
    sizes = [e["image"].shape[:2] for e in examples]
    num_gt = [int((~e["is_crowd"]).sum()) for e in examples]
    layout = _plan_layout(sizes, num_gt, cfg)
    arrays = layout.views(np.zeros(layout.nbytes, np.uint8))
    _write_header(arrays, layout, sizes, num_gt)
    anchors = AnchorCache(cfg, size=1).get(layout.height, layout.width)
    for i, e in enumerate(examples):
        place_example(arrays, i, e, rng, anchors, cfg)
    return arrays


class _SharedBuffer:
    """An anonymous shared-memory file (memfd) that this process and the workers map once and reuse
    for batch after batch: pages written once stay allocated, so neither side pays page faults
    per batch (a fresh buffer per batch made every written page a fault on both sides)."""

    _ids = itertools.count()

    def __init__(self, capacity: int):
        if not hasattr(os, "memfd_create"):
            raise RuntimeError("input worker processes need Linux (memfd_create); set DATA.NUM_WORKERS=0 to "
                               "prepare images in the training process on this system")
        self.id = next(self._ids)
        self.capacity = capacity
        self.fd = os.memfd_create(f"maskrcnn-batch-{self.id}", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, capacity)
        self.map = mmap.mmap(self.fd, capacity)

    def in_use(self) -> bool:
        # every array over the buffer (the yielded batch, any view a consumer keeps, TensorFlow's
        # feed) holds a reference to the mapping: only ours (and the argument) left means free
        return sys.getrefcount(self.map) > 2

    def release(self) -> None:
        """Drop the descriptor; the memory goes when the last mapping (arrays, workers) does."""
        os.close(self.fd)


class _BufferRing:
    """Shared batch buffers, reused once nothing refers to their arrays; at most ``keep`` idle ones."""

    def __init__(self, keep: int):
        self.keep = keep
        self.largest = 0
        self.buffers: list[_SharedBuffer] = []

    def take(self, nbytes: int) -> _SharedBuffer:
        free = sorted((b for b in self.buffers if not b.in_use()), key=lambda b: b.capacity)
        fits = [b for b in free if b.capacity >= nbytes]
        # idle buffers too small for this batch go (a new one sized for the largest batch seen
        # replaces them), and idle ones beyond ``keep``
        drop = [b for b in free if b.capacity < nbytes] if not fits else free[:max(0, len(free) - self.keep)]
        for buffer in drop:
            self.buffers.remove(buffer)
            buffer.release()
        fits = [b for b in fits if b not in drop]
        if fits:
            return fits[0]
        buffer = _SharedBuffer(max([nbytes, self.largest]))
        self.largest = buffer.capacity
        self.buffers.append(buffer)
        return buffer

    def live_ids(self) -> tuple[int, ...]:
        return tuple(b.id for b in self.buffers)

    def close(self) -> None:
        for buffer in self.buffers:
            buffer.release()
        self.buffers = []


class _Batch:
    """A planned batch: its arrays (over a shared buffer, or this process's memory), the tasks left."""

    def __init__(self, layout: BatchLayout, sizes, num_gt, buffer):
        self.arrays = layout.views(buffer)
        _write_header(self.arrays, layout, sizes, num_gt)
        self.tasks_left: set = set()


class TrainingBatches(DataFlow):
    """Endless shuffled training batches of ``BATCH_SIZE_PER_GPU`` images for one rank.

    This process plans: it picks each batch's images (``BatchOrder``: landscape and portrait
    images in separate batches unless ``DATA.ASPECT_RATIO_GROUPING`` is off), draws every image's
    resize and flip (so the batch's padded shape, anchor count and buffer are known before any
    image is read) and hands each image to a worker process with its own random generator, which
    reads, augments and writes the image, its ground truth, packed masks and sampled RPN targets
    into the batch's slot in shared memory. Batches come out in the planned order, so they are
    fixed by (seed, rank) whatever the number of workers (``NUM_WORKERS=0``: all in this
    process); ``start_step`` S starts at the batch an uninterrupted run gives at step S. At most
    ``batches_ahead`` batches are in flight (bounded host memory). Workers start when iteration
    starts and stop when the iterator is closed or collected, on an error, or with this process.
    """

    def __init__(self, roidb: list[dict], cfg, *, seed: int, rank: int = 0, start_step: int = 0,
                 batches_ahead: int = 0):
        if not roidb:
            raise ValueError("the training set is empty: no image has a usable annotation")
        self.roidb = roidb
        self.cfg = cfg
        self.start_step = start_step
        bs = cfg.TRAIN.BATCH_SIZE_PER_GPU
        groups = orientation_groups(roidb) if cfg.DATA.ASPECT_RATIO_GROUPING else np.zeros(len(roidb), np.int8)
        self.order = BatchOrder(groups, bs, seed=seed, rank=rank)
        # enough images in flight to keep every worker busy while the oldest batch completes
        self.batches_ahead = batches_ahead or 1 + -(-2 * cfg.DATA.NUM_WORKERS // bs)

    def __len__(self):
        return len(self.roidb) // self.cfg.TRAIN.BATCH_SIZE_PER_GPU

    def plans(self):
        """Endless ``(layout, sizes, num_gt, [(slot, record, augmentation, rng), ...])`` from
        ``start_step`` on; no image is read."""
        cfg = self.cfg
        for n, images in enumerate(self.order.batches(self.start_step)):
            if n == 0 and self.start_step:
                log.info("the input continues at step %d, in pass %d over the training images",
                         self.start_step, images[0][0] + 1)
            picked = [self.roidb[index] for _, index in images]
            rngs = [self.order.image_rng(pass_no, index) for pass_no, index in images]
            augs = [draw_augmentation(rec, cfg, r) for rec, r in zip(picked, rngs)]  # advances each rng
            sizes = [(a.height, a.width) for a in augs]
            num_gt = [int(np.sum(np.asarray(r["is_crowd"]) == 0)) for r in picked]
            yield (_plan_layout(sizes, num_gt, cfg), sizes, num_gt,
                   [(i, rec, aug, r) for i, (rec, aug, r) in enumerate(zip(picked, augs, rngs))])

    def __iter__(self):
        if self.cfg.DATA.NUM_WORKERS == 0:
            yield from self._in_process()
            return
        pool = WorkerPool(self.cfg.DATA.NUM_WORKERS, self.cfg)
        # idle buffers kept: enough for every batch in flight and one the consumer holds
        ring = _BufferRing(keep=self.batches_ahead + 1)
        pending: collections.deque[_Batch] = collections.deque()
        owner: dict[int, _Batch] = {}
        keys = itertools.count()
        plans = self.plans()
        try:
            while True:
                while len(pending) < self.batches_ahead:
                    layout, sizes, num_gt, tasks = next(plans)
                    buffer = ring.take(layout.nbytes)
                    batch = _Batch(layout, sizes, num_gt, buffer.map)
                    pending.append(batch)
                    for slot, record, aug, rng in tasks:
                        key = next(keys)
                        owner[key] = batch
                        batch.tasks_left.add(key)
                        task = (buffer.id, buffer.capacity, ring.live_ids(), slot, layout, record, aug, rng)
                        pool.submit(key, buffer.fd, task, record["file_name"])
                oldest = pending[0]
                while oldest.tasks_left:
                    for key in pool.wait_done():
                        owner.pop(key).tasks_left.discard(key)
                yield pending.popleft().arrays
        finally:
            pool.close()
            ring.close()

    def _in_process(self):
        # Parallelism comes from the ranks sharing a node: OpenCV's own pool per call would put
        # ranks x cores threads on the cores.
        cv2.setNumThreads(1)
        anchors = AnchorCache(self.cfg)
        for layout, sizes, num_gt, tasks in self.plans():
            batch = _Batch(layout, sizes, num_gt, np.zeros(layout.nbytes, np.uint8))
            for slot, record, aug, rng in tasks:
                fill_slot(batch.arrays, slot, record, aug, rng, anchors.get(layout.height, layout.width), self.cfg)
            yield batch.arrays


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
