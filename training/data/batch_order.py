"""Which images form each training batch of a rank, and each image's random generator: a function
of (seed, rank, step) alone, so a resumed run continues where the interrupted one stopped.

Each pass over the data is a fresh permutation of the images, drawn from (seed, rank, pass); the
images go through the passes one after another (a pass is not a training "epoch", which is
TRAIN.IMAGES_PER_EPOCH images). With aspect-ratio grouping (detectron2's default,
``AspectRatioGroupedDataset``) each image goes into the bucket of its orientation
(landscape: width > height; portrait and square) and a batch is emitted when a bucket holds
``batch_size`` images, so portrait and landscape images never share a batch and none is padded to
the other's shape. A part-filled bucket carries over into the next pass: every image is used once
per pass. Without grouping there is one bucket.

An image's augmentation and RPN sampling draw from a generator of (seed, rank, pass, image), not
from one stream shared with the images before it: starting at step S gives the batches, draws
included, that an uninterrupted run gives from step S on. Getting there replays only the
permutations and bucket counts (whole passes at once, ~0.3 s for 720k steps of 4 COCO images),
never an augmentation.
"""
from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np

# SeedSequence entropy: (seed, rank, stream, pass[, image]); the stream tag keeps the permutation's
# generator and the images' generators apart.
_PERMUTATION, _IMAGE = 0, 1


def orientation_groups(roidb: list[dict]) -> np.ndarray:
    """0 for a landscape image (width > height), 1 otherwise: detectron2's two buckets."""
    return np.array([0 if int(r["width"]) > int(r["height"]) else 1 for r in roidb], np.int8)


class BatchOrder:
    """The endless sequence of one rank's batches, as lists of ``(pass, image index)``."""

    def __init__(self, groups: np.ndarray, batch_size: int, *, seed: int, rank: int = 0):
        """``groups``: a bucket number per image (all 0: no grouping)."""
        if seed < 0 or rank < 0:
            raise ValueError(f"seed and rank must be >= 0, got {seed} and {rank}")
        self.groups = np.asarray(groups, np.int64)
        self.num_groups = int(self.groups.max()) + 1 if len(self.groups) else 1
        self.batch_size = batch_size
        self.seed, self.rank = seed, rank

    def permutation(self, pass_no: int) -> np.ndarray:
        return np.random.default_rng((self.seed, self.rank, _PERMUTATION, pass_no)).permutation(len(self.groups))

    def image_rng(self, pass_no: int, index: int) -> np.random.Generator:
        return np.random.default_rng((self.seed, self.rank, _IMAGE, pass_no, index))

    def batches(self, start_step: int = 0) -> Iterator[list[tuple[int, int]]]:
        """Batches ``start_step``, ``start_step + 1``, ... of the sequence that starts at step 0."""
        bs = self.batch_size
        buckets: list[list[tuple[int, int]]] = [[] for _ in range(self.num_groups)]
        step = 0
        for pass_no in itertools.count():
            order = self.permutation(pass_no)
            groups = self.groups[order]
            members = [order[groups == g] for g in range(self.num_groups)]
            completed = sum((len(b) + len(m)) // bs for b, m in zip(buckets, members))
            if step + completed <= start_step:  # every batch this pass completes comes before start_step
                for g, (bucket, m) in enumerate(zip(buckets, members)):
                    left = (len(bucket) + len(m)) % bs       # < bs: only the last bs entries matter
                    tail = bucket + [(pass_no, int(i)) for i in m[-bs:]]
                    buckets[g] = tail[len(tail) - left:] if left else []
                step += completed
                continue
            for index, g in zip(order.tolist(), groups.tolist()):
                buckets[g].append((pass_no, index))
                if len(buckets[g]) == bs:
                    if step >= start_step:
                        yield buckets[g]
                    buckets[g] = []
                    step += 1
