"""Where a resumed run continues when its rank count (or images per rank) differs from the run that
wrote the checkpoint.

A checkpoint's global step counts batches of the global batch of the run that wrote it, while the
schedule is one of images: the steps per epoch, LR boundaries and last step all scale with the
global batch (``config.finalize``). So a run continues at the step holding the images already
seen: ``step = saved step x saved global batch // this global batch``; the LR then follows the
linear scaling rule for the new global batch. A cluster job resumes on the node count it asked for
(``maskrcnn job submit --nodes``); a new job for the same run on another count, or a SageMaker job
restarted on another instance count, resumes this way.

Which global batch a checkpoint's step counts is read from the log dir's ``config.json``: the
config of the run that last started there, which also records the checkpoint that run resumed from
and that checkpoint's global batch (``_resumed_from``): until the new run writes a checkpoint of
its own, the latest one still counts the older run's batches. The checkpoint is recorded by name
and by the digest of its index file (which holds a checksum of every tensor): after a conversion
to a larger global batch the new run counts fewer steps and can write a checkpoint of the same
name, and a log dir copied or synced back (SageMaker's S3 checkpoints) keeps contents, not times.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os

from training.config import ConfigError

RESUMED_FROM = "_resumed_from"


def checkpoint_batch(logdir: str, checkpoint: str) -> tuple[int, int] | None:
    """``(ranks, images per rank)`` of the run whose global batch ``checkpoint``'s step counts,
    from ``logdir/config.json``; None without that file (a log dir from elsewhere: assume this run's)."""
    from training.callbacks import CONFIG_FILE
    path = os.path.join(logdir, CONFIG_FILE)
    try:
        with open(path) as f:
            saved = json.load(f)
        resumed, digest = saved.get(RESUMED_FROM) or {}, index_digest(checkpoint)
        if digest and resumed.get("index_sha256") == digest:
            return int(resumed["num_gpus"]), int(resumed["batch_size_per_gpu"])
        return int(saved["TRAIN"]["NUM_GPUS"]), int(saved["TRAIN"]["BATCH_SIZE_PER_GPU"])
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as err:
        raise ConfigError(f"{path} is unreadable ({err}), so the global batch that {checkpoint}'s step counts is "
                          f"unknown: move the file away to resume as if it were this run's") from None


def continue_step(checkpoint: str, saved_step: int, saved: tuple[int, int] | None,
                  ranks: int, per_rank: int) -> tuple[int, str]:
    """``(step to continue at, what happens)`` for ``checkpoint`` at ``saved_step``, written by a run
    of ``saved`` = (ranks, images per rank), resumed by one of ``ranks`` x ``per_rank`` images."""
    if saved is None or saved[0] * saved[1] == ranks * per_rank:
        return saved_step, f"resuming from {checkpoint} at step {saved_step}"
    images = saved_step * saved[0] * saved[1]
    step = images // (ranks * per_rank)
    return step, (f"resuming from {checkpoint}, written by a run of {saved[0]} rank(s) x {saved[1]} image(s) "
                  f"(global batch {saved[0] * saved[1]}); this run has {ranks} rank(s) x {per_rank} image(s) "
                  f"(global batch {ranks * per_rank}): its step {saved_step} ({images} images) continues as "
                  f"step {step}, the same schedule in images, the LR scaled to the new global batch. "
                  f"To keep the old global batch instead, run on {saved[0]} rank(s) again")


def index_digest(checkpoint: str) -> str | None:
    try:
        with open(checkpoint + ".index", "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except FileNotFoundError:
        return None


def resumed_from(checkpoint: str, saved: tuple[int, int]) -> dict:
    """The ``config.json`` entry naming the checkpoint this run started from and its global batch."""
    return {"checkpoint": os.path.basename(checkpoint), "index_sha256": index_digest(checkpoint),
            "num_gpus": saved[0], "batch_size_per_gpu": saved[1]}


def set_global_step(step: int):
    """A session init that sets the global step (after the checkpoint's own was restored)."""
    from tensorpack.tfutils.common import get_global_step_var
    from tensorpack.tfutils.sessinit import SessionInit

    class _SetGlobalStep(SessionInit):
        def _run_init(self, sess):
            get_global_step_var().load(step, sess)

    return _SetGlobalStep()


@dataclasses.dataclass(frozen=True)
class Resume:
    """A run's resume state (rank 0 plans it, every rank receives it)."""

    checkpoint: str
    saved_step: int             # the checkpoint's global step
    saved: tuple[int, int]      # (ranks, images per rank) whose global batch saved_step counts
    step: int                   # where this run continues
    message: str


def check_same_start(logdir: str, checkpoint: str, cfg) -> None:
    """Refuse to resume ``checkpoint`` when this run asks to fine-tune from a model that the run
    in ``logdir`` did not start from: resuming would silently ignore ``TRAIN.LOAD_MODEL`` and
    continue another run. The run's own restarts repeat its command (same value) or leave the
    key out; a log dir without config.json (copied from elsewhere) cannot be told apart."""
    from training.callbacks import CONFIG_FILE
    wanted = cfg.TRAIN.LOAD_MODEL
    if not wanted:
        return
    try:
        with open(os.path.join(logdir, CONFIG_FILE)) as f:
            started_from = (json.load(f).get("TRAIN") or {}).get("LOAD_MODEL", "")
    except (FileNotFoundError, ValueError, AttributeError):
        return
    if started_from != wanted:
        raise ConfigError(f"TRAIN.LOAD_MODEL={wanted!r} asks for a new run fine-tuned from that model, but --logdir "
                          f"{logdir} holds another run's checkpoint {os.path.basename(checkpoint)} (started "
                          + (f"from {started_from!r}" if started_from else "without TRAIN.LOAD_MODEL")
                          + "), which would be resumed instead: give the new run a new --logdir, or leave "
                          "TRAIN.LOAD_MODEL out to continue that run")


def plan(logdir: str, cfg) -> Resume | None:
    """The resume state of ``logdir`` for a run of the finalized ``cfg``; None for a fresh run."""
    from training.callbacks import resume_step
    checkpoint, saved_step = resume_step(logdir)
    if not checkpoint:
        return None
    check_same_start(logdir, checkpoint, cfg)
    ranks, per_rank = cfg.TRAIN.NUM_GPUS, cfg.TRAIN.BATCH_SIZE_PER_GPU
    saved = checkpoint_batch(logdir, checkpoint)
    step, message = continue_step(checkpoint, saved_step, saved, ranks, per_rank)
    return Resume(checkpoint, saved_step, saved or (ranks, per_rank), step, message)
