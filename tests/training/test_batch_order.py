"""Which images form each batch: one orientation per batch, every image once per pass over the data, and a
sequence that starts at any step exactly where the uninterrupted one is at that step."""
import collections
import itertools

import numpy as np
import pytest

from training.data.batch_order import BatchOrder, orientation_groups

# (width, height) of 11 images: 6 landscape (width > height), 4 portrait and a square one, which
# detectron2's w > h rule puts with the portrait images
SIZES = [(640, 480), (480, 640), (500, 375), (640, 427), (427, 640), (640, 640), (640, 512), (375, 500),
         (640, 480), (480, 640), (612, 612 - 1)]
LANDSCAPE = {0, 2, 3, 6, 8, 10}
RECORDS = [{"width": w, "height": h} for w, h in SIZES]


def _passes(batches, passes):
    """For each of the first ``passes`` passes, how often each image appears in ``batches``."""
    counts = [collections.Counter() for _ in range(passes)]
    for batch in batches:
        for pass_no, index in batch:
            if pass_no < passes:
                counts[pass_no][index] += 1
    return counts


@pytest.mark.parametrize("batch_size", [2, 3, 4])
def test_grouped_batches_hold_one_orientation_and_every_image_once_per_pass(batch_size):
    order = BatchOrder(orientation_groups(RECORDS), batch_size, seed=5, rank=1)
    batches = list(itertools.islice(order.batches(), 60))   # 120-240 images, 10 passes or more
    for batch in batches:
        indices = {index for _, index in batch}
        assert len(batch) == batch_size
        assert indices <= LANDSCAPE or not indices & LANDSCAPE, batch
    # the first 8 passes are complete (a part-filled bucket only holds the last few images)
    for counts in _passes(batches, 8):
        assert counts == collections.Counter(range(len(SIZES)))


def test_without_grouping_batches_mix_orientations_and_keep_every_image_once_per_pass():
    order = BatchOrder(np.zeros(len(SIZES), np.int8), 3, seed=5, rank=1)
    batches = list(itertools.islice(order.batches(), 40))
    assert any({i for _, i in b} & LANDSCAPE and {i for _, i in b} - LANDSCAPE for b in batches)
    for counts in _passes(batches, 8):
        assert counts == collections.Counter(range(len(SIZES)))


def test_ranks_and_seeds_give_different_orders():
    groups = orientation_groups(RECORDS)
    first = [list(itertools.islice(BatchOrder(groups, 2, seed=s, rank=r).batches(), 6)) for s, r in
             [(5, 0), (5, 1), (6, 0)]]
    assert first[0] != first[1] and first[0] != first[2]


@pytest.mark.parametrize("grouping", [True, False])
@pytest.mark.parametrize("batch_size", [1, 3, 4, 13])
def test_a_sequence_started_at_step_s_is_the_uninterrupted_one_from_s(batch_size, grouping):
    groups = orientation_groups(RECORDS) if grouping else np.zeros(len(SIZES), np.int8)
    order = BatchOrder(groups, batch_size, seed=9, rank=2)
    uninterrupted = list(itertools.islice(order.batches(), 80))
    # steps within the first pass, at pass boundaries and many passes in (whole passes skipped)
    for step in range(0, 70):
        assert list(itertools.islice(order.batches(step), 5)) == uninterrupted[step:step + 5], step


def test_an_images_generator_depends_on_its_pass_and_index_only():
    order = BatchOrder(orientation_groups(RECORDS), 2, seed=9, rank=2)
    again = BatchOrder(orientation_groups(RECORDS), 2, seed=9, rank=2)
    draw = order.image_rng(3, 7).random(4)
    np.testing.assert_array_equal(draw, again.image_rng(3, 7).random(4))
    assert not np.array_equal(draw, order.image_rng(3, 8).random(4))
    assert not np.array_equal(draw, order.image_rng(4, 7).random(4))
