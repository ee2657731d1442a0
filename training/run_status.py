"""Small files that rank 0 of a training run writes into its log dir for the processes watching the
run: a step watchdog, the container entry, a job script. No TensorFlow here, so they read them
cheaply.

``heartbeat.json``: ``{"step": int, "epoch": int, "time": unix seconds}``, the global step of the
last finished step, the epoch that step belongs to (``ceil(step / steps per epoch)``, 0 before the
first step) and when it was written. Written when training starts, at most every
``HEARTBEAT_SECONDS`` while it runs, and at every epoch end. Steps do not advance during an
evaluation, so a watchdog must allow for the longest one.

``stopped.json``: written when a run stopped on a signal before the end of its schedule:
``{"signal": "SIGTERM", "step": int, "epoch": int, "checkpoint": "model-STEP" or null, "time": unix
seconds}``; ``checkpoint`` is null when the save at the stop failed (the latest checkpoint is
then an older one). A new stop replaces it; compare ``time`` with when the run started.

Both are replaced atomically (a temporary file, then ``os.replace``): a reader sees the old content
or the new, never half of one.
"""
from __future__ import annotations

import json
import os
import time

HEARTBEAT_FILE = "heartbeat.json"
HEARTBEAT_SECONDS = 15      # at most one heartbeat this often between epoch ends
STOP_FILE = "stopped.json"


def write_json_atomic(path: str, value: dict) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(value, f)
    os.replace(tmp, path)


def _read_json(path: str) -> dict | None:
    try:
        with open(path) as f:
            value = json.load(f)
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def epoch_of(step: int, steps_per_epoch: int) -> int:
    """The epoch a global step belongs to: steps 1..spe are epoch 1; step 0 is epoch 0."""
    return -(-step // steps_per_epoch)


def write_heartbeat(logdir: str, *, step: int, epoch: int, now: float | None = None) -> dict:
    beat = {"step": int(step), "epoch": int(epoch), "time": time.time() if now is None else now}
    write_json_atomic(os.path.join(logdir, HEARTBEAT_FILE), beat)
    return beat


def read_heartbeat(logdir: str) -> dict | None:
    """The run's last heartbeat, or None when there is none (not started, or not a log dir)."""
    beat = _read_json(os.path.join(logdir, HEARTBEAT_FILE))
    if beat is None or not (_is_int(beat.get("step")) and _is_int(beat.get("epoch"))
                            and isinstance(beat.get("time"), (int, float))):
        return None
    return beat


def write_stop_record(logdir: str, *, signal: str, step: int, epoch: int, checkpoint: str | None) -> dict:
    record = {"signal": signal, "step": int(step), "epoch": int(epoch), "checkpoint": checkpoint, "time": time.time()}
    write_json_atomic(os.path.join(logdir, STOP_FILE), record)
    return record


def read_stop_record(logdir: str, *, since: float = 0.0) -> dict | None:
    """The record of a stop written at or after ``since`` (unix seconds), or None."""
    record = _read_json(os.path.join(logdir, STOP_FILE))
    if record is None or not _is_int(record.get("step")) or not isinstance(record.get("time"), (int, float)):
        return None
    return record if record["time"] >= since else None
