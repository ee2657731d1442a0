"""The input worker processes: same batches whatever their number, errors that name the image,
no worker outliving the pipeline (closed, collected, failed, interrupted, or its process killed),
no TensorFlow in a worker even when the trainer's main module imports it."""
import gc
import itertools
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from training.config import finalize, new_config
from training.configs.cpu_synthetic import OVERRIDES

from machine import child_pids

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    from training.data.synthetic import SyntheticSpec, generate
    out = tmp_path_factory.mktemp("shapes")
    generate(out, SyntheticSpec(train=7, val=1, size=80, min_object_size=16, max_object_size=40, seed=4))
    return out


@pytest.fixture(scope="module")
def split(data_dir):
    from training.data.coco import load_split
    return load_split(data_dir, "train2017")


def _cfg(split, workers: int, *extra):
    cfg = new_config()
    # a range of short edges: consecutive batches differ in shape, so reused buffers must be cleared
    cfg.update_args(OVERRIDES + ["PREPROC.TRAIN_SHORT_EDGE_SIZE=[40, 120]", "PREPROC.TEST_SHORT_EDGE_SIZE=80",
                                 "PREPROC.MAX_SIZE=130", "TRAIN.BATCH_SIZE_PER_GPU=2",
                                 f"DATA.NUM_WORKERS={workers}", *extra])
    return finalize(cfg, num_ranks=1, class_names=split.class_names, has_gpu=False)


def _alive(pid: int) -> bool:
    try:  # a zombie has exited: only its parent has not collected it yet
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_gone(pids, timeout: float = 10.0) -> set[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)
    return {p for p in pids if _alive(p)}


def test_same_batches_for_any_worker_count(split):
    """Fixed by the seed: in-process, 1 and 2 workers give identical batches, also when the consumer
    drops each batch (its shared buffer is reused) and when it keeps them all (it must not be)."""
    from training.data.pipeline import TrainingBatches
    roidb = split.training_roidb()
    expected = [[a.copy() for a in batch]
                for batch in itertools.islice(iter(TrainingBatches(roidb, _cfg(split, 0), seed=11)), 10)]
    shapes = {batch[0].shape for batch in expected}
    assert len(shapes) > 1  # buffer reuse across different layouts is exercised
    for workers in (1, 2):
        one_at_a_time = iter(TrainingBatches(roidb, _cfg(split, workers), seed=11))
        for want, got in zip(expected, one_at_a_time):
            for u, v in zip(want, got):
                assert u.dtype == v.dtype
                np.testing.assert_array_equal(u, v)
        one_at_a_time.close()
    kept = list(itertools.islice(iter(TrainingBatches(roidb, _cfg(split, 2), seed=11)), 10))
    for want, got in zip(expected, kept):
        for u, v in zip(want, got):
            np.testing.assert_array_equal(u, v)


def test_a_resumed_pipeline_with_workers_continues_the_sequence(split):
    """Started at step 5 with 2 workers: the batches an uninterrupted in-process run gives at steps 5, 6."""
    from training.data.pipeline import TrainingBatches
    roidb = split.training_roidb()
    expected = [[a.copy() for a in batch]
                for batch in itertools.islice(iter(TrainingBatches(roidb, _cfg(split, 0), seed=11, rank=3)), 7)]
    resumed = iter(TrainingBatches(roidb, _cfg(split, 2), seed=11, rank=3, start_step=5))
    for want, got in zip(expected[5:], resumed):
        for u, v in zip(want, got):
            np.testing.assert_array_equal(u, v)
    resumed.close()


def test_workers_stop_when_the_iterator_is_closed_or_collected(split):
    from training.data.pipeline import TrainingBatches
    before = child_pids(os.getpid())
    it = iter(TrainingBatches(split.training_roidb(), _cfg(split, 2), seed=1))
    next(it)
    workers = child_pids(os.getpid()) - before
    assert len(workers) == 2
    it.close()
    assert not _wait_gone(workers)

    it = iter(TrainingBatches(split.training_roidb(), _cfg(split, 2), seed=1))
    next(it)
    workers = child_pids(os.getpid()) - before
    assert len(workers) == 2
    del it
    gc.collect()
    assert not _wait_gone(workers)


def test_a_worker_error_names_the_image_and_stops_the_workers(split, tmp_path):
    from training.data.pipeline import TrainingBatches
    from training.data.workers import InputWorkerError
    roidb = [dict(r) for r in split.training_roidb()]
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not a png")
    for record in roidb:
        record["file_name"] = str(broken)
    before = child_pids(os.getpid())
    it = iter(TrainingBatches(roidb, _cfg(split, 2), seed=1))
    with pytest.raises(InputWorkerError) as err:
        next(it)
    message = str(err.value)
    # the image, the worker's own traceback (where it failed), the original error
    assert str(broken) in message and "Traceback" in message and "examples.py" in message
    assert "ImageReadError: cannot read image" in message
    assert not _wait_gone(child_pids(os.getpid()) - before)


def test_a_dead_worker_is_reported(split):
    from training.data.pipeline import TrainingBatches
    from training.data.workers import InputWorkerError
    before = child_pids(os.getpid())
    it = iter(TrainingBatches(split.training_roidb(), _cfg(split, 1), seed=1))
    next(it)
    (worker,) = child_pids(os.getpid()) - before
    os.kill(worker, signal.SIGKILL)
    with pytest.raises(InputWorkerError, match="killed by signal 9 while preparing"):
        for _ in range(20):
            next(it)


_CHILD = """
import os, signal, sys, time
# Python's Ctrl-C handler, as a trainer started from a terminal has it: a child of a background
# shell job (CI runners, `nohup ... &`) inherits SIGINT ignored, and Python then keeps ignoring it
signal.signal(signal.SIGINT, signal.default_int_handler)
{preamble}
from training.config import finalize, new_config
from training.configs.cpu_synthetic import OVERRIDES
from training.data.coco import load_split
from training.data.pipeline import TrainingBatches
split = load_split({data!r}, "train2017")
cfg = new_config()
cfg.update_args(OVERRIDES + ["DATA.NUM_WORKERS=2", "TRAIN.BATCH_SIZE_PER_GPU=2"])
finalize(cfg, num_ranks=1, class_names=split.class_names, has_gpu=False)
it = iter(TrainingBatches(split.training_roidb(), cfg, seed=0))
next(it)
print("ready", flush=True)
while True:
    next(it)
    time.sleep(0.05)
"""


def _start_child(tmp_path, data_dir, preamble: str = "", module: str = "pipeline_child") -> subprocess.Popen:
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(_CHILD).format(preamble=preamble, data=str(data_dir)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO)]))
    # run as a module, as horovodrun / mpirun start the trainer (python -m training.train)
    child = subprocess.Popen([sys.executable, "-m", module], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                             start_new_session=True, text=True)
    assert child.stdout.readline().strip() == "ready"
    return child


def test_ctrl_c_stops_the_workers(tmp_path, data_dir):
    child = _start_child(tmp_path, data_dir)
    try:
        workers = child_pids(child.pid)
        assert len(workers) == 2
        os.killpg(child.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground group
        child.wait(timeout=30)
        assert not _wait_gone(workers)
    finally:
        child.kill()


def test_workers_die_with_a_killed_parent_and_never_load_tensorflow(tmp_path, data_dir):
    # the main module imports TensorFlow at its top: the workers still never load it
    child = _start_child(tmp_path, data_dir, preamble="from training.compat import tf  # noqa", module="tf_main")
    try:
        workers = child_pids(child.pid)
        assert len(workers) == 2
        assert "tensorflow" in Path(f"/proc/{child.pid}/maps").read_text()
        for pid in workers:
            assert "tensorflow" not in Path(f"/proc/{pid}/maps").read_text()
        child.kill()  # SIGKILL: no clean-up code runs in the parent
        child.wait(timeout=30)
        assert not _wait_gone(workers)
    finally:
        child.kill()
