"""A tensorpack callback that prints, early in a run, how many hours its plan takes at the speed of
its first steps (training/schedule.py says what the plan is)."""
from __future__ import annotations

import time

from tensorpack.callbacks import Callback

from training import schedule

# The first steps after the start-up carry TensorFlow's one-time graph optimisation and the input
# queue's filling: not timed.
SKIPPED_STEPS = 2
TIMED_STEPS = 20


class PlannedTime(Callback):
    """Rank 0: after SKIPPED_STEPS + TIMED_STEPS steps of this run (or at its end, if sooner), one
    line with the images left and the hours they take at the speed of the timed steps."""

    chief_only = True

    def __init__(self, *, global_batch: int, max_steps: int):
        self._global_batch = global_batch
        self._max_steps = max_steps

    def _before_train(self):
        self._first = self.global_step
        self._timed_from = None
        self._done = False

    def _trigger_step(self):
        if self._done:
            return
        step = self.global_step
        if step - self._first == SKIPPED_STEPS:
            self._timed_from = (step, time.time())
        elif self._timed_from and (step - self._timed_from[0] >= TIMED_STEPS or step >= self._max_steps):
            start, t0 = self._timed_from
            rate = (step - start) * self._global_batch / max(time.time() - t0, 1e-9)
            print(schedule.planned_time(images_left=(self._max_steps - step) * self._global_batch,
                                        images_per_second=rate, measured_steps=(start, step)), flush=True)
            self._done = True
