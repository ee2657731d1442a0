"""The files a run keeps for its watchers (heartbeat.json, stopped.json), the heartbeat's rate and the
checkpoint clock, on a clock the test controls. A real run writes them in test_stop_and_resume.py."""
import json
import types

import pytest

from training import callbacks as cb
from training.run_status import (HEARTBEAT_FILE, STOP_FILE, epoch_of, read_heartbeat, read_stop_record,
                                 write_heartbeat, write_stop_record)


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_heartbeat_file_is_the_documented_json_and_unreadable_ones_are_none(tmp_path):
    assert cb.HEARTBEAT_FILE == HEARTBEAT_FILE == "heartbeat.json" and cb.read_heartbeat is read_heartbeat
    assert read_heartbeat(str(tmp_path)) is None
    write_heartbeat(str(tmp_path), step=1234, epoch=3, now=1_700_000_000.5)
    assert json.loads((tmp_path / HEARTBEAT_FILE).read_text()) == {"step": 1234, "epoch": 3, "time": 1_700_000_000.5}
    assert read_heartbeat(str(tmp_path)) == {"step": 1234, "epoch": 3, "time": 1_700_000_000.5}
    assert [p.name for p in tmp_path.iterdir()] == [HEARTBEAT_FILE]       # the temporary file is gone
    for text in ('{"step": 1', '[1, 2]', '{"step": "12", "epoch": 1, "time": 1}', '{"step": 12, "time": 1}'):
        (tmp_path / HEARTBEAT_FILE).write_text(text)
        assert read_heartbeat(str(tmp_path)) is None, text


def test_a_stop_record_counts_from_when_the_run_started(tmp_path):
    record = write_stop_record(str(tmp_path), signal="SIGTERM", step=46, epoch=2, checkpoint="model-46")
    assert json.loads((tmp_path / STOP_FILE).read_text()) == record
    assert read_stop_record(str(tmp_path), since=record["time"] - 60) == record
    assert read_stop_record(str(tmp_path), since=record["time"] + 60) is None    # a previous attempt's


def test_epoch_of_a_step():
    # steps 1..40 are epoch 1, 41..80 epoch 2; step 0 (nothing trained) epoch 0
    assert [epoch_of(s, 40) for s in (0, 1, 40, 41, 80, 81)] == [0, 1, 1, 2, 2, 3]


def test_interval_is_due_after_its_seconds_and_zero_is_never():
    clock = Clock()
    every_3 = cb.Interval(0.05 * 60, clock=clock)      # TRAIN.CHECKPOINT_MINUTES=0.05
    clock.now += 2.9
    assert not every_3.due()
    clock.now += 0.1
    assert every_3.due()
    every_3.reset()
    assert not every_3.due()
    clock.now += 3
    assert every_3.due()
    off = cb.Interval(0, clock=clock)                  # TRAIN.CHECKPOINT_MINUTES=0
    clock.now += 1e9
    assert not off.due()


def test_heartbeat_at_start_at_most_every_15_seconds_and_at_every_epoch_end(tmp_path):
    clock = Clock()
    beat = cb.Heartbeat(str(tmp_path), steps_per_epoch=10, clock=clock)
    # The callback reads only the trainer's global step; a whole tensorpack trainer would need a
    # graph and a session to stand still while the clock moves.
    beat.trainer = types.SimpleNamespace(global_step=0)
    written = []

    def step(to: int, seconds: float):
        beat.trainer.global_step = to
        clock.now += seconds
        before = (tmp_path / HEARTBEAT_FILE).read_text()
        beat.trigger_step()
        if (tmp_path / HEARTBEAT_FILE).read_text() != before:
            written.append(to)

    beat.before_train()
    assert read_heartbeat(str(tmp_path))["step"] == 0
    for s in range(1, 10):
        step(s, 4.0)                                   # 4 s a step: due at 16 s, 32 s
    assert written == [4, 8]
    beat.trainer.global_step = 10
    beat.trigger_epoch()                               # the epoch's end, 4 s after the last beat
    assert read_heartbeat(str(tmp_path))["step"] == 10 and read_heartbeat(str(tmp_path))["epoch"] == 1
    step(11, 14.9)
    assert written == [4, 8]                           # 14.9 s since the epoch-end beat
    step(12, 0.1)
    assert written == [4, 8, 12] and read_heartbeat(str(tmp_path))["epoch"] == 2
    assert cb.HEARTBEAT_SECONDS == 15


@pytest.mark.parametrize("value, ok", [(30, True), (0, True), (0.05, True), (-1, False), ("30", False), (True, False)])
def test_checkpoint_minutes_is_a_number_of_minutes(value, ok):
    from training.config import ConfigError, finalize, new_config
    cfg = new_config()
    cfg.TRAIN.CHECKPOINT_MINUTES = value
    if ok:
        assert finalize(cfg, num_ranks=1, has_gpu=False).TRAIN.CHECKPOINT_MINUTES == value
    else:
        with pytest.raises(ConfigError, match="TRAIN.CHECKPOINT_MINUTES must be a number of minutes >= 0"):
            finalize(cfg, num_ranks=1, has_gpu=False)


def test_checkpoint_minutes_defaults_to_30():
    from training.config import new_config
    assert new_config().TRAIN.CHECKPOINT_MINUTES == 30
