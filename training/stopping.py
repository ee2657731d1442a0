"""A training rank's side of a stop request: SIGTERM asks the run to save a checkpoint and exit.

SageMaker sends SIGTERM on StopTrainingJob and at MaxRuntimeInSeconds and SIGKILLs 120 s later;
Slurm sends it on ``scancel`` and ``scontrol requeue`` (SIGKILL after KillWait); a spot-interruption
watcher sends it two minutes before EC2 takes the instance. The handler here only records the
request: a rank may be inside a Horovod collective, and the other ranks must stop at the same step
or they would wait in the next collective forever. ``callbacks.StopOnRequest`` sums every rank's
request inside each training step, so all ranks see it after the same step; rank 0 then saves a
checkpoint, writes ``stopped.json`` (``training.run_status``), and every rank exits with
``STOPPED_EXIT_STATUS``.

No TensorFlow here: the handler is installed first thing in ``training.train``, before the
imports that take seconds.
"""
from __future__ import annotations

import signal
import time

STOP_SIGNAL = signal.SIGTERM
# sysexits.h EX_TEMPFAIL, "try again later": the run stopped before the end of its schedule after
# saving a checkpoint; the same command with the same log dir continues from it.
STOPPED_EXIT_STATUS = 75

_requested_at: float | None = None


def _on_signal(signum, _frame) -> None:
    # Only a flag: this runs between two Python bytecodes of the main thread, possibly inside a
    # print (a print here could raise "reentrant call") or in the middle of a step.
    global _requested_at
    if _requested_at is None:
        _requested_at = time.time()


def install_handler() -> None:
    """Record STOP_SIGNAL from now on instead of dying of it (idempotent)."""
    signal.signal(STOP_SIGNAL, _on_signal)


def requested() -> bool:
    """Whether this process received STOP_SIGNAL since ``install_handler``."""
    return _requested_at is not None


def signal_name() -> str:
    return STOP_SIGNAL.name
