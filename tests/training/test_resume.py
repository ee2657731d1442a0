"""Resuming on another rank count: the step of the same images seen, from the log dir's config.json."""
import hashlib
import json

import pytest

from training.config import ConfigError, finalize, learning_rate_at, new_config
from training.resume import checkpoint_batch, continue_step


def _write_config(logdir, ranks, per_rank, resumed_from=None):
    saved = {"TRAIN": {"NUM_GPUS": ranks, "BATCH_SIZE_PER_GPU": per_rank}}
    if resumed_from:
        saved["_resumed_from"] = resumed_from
    (logdir / "config.json").write_text(json.dumps(saved))


def test_fewer_ranks_continue_at_the_step_of_the_images_seen(tmp_path):
    _write_config(tmp_path, 8, 1)
    ckpt = str(tmp_path / "model-250000")
    saved = checkpoint_batch(str(tmp_path), ckpt)
    assert saved == (8, 1)
    step, message = continue_step(ckpt, 250000, saved, ranks=4, per_rank=1)
    assert step == 500000   # 250000 steps x 8 images = 2,000,000 images = 500000 steps of 4
    assert "8 rank(s)" in message and "4 rank(s)" in message and "step 500000" in message
    assert "run on 8 rank(s) again" in message  # how to keep the old global batch


def test_the_lr_schedule_is_at_the_same_point_in_images():
    """250000 of 8 images is past the first drop (240000 at batch 8); 500000 of 4 images is too (480000)."""
    def at(ranks, step):
        cfg = new_config()
        cfg.update_args(["TRAIN.LR_SCHEDULE=[240000, 320000, 360000]"])
        cfg = finalize(cfg, num_ranks=ranks, has_gpu=False)
        return learning_rate_at(cfg, step) / cfg.TRAIN.SCALED_LR
    assert at(8, 250000) == at(4, 500000) == pytest.approx(0.1)
    assert at(8, 239000) == at(4, 478000) == pytest.approx(1.0)


def test_steps_round_down_to_whole_batches_and_images_per_rank_count(tmp_path):
    assert continue_step("model-5", 5, (3, 1), ranks=4, per_rank=1)[0] == 3    # 15 images // 4
    assert continue_step("model-6", 6, (1, 2), ranks=1, per_rank=1)[0] == 12   # 12 images, 1 a step
    # the same global batch from other factors keeps the step
    assert continue_step("model-6", 6, (2, 2), ranks=4, per_rank=1) == (6, "resuming from model-6 at step 6")


def test_a_checkpoint_from_before_a_conversion_keeps_counting_the_old_batch(tmp_path):
    """A run on 2 ranks resumed from model-1000 of an 8-rank run and rewrote config.json: until it
    writes a checkpoint of its own, model-1000 (known by its index file's sha256) still counts
    batches of 8. Its own checkpoints count batches of 2, also one it writes under the same name
    (its steps restarted at 250)."""
    (tmp_path / "model-1000.index").write_bytes(b"tensors of the 8-rank run")
    digest = hashlib.sha256(b"tensors of the 8-rank run").hexdigest()
    _write_config(tmp_path, 2, 1, {"checkpoint": "model-1000", "index_sha256": digest, "num_gpus": 8,
                                   "batch_size_per_gpu": 1})
    assert checkpoint_batch(str(tmp_path), str(tmp_path / "model-1000")) == (8, 1)
    (tmp_path / "model-1000.index").write_bytes(b"tensors of the 2-rank run")
    assert checkpoint_batch(str(tmp_path), str(tmp_path / "model-1000")) == (2, 1)
    assert checkpoint_batch(str(tmp_path), str(tmp_path / "model-1100")) == (2, 1)


def test_without_config_json_the_step_is_kept_and_a_broken_one_is_an_error(tmp_path):
    ckpt = str(tmp_path / "model-10")
    assert checkpoint_batch(str(tmp_path), ckpt) is None
    assert continue_step(ckpt, 10, None, ranks=2, per_rank=1)[0] == 10
    (tmp_path / "config.json").write_text('{"TRAIN": {}}')
    with pytest.raises(ConfigError, match="config.json is unreadable"):
        checkpoint_batch(str(tmp_path), ckpt)


# ------------------------------------------------------------------ a new run never resumes another one
def _logdir_with_checkpoint(tf, logdir, step, **saved_train):
    """A log dir as a run leaves it: a checkpoint at ``step`` and that run's config.json."""
    tf1 = tf.compat.v1
    global_step = tf1.train.get_or_create_global_step()
    with tf1.Session() as sess:
        sess.run(tf1.global_variables_initializer())
        sess.run(tf1.assign(global_step, step))
        tf1.train.Saver().save(sess, str(logdir / "model"), global_step=step)
    train = {"NUM_GPUS": 1, "BATCH_SIZE_PER_GPU": 1, "LOAD_MODEL": "", **saved_train}
    (logdir / "config.json").write_text(json.dumps({"TRAIN": train}))


def _finalized(*overrides):
    cfg = new_config()
    cfg.update_args(list(overrides))
    return finalize(cfg, num_ranks=1, has_gpu=False)


def test_a_new_fine_tuning_run_in_an_old_runs_log_dir_is_refused(tf_session, tmp_path):
    """TRAIN.LOAD_MODEL names a model to start a new run from; in a log dir holding another run's
    checkpoint the trainer would resume that run and ignore it, so it stops instead."""
    from training.resume import plan
    tf, _ = tf_session
    _logdir_with_checkpoint(tf, tmp_path, 40)
    with pytest.raises(ConfigError, match=f"TRAIN.LOAD_MODEL='coco.npz' asks for a new run fine-tuned from that model, "
                                          f"but --logdir {tmp_path} holds another run's checkpoint model-40 \\(started "
                                          f"without TRAIN.LOAD_MODEL\\), which would be resumed instead: give the new run "
                                          f"a new --logdir"):
        plan(str(tmp_path), _finalized("TRAIN.LOAD_MODEL='coco.npz'"))
    # the same log dir continues with the command that started it, or with no model named
    assert plan(str(tmp_path), _finalized()).step == 40


def test_a_fine_tuned_run_resumes_with_the_command_that_started_it(tf_session, tmp_path):
    """A requeued cluster job or a restarted SageMaker job repeats its command, TRAIN.LOAD_MODEL
    included: that continues the run; another model file is another run."""
    from training.resume import plan
    tf, _ = tf_session
    _logdir_with_checkpoint(tf, tmp_path, 7, LOAD_MODEL="coco.npz")
    resumed = plan(str(tmp_path), _finalized("TRAIN.LOAD_MODEL='coco.npz'"))
    assert (resumed.step, resumed.message) == (7, f"resuming from {tmp_path / 'model-7'} at step 7")
    assert plan(str(tmp_path), _finalized()).step == 7
    with pytest.raises(ConfigError, match="started from 'coco.npz'"):
        plan(str(tmp_path), _finalized("TRAIN.LOAD_MODEL='other.npz'"))
