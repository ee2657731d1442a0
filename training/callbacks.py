"""Training callbacks: progress lines, SageMaker metric lines, COCO evaluation, checkpoints, resume,
the heartbeat and stopping on request.

Checkpoints are TensorFlow Saver checkpoints in the log dir (tensorpack's ModelSaver): the data
and index files are written first and the ``checkpoint`` state file, which names the latest
checkpoint, is replaced atomically (temp file + rename) afterwards, so a crash mid-save leaves
the previous checkpoint as the latest. ``resume_step`` finds where to continue. Every checkpoint
of a run (per epoch, per TRAIN.CHECKPOINT_MINUTES, at a stop) goes through one Saver
(:class:`Checkpoints`): one list of the newest ``max_to_keep`` and one state file naming them.
"""
from __future__ import annotations

import json
import logging
import os
import time

import numpy as np
from tensorpack.callbacks import Callback, ModelSaver, ProxyCallback
from tensorpack.train.base import StopTraining

from training import evaluation, stopping
from training.compat import tf, tf1
from training.metrics import TRAINING_METRICS, format_metric
from training.run_status import HEARTBEAT_FILE, HEARTBEAT_SECONDS, epoch_of, read_heartbeat  # noqa: F401
from training.run_status import write_heartbeat, write_stop_record

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


# ------------------------------------------------------------------------------------------ checkpoints
class Interval:
    """Whether ``seconds`` have passed since the last ``reset()`` on ``clock`` (monotonic; a test
    passes its own). ``seconds`` <= 0: never due."""

    def __init__(self, seconds: float, *, clock=time.monotonic):
        self.seconds = seconds
        self._clock = clock
        self._last = clock()

    def due(self) -> bool:
        return self.seconds > 0 and self._clock() - self._last >= self.seconds

    def reset(self) -> None:
        self._last = self._clock()


class Checkpoints(ProxyCallback):
    """Rank 0's checkpoints, all through one tensorpack ModelSaver, so one tf.train.Saver: one
    ``checkpoint`` state file names them, and it keeps the newest ``max_to_keep`` plus, of the older
    ones, one per half hour of the run for good (ModelSaver's keep_checkpoint_every_n_hours=0.5).
    Checkpoints are written

    - at the end of every ``every_epochs``-th epoch and of the last epoch;
    - after the step at which ``minutes`` have passed since the last checkpoint of this run (or
      since training started), 0 = never: a COCO epoch on 16 GPUs takes hours;
    - on request, :meth:`save` (the stop).

    A step is saved once: a timed checkpoint at an epoch's last step is that epoch's checkpoint.
    """

    def __init__(self, logdir: str, *, every_epochs: int, last_epoch: int, minutes: float, max_to_keep: int = 3,
                 clock=time.monotonic):
        super().__init__(ModelSaver(max_to_keep=max_to_keep, checkpoint_dir=logdir))
        self._logdir = logdir
        self._every_epochs = every_epochs
        self._last_epoch = last_epoch
        self._minutes = minutes
        self._timer = Interval(minutes * 60, clock=clock)
        self._saved_step: int | None = None
        self._saved_path: str | None = None

    def _before_train(self):
        self.cb.before_train()
        # A new Saver's list of checkpoints to keep starts empty: take over the state file's, or
        # every resumed run would leave its predecessor's checkpoints on disk, unlisted, for good.
        state = tf1.train.get_checkpoint_state(self._logdir)
        if state is not None:
            self.cb.saver.recover_last_checkpoints(list(state.all_model_checkpoint_paths))
        self._saved_step = self.global_step   # a resumed run's checkpoint holds this step already
        self._saved_path = latest_checkpoint(self._logdir)
        self._timer.reset()

    def _trigger_step(self):
        self.cb.trigger_step()
        if self._timer.due():
            _print(f"checkpoint at step {self.global_step}: {self._minutes:g} minutes since the last")
            self.save()

    def _trigger_epoch(self):
        if self.epoch_num % self._every_epochs == 0 or self.epoch_num == self._last_epoch:
            self.save()

    def _trigger(self):
        self.save()

    def save(self) -> str | None:
        """Checkpoint the current global step (once); its path, or None when the save failed
        (ModelSaver logs the error and training goes on; the previous checkpoint stays the latest)."""
        step = self.global_step
        if step != self._saved_step:
            self.cb.trigger()
            self._timer.reset()
            path = latest_checkpoint(self._logdir)
            if path is None or os.path.basename(path) != f"model-{step}":
                return None
            self._saved_step, self._saved_path = step, path
        return self._saved_path


class EpochSteps(Callback):
    """Sets how many steps each epoch runs, so a run ends exactly at ``max_steps`` (TRAIN.MAX_STEPS)
    and a resumed run's epochs fall where the uninterrupted run's do.

    Epoch ``e`` covers the steps after ``(e - 1) * steps_per_epoch`` up to ``e * steps_per_epoch``,
    and the last epoch (TRAIN.MAX_EPOCH, rounded up) stops at ``max_steps``: 360000 steps in epochs
    of 12500 are 28 full epochs and one of 10000, not 29 x 12500 = 362500. A run resumed at a step
    inside an epoch (a timed or stop checkpoint, or a resume on another global batch) first trains
    only the rest of that epoch. tensorpack's loop runs ``loop.steps_per_epoch`` steps per epoch and
    reads that count after ``before_epoch``; every rank sets it (the ranks must run the same steps).
    """

    chief_only = False

    def __init__(self, *, start_step: int, steps_per_epoch: int, max_steps: int):
        self._start = start_step
        self._spe = steps_per_epoch
        self._max = max_steps

    def steps_of_epoch(self, epoch: int) -> int:
        first = max((epoch - 1) * self._spe, self._start)
        return max(0, min(epoch * self._spe, self._max) - first)

    def _before_epoch(self):
        self.trainer.loop.steps_per_epoch = self.steps_of_epoch(self.epoch_num)


# ------------------------------------------------------------------------------------------ heartbeat, stop
class Heartbeat(Callback):
    """Rank 0 writes ``<logdir>/heartbeat.json`` (training.run_status) when training starts, after a
    step when ``seconds`` have passed since the last write, and at every epoch end: a watchdog that
    sees the step stop advancing can stop the run."""

    def __init__(self, logdir: str, *, steps_per_epoch: int, seconds: float = HEARTBEAT_SECONDS,
                 clock=time.monotonic):
        self._logdir = logdir
        self._spe = steps_per_epoch
        self._interval = Interval(seconds, clock=clock)

    def _beat(self):
        step = int(self.global_step)
        write_heartbeat(self._logdir, step=step, epoch=epoch_of(step, self._spe))
        self._interval.reset()

    def _before_train(self):
        self._beat()

    def _trigger_step(self):
        if self._interval.due():
            self._beat()

    def _trigger_epoch(self):
        self._beat()


class StopOnRequest(Callback):
    """Stops every rank after the same step once any rank was asked to stop (training.stopping),
    after rank 0 saved that step's checkpoint and wrote ``stopped.json``.

    Each step's run also sums every rank's "asked to stop" flag (a Horovod allreduce of one int32
    on the CPU, negotiated with the step's gradient allreduces), so every rank learns of a request
    after the same step and none is left waiting in a collective. Register it last: the other
    callbacks finish their work on that step first. ``stopped`` is then the step; the trainer's
    loop ends through tensorpack's StopTraining, which runs every callback's ``after_train``.
    """

    chief_only = False

    def __init__(self, *, checkpoints: Checkpoints, logdir: str, rank: int, steps_per_epoch: int):
        self._checkpoints = checkpoints
        self._logdir = logdir
        self._rank = rank
        self._spe = steps_per_epoch
        self._announced = False
        self._stop = False
        self.stopped: int | None = None
        self.record: dict | None = None

    def _setup_graph(self):
        import horovod.tensorflow as hvd
        with tf.device("/cpu:0"):
            self._mine = tf1.placeholder_with_default(tf.constant(0, tf.int32), shape=[], name="stop_requested")
            self._anyone = hvd.allreduce(self._mine, op=hvd.Sum, name="stop_requests")

    def _announce(self) -> None:
        if stopping.requested() and not self._announced:
            self._announced = True
            _print(f"[rank {self._rank}] {stopping.signal_name()} received: stopping after this step, with a "
                   f"checkpoint")

    def _before_run(self, _):
        self._announce()
        return tf1.train.SessionRunArgs(fetches=self._anyone, feed_dict={self._mine: int(stopping.requested())})

    def _after_run(self, _, run_values):
        self._stop = int(run_values.results) > 0

    def _trigger_step(self):
        if not self._stop:
            return
        # A signal that arrived while this step ran (after _before_run) is said here: another rank's
        # request in the same step already stops this one, so no next _before_run would say it.
        self._announce()
        step = int(self.global_step)
        self.stopped = step
        if self._rank == 0:
            path = self._checkpoints.save()
            self.record = write_stop_record(self._logdir, signal=stopping.signal_name(), step=step,
                                            epoch=epoch_of(step, self._spe),
                                            checkpoint=os.path.basename(path) if path else None)
        raise StopTraining(f"a stop was requested ({stopping.signal_name()}); stopped after step {step}")


# ------------------------------------------------------------------------------------------ progress
def gpu_segment(utilization: float | None, peak_bytes: int | None) -> str:
    """The progress line's GPU part (training.metrics' regexes read it); "" when neither is known."""
    if utilization is None and peak_bytes is None:
        return ""
    util = "n/a" if utilization is None else f"{utilization:.1f}"
    peak = "n/a" if peak_bytes is None else f"{peak_bytes / 2**30:.2f}"
    return f" | gpu {util}% {peak} GiB peak"


def amp_segment(loss_scale: float, skipped_steps: int) -> str:
    return f" | loss scale {loss_scale:g} skipped {skipped_steps}"


def announce_gpu_metrics(gpu) -> None:
    """Says once, at the start, that GPU metrics are missing and why."""
    if gpu.unavailable:
        _print(f"GPU metrics unavailable ({gpu.unavailable}): training without them")


class RankGpuLogger(Callback):
    """On a rank other than 0, every LOG_PERIOD steps: its own GPU's utilisation (one nvidia-smi sample,
    no background thread) and TensorFlow's peak memory there, in a line SageMaker's regexes do not
    read (they read rank 0's progress line). Says nothing where neither can be read."""

    chief_only = False

    def __init__(self, gpu, *, period: int, max_steps: int, rank: int):
        self._gpu, self._period, self._max_steps, self._rank = gpu, period, max_steps, rank

    def _before_train(self):
        self._utilization = self._gpu.window()

    def _trigger_step(self):
        step = self.global_step
        if step % self._period and step != self._max_steps:
            return
        utilization, peak = self._utilization.take(), self._gpu.peak_memory_bytes()
        if utilization is None and peak is None:
            return
        util = "n/a" if utilization is None else f"{utilization:.1f}%"
        memory = "n/a" if peak is None else f"{peak / 2**30:.2f} GiB"
        _print(f"rank {self._rank} GPU at step {step}: utilisation {util}, peak memory {memory}")


class ProgressLogger(Callback):
    """Every LOG_PERIOD steps: step, epoch, losses, images/s, time left, and where they exist the GPU's
    utilisation and peak memory (``gpu``: a started training.gpu_metrics.GpuMetrics) and the
    mixed-precision loss scale and skipped steps (rank 0).

    At each epoch end, the epoch's mean of every training metric of :mod:`training.metrics`, one
    :func:`training.metrics.format_metric` line each (what SageMaker's regexes scrape).
    """

    def __init__(self, stats, *, period: int, global_batch: int, max_steps: int, steps_per_epoch: int,
                 gpu=None):
        """``stats``: ``{metric name: tensor}``, or a function returning it once the graph is built."""
        self._stats = stats
        self._period = period
        self._global_batch = global_batch
        self._max_steps = max_steps
        self._steps_per_epoch = steps_per_epoch
        self._gpu = gpu

    def _setup_graph(self):
        from training.gradients import amp_tensors
        stats = self._stats() if callable(self._stats) else self._stats
        self._names = list(stats)
        self._fetches = [stats[n] for n in self._names]
        graph = tf1.get_default_graph()
        self._lr = graph.get_tensor_by_name("learning_rate:0")
        self._amp = amp_tensors(graph)

    def _before_train(self):
        self._start_time = time.time()
        self._start_step = self.global_step
        self._sums = {n: 0.0 for n in self._names}
        self._count = 0
        self._utilization = self._gpu.window() if self._gpu is not None else None

    def _before_run(self, _):
        return tf1.train.SessionRunArgs(fetches=[self._fetches, self._lr, self._amp])

    def _after_run(self, _, run_values):
        values, lr, amp = run_values.results
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
        gpu = (gpu_segment(self._utilization.take(), self._gpu.peak_memory_bytes())
               if self._gpu is not None else "")
        scaling = amp_segment(float(amp["loss_scale"]), int(amp["skipped_steps"])) if amp else ""
        _print(f"step {step}/{self._max_steps} epoch {step // self._steps_per_epoch + (1 if step % self._steps_per_epoch else 0)}"
               f" | {losses} | lr={lr:.5f} | {rate:.2f} images/s | elapsed {_duration(elapsed)}"
               f" | ETA {_duration(eta)}{gpu}{scaling}")

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


def evaluate_split(split, detections: list[dict], cfg, *, max_images: int = 0) -> tuple[dict[str, float], dict]:
    """COCOeval (bbox, and segm for a mask model) of ``detections`` on the images ``predict_split``
    covers; prints one metric line per figure (what SageMaker's regexes read) and the mAP table with
    the AP of each class. Returns the figures and the per-class APs (``evaluation.evaluate_with_classes``)."""
    iou_types = ("bbox", "segm") if cfg.MODE_MASK else ("bbox",)
    ids = [r["image_id"] for r in _evaluated_records(split, max_images)]
    results, per_class = evaluation.evaluate_with_classes(split, detections, iou_types=iou_types, image_ids=ids)
    for line in evaluation.metric_lines(results):
        _print(line)
    _print(evaluation.format_table(results, per_class))
    return results, per_class


def predict_split(predict_fn, split, cfg, *, rank: int = 0, size: int = 1, max_images: int = 0,
                  batch_size: int | None = None, on_image=None) -> list[dict]:
    """COCO result dicts for this rank's share (every ``size``-th image from ``rank``) of ``split``,
    in image order, ``batch_size`` images (default TEST.BATCH_SIZE) per session run.

    ``on_image(record, image, detections)``, if given, sees every image and its detections
    (training.predict draws them)."""
    from training.data.pipeline import iterate_test_images
    from training.inference import detect_all

    mine = _evaluated_records(split, max_images)[rank::size]
    per_image = {}
    images = iterate_test_images([r["file_name"] for r in mine], num_workers=cfg.DATA.NUM_WORKERS)
    for idx, image, det in detect_all(predict_fn, images, cfg, batch_size=batch_size):
        per_image[idx] = evaluation.detections_to_coco(mine[idx]["image_id"], det["boxes"], det["scores"],
                                                       det["labels"], det["masks"], split.contiguous_to_coco_id)
        if on_image is not None:
            on_image(mine[idx], image, det)
    return [r for idx in sorted(per_image) for r in per_image[idx]]


class COCOEvaluator(Callback):
    """COCO evaluation every EVAL_PERIOD epochs and after the last, on all ranks.

    Each rank predicts its share of the validation images; detections are gathered to rank 0
    through Horovod (no shared file system), which runs COCOeval, prints one SageMaker metric line
    per figure plus the mAP table, and appends the figures to ``eval_results.json`` (the AP of each
    class under ``"per_class_AP"``: ``{"bbox": {class name: AP}, "segm": {...}}``).
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
        results, per_class = evaluate_split(self.split, everything, self.cfg,
                                            max_images=self.cfg.TRAIN.EVAL_MAX_IMAGES)
        count = len(_evaluated_records(self.split, self.cfg.TRAIN.EVAL_MAX_IMAGES))
        _print(f"evaluation of {count} images took {time.time() - start:.1f}s")
        for name, value in results.items():
            self.trainer.monitors.put_scalar(name, value)
        for iou_type, aps in per_class.items():
            for class_name, value in aps.items():
                if value >= 0:  # -1: no ground truth of the class among the evaluated images
                    self.trainer.monitors.put_scalar(f"AP({iou_type})/{class_name}", value)
        if self.logdir:
            path = os.path.join(self.logdir, EVAL_RESULTS_FILE)
            history = json.load(open(path)) if os.path.exists(path) else []
            history.append({"epoch": self.epoch_num, "global_step": int(self.global_step), **results,
                            evaluation.PER_CLASS_KEY: per_class})
            tmp = path + ".tmp"
            with open(tmp, "w") as f:
                json.dump(history, f, indent=1)
            os.replace(tmp, path)
        return results
