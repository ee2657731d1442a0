"""A run ends exactly at TRAIN.MAX_STEPS, also when the last epoch is partial and after a resume.

tensorpack's own training loop runs here on a one-variable model, with the config the trainer
derives (training.config.finalize) and the callback training/train.py installs.
"""
import pytest

from training.config import finalize, new_config


def _schedule(*overrides):
    cfg = new_config()
    cfg.update_args(list(overrides))
    return finalize(cfg, num_ranks=1, class_names=["BG", "a"], has_gpu=False).TRAIN


def test_the_reference_schedule_has_a_short_last_epoch():
    """The default schedule at global batch 8 with 100000 images an epoch: 360000 steps, epochs of 12500 steps, so
    28 full epochs (350000 steps) and a 29th of 10000 (29 x 12500 = 362500 would overrun)."""
    from training.callbacks import EpochSteps
    t = _schedule("TRAIN.BATCH_SIZE_PER_GPU=8", "TRAIN.IMAGES_PER_EPOCH=100000")
    assert (t.MAX_STEPS, t.STEPS_PER_EPOCH, t.MAX_EPOCH) == (360000, 12500, 29)
    epochs = EpochSteps(start_step=0, steps_per_epoch=t.STEPS_PER_EPOCH, max_steps=t.MAX_STEPS)
    steps = [epochs.steps_of_epoch(e) for e in range(1, t.MAX_EPOCH + 1)]
    assert steps[:28] == [12500] * 28 and steps[28] == 10000 and sum(steps) == 360000
    # resumed at step 351234 (inside epoch 29): 8766 steps to go
    resumed = EpochSteps(start_step=351234, steps_per_epoch=t.STEPS_PER_EPOCH, max_steps=t.MAX_STEPS)
    assert resumed.steps_of_epoch(29) == 360000 - 351234


def _train(*, start_step, steps_per_epoch, max_steps, max_epoch):
    """Run tensorpack's loop as training/train.py configures it; the global steps that ran."""
    from tensorpack import Callback, ModelDesc, TrainConfig, launch_train_with_config
    from tensorpack.input_source import DummyConstantInput
    from tensorpack.train import SimpleTrainer

    from training.callbacks import EpochSteps
    from training.compat import tf, tf1
    from training.resume import set_global_step

    class OneVariable(ModelDesc):
        def inputs(self):
            return [tf1.TensorSpec([1], tf.float32, "x")]

        def build_graph(self, x):
            w = tf1.get_variable("w", [], initializer=tf1.zeros_initializer())
            return tf.reduce_sum(tf.square(w - x))

        def optimizer(self):
            return tf1.train.GradientDescentOptimizer(0.1)

    class Steps(Callback):
        seen = []

        def _trigger_step(self):
            self.seen.append(int(self.global_step))

    steps = Steps()
    graph = tf.Graph()
    with graph.as_default():
        config = TrainConfig(
            model=OneVariable(), data=DummyConstantInput([[1]]),
            callbacks=[EpochSteps(start_step=start_step, steps_per_epoch=steps_per_epoch, max_steps=max_steps), steps],
            extra_callbacks=[], monitors=[], session_init=set_global_step(start_step) if start_step else None,
            steps_per_epoch=steps_per_epoch, starting_epoch=start_step // steps_per_epoch + 1, max_epoch=max_epoch)
        launch_train_with_config(config, SimpleTrainer())
    return steps.seen


@pytest.mark.parametrize("start_step", [0, 7, 10, 23])
def test_training_stops_at_max_steps_from_the_start_and_after_a_resume(start_step):
    # 10 images an epoch at batch 2: 5 steps an epoch; 24 steps end 4 steps into epoch 5
    t = _schedule("TRAIN.BATCH_SIZE_PER_GPU=2", "TRAIN.IMAGES_PER_EPOCH=10", "TRAIN.LR_EPOCH_SCHEDULE=[]",
                  "TRAIN.LR_SCHEDULE=[6]")    # 6 steps at batch 8 = 24 steps at batch 2
    assert (t.STEPS_PER_EPOCH, t.MAX_STEPS, t.MAX_EPOCH) == (5, 24, 5)
    seen = _train(start_step=start_step, steps_per_epoch=t.STEPS_PER_EPOCH, max_steps=t.MAX_STEPS,
                  max_epoch=t.MAX_EPOCH)
    assert seen == list(range(start_step + 1, 25))
