"""Training callbacks: progress lines, SageMaker metric lines, COCO evaluation, checkpoints, resume.

Checkpoints are TensorFlow Saver checkpoints in the log dir (tensorpack's ModelSaver): the data
and index files are written first and the ``checkpoint`` state file, which names the latest
checkpoint, is replaced atomically (temp file + rename) afterwards, so a crash mid-save leaves
the previous checkpoint as the latest. ``resume_step`` finds where to continue.
"""
from __future__ import annotations

import json
import logging
import os
import time

import numpy as np
from tensorpack.callbacks import Callback

from training import evaluation
from training.compat import tf, tf1
from training.metrics import TRAINING_METRICS, format_metric

log = logging.getLogger(__name__)

EVAL_RESULTS_FILE = "eval_results.json"   # every evaluation, appended (rank 0)
CONFIG_FILE = "config.json"               # the finalized config of the run (rank 0)


def _print(line: str) -> None:
    print(line, flush=True)


def _duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


# ------------------------------------------------------------------------------------------ resume
def latest_checkpoint(logdir: str) -> str | None:
    """The newest complete checkpoint that the ``checkpoint`` state file in ``logdir`` lists.

    The state file is only replaced (atomically) after a checkpoint's files are written; should
    the files of the newest entry be gone anyway (deleted, a partial copy), the previous one is used.
    """
    if not logdir or not os.path.isdir(logdir):
        return None
    state = tf1.train.get_checkpoint_state(logdir)
    if state is None:
        return None
    candidates = [state.model_checkpoint_path] + list(reversed(state.all_model_checkpoint_paths))
    for path in candidates:
        # get_checkpoint_state has already prefixed relative entries with logdir (joining again
        # broke relative log dirs such as runs/r1); an absolute entry written on another machine
        # (a copied log dir) is looked up by its file name here.
        for path in (path, os.path.join(logdir, os.path.basename(path))) if path else ():
            if os.path.exists(path + ".index") and tf1.train.checkpoint_exists(path):
                return path
    return None


def checkpoint_step(path: str) -> int:
    return int(tf.train.load_variable(path, "global_step"))


def resume_step(logdir: str) -> tuple[str | None, int]:
    """``(checkpoint path, global step)`` to continue from, or ``(None, 0)`` for a fresh run."""
    path = latest_checkpoint(logdir)
    return (path, checkpoint_step(path)) if path else (None, 0)


# ------------------------------------------------------------------------------------------ progress
class ProgressLogger(Callback):
    """Every LOG_PERIOD steps: step, epoch, losses, images/s and time left (rank 0).

    At each epoch end, the epoch's mean of every training metric of :mod:`training.metrics`, one
    :func:`training.metrics.format_metric` line each (what SageMaker's regexes scrape).
    """

    def __init__(self, stats, *, period: int, global_batch: int, max_steps: int, steps_per_epoch: int):
        """``stats``: ``{metric name: tensor}``, or a function returning it once the graph is built."""
        self._stats = stats
        self._period = period
        self._global_batch = global_batch
        self._max_steps = max_steps
        self._steps_per_epoch = steps_per_epoch

    def _setup_graph(self):
        stats = self._stats() if callable(self._stats) else self._stats
        self._names = list(stats)
        self._fetches = [stats[n] for n in self._names]
        self._lr = tf1.get_default_graph().get_tensor_by_name("learning_rate:0")

    def _before_train(self):
        self._start_time = time.time()
        self._start_step = self.global_step
        self._sums = {n: 0.0 for n in self._names}
        self._count = 0

    def _before_run(self, _):
        return tf1.train.SessionRunArgs(fetches=self._fetches + [self._lr])

    def _after_run(self, _, run_values):
        values = run_values.results
        for n, v in zip(self._names, values):
            self._sums[n] += float(v)
        self._count += 1
        step = self.global_step  # MaintainStepCounter (registered first) has counted the step that just ran
        if step % self._period and step != self._max_steps:
            return
        elapsed = time.time() - self._start_time
        done = step - self._start_step
        rate = done * self._global_batch / max(elapsed, 1e-9)
        eta = (self._max_steps - step) * elapsed / max(done, 1)
        current = dict(zip(self._names, values))
        losses = " ".join(f"{n}={current[n]:.4f}" for n in self._names if n.endswith("loss") or n == "total_cost")
        _print(f"step {step}/{self._max_steps} epoch {step // self._steps_per_epoch + (1 if step % self._steps_per_epoch else 0)}"
               f" | {losses} | lr={values[-1]:.5f} | {rate:.2f} images/s | elapsed {_duration(elapsed)}"
               f" | ETA {_duration(eta)}")

    def _trigger_epoch(self):
        if not self._count:
            return
        for name in TRAINING_METRICS:
            if name in self._sums:
                value = self._sums[name] / self._count
                _print(format_metric(name, value))
                self.trainer.monitors.put_scalar(f"epoch_mean/{name}", value)
        self._sums = {n: 0.0 for n in self._names}
        self._count = 0


# ------------------------------------------------------------------------------------------ evaluation
def _evaluated_records(split, max_images: int) -> list[dict]:
    return split.roidb[:max_images] if max_images else split.roidb


def evaluate_split(split, detections: list[dict], cfg, *, max_images: int = 0) -> dict[str, float]:
    """COCOeval (bbox, and segm for a mask model) of ``detections`` on the images ``predict_split``
    covers; prints one metric line per figure (what SageMaker's regexes read) and the mAP table."""
    iou_types = ("bbox", "segm") if cfg.MODE_MASK else ("bbox",)
    ids = [r["image_id"] for r in _evaluated_records(split, max_images)]
    results = evaluation.evaluate(split, detections, iou_types=iou_types, image_ids=ids)
    for line in evaluation.metric_lines(results):
        _print(line)
    _print(evaluation.format_table(results))
    return results


def predict_split(predict_fn, split, cfg, *, rank: int = 0, size: int = 1, max_images: int = 0) -> list[dict]:
    """COCO result dicts for this rank's share (every ``size``-th image from ``rank``) of ``split``."""
    from training.data.pipeline import iterate_test_images
    from training.inference import detect

    mine = _evaluated_records(split, max_images)[rank::size]
    results = []
    for idx, image in iterate_test_images([r["file_name"] for r in mine], num_workers=cfg.DATA.NUM_WORKERS):
        det = detect(predict_fn, image, cfg)
        results += evaluation.detections_to_coco(mine[idx]["image_id"], det["boxes"], det["scores"], det["labels"],
                                                 det["masks"], split.contiguous_to_coco_id)
    return results


class COCOEvaluator(Callback):
    """COCO evaluation every EVAL_PERIOD epochs and after the last, on all ranks.

    Each rank predicts its share of the validation images; detections are gathered to rank 0
    through Horovod (no shared file system), which runs COCOeval, prints one SageMaker metric line
    per figure plus the mAP table, and appends the figures to ``eval_results.json``.
    """

    chief_only = False

    def __init__(self, cfg, val_split, *, logdir: str | None, rank: int, size: int):
        self.cfg = cfg
        self.split = val_split
        self.logdir = logdir
        self.rank = rank
        self.size = size

    def _setup_graph(self):
        from training.model.generalized_rcnn import INPUT_NAMES_PREDICT, OUTPUT_NAMES
        predictor = self.trainer.get_predictor(list(INPUT_NAMES_PREDICT), list(OUTPUT_NAMES))
        self._predict = lambda images, image_hw: predictor(images, image_hw)

    def _due(self) -> bool:
        period = self.cfg.TRAIN.EVAL_PERIOD
        return self.epoch_num == self.cfg.TRAIN.MAX_EPOCH or (period > 0 and self.epoch_num % period == 0)

    def _trigger_epoch(self):
        if self._due():
            self.run()

    def run(self) -> dict | None:
        start = time.time()
        local = predict_split(self._predict, self.split, self.cfg, rank=self.rank, size=self.size,
                              max_images=self.cfg.TRAIN.EVAL_MAX_IMAGES)
        everything = evaluation.gather_detections(local)
        if self.rank != 0:
            return None
        results = evaluate_split(self.split, everything, self.cfg, max_images=self.cfg.TRAIN.EVAL_MAX_IMAGES)
        count = len(_evaluated_records(self.split, self.cfg.TRAIN.EVAL_MAX_IMAGES))
        _print(f"evaluation of {count} images took {time.time() - start:.1f}s")
        for name, value in results.items():
            self.trainer.monitors.put_scalar(name, value)
        if self.logdir:
            path = os.path.join(self.logdir, EVAL_RESULTS_FILE)
            history = json.load(open(path)) if os.path.exists(path) else []
            history.append({"epoch": self.epoch_num, "global_step": int(self.global_step), **results})
            tmp = path + ".tmp"
            with open(tmp, "w") as f:
                json.dump(history, f, indent=1)
            os.replace(tmp, path)
        return results
