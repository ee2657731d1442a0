"""The schedule sized to the training data (TRAIN.DATASET_PASSES, the finetune preset): expected
step counts derived by hand from the rule in training/schedule.py (MMDetection's fine-tuning
schedule: 8 passes, LR x0.1 for the last; warmup at most one pass)."""
import pytest

from training import schedule
from training.config import ConfigError, finalize, learning_rate_at, new_config
from training.configs import finetune


def _finetune(num_images, *, ranks=1, per_rank=2, extra=()):
    cfg = new_config()
    cfg.update_args(finetune.OVERRIDES + [f"TRAIN.BATCH_SIZE_PER_GPU={per_rank}", *extra])
    return finalize(cfg, num_ranks=ranks, has_gpu=False, num_train_images=num_images)


def test_a_64_image_dataset_trains_8_passes_not_cocos_2x():
    cfg = _finetune(64)    # 1 rank x 2 images: 32 steps a pass
    t = cfg.TRAIN
    assert (t.IMAGES_PER_EPOCH, t.STEPS_PER_EPOCH) == (64, 32)
    assert t.MAX_STEPS == 8 * 32 == 256 and t.MAX_EPOCH == 8
    assert t.LR_BOUNDARIES == [7 * 32] and t.LR_MULTIPLIERS == [1.0, 0.1]
    assert t.WARMUP_STEPS == 32            # one pass: the default 1000 steps would outlast the run
    assert t.EVAL_PERIOD == 1
    assert t.SCALED_LR == pytest.approx(0.01 * 2 / 8)
    assert learning_rate_at(cfg, 224) == pytest.approx(0.1 * t.SCALED_LR)
    # the same dataset with the defaults: COCO's 2x, 360000 steps of 8 images at global batch 8
    default = finalize(new_config(), num_ranks=8, has_gpu=False, num_train_images=64)
    assert default.TRAIN.MAX_STEPS == 360000 and default.TRAIN.MAX_STEPS * 8 == 2_880_000


def test_the_schedule_follows_the_global_batch_and_the_dataset_size():
    cfg = _finetune(1000, ranks=8, per_rank=4)    # global batch 32: ceil(1000 / 32) = 32 steps a pass
    t = cfg.TRAIN
    assert (t.STEPS_PER_EPOCH, t.MAX_STEPS, t.LR_BOUNDARIES, t.WARMUP_STEPS) == (32, 256, [224], 32)
    assert t.SCALED_LR == pytest.approx(0.04)
    big = _finetune(100_000, ranks=8, per_rank=4).TRAIN   # 3125 steps a pass: warmup stays 1000
    assert (big.STEPS_PER_EPOCH, big.MAX_STEPS, big.LR_BOUNDARIES, big.WARMUP_STEPS) == (3125, 25000, [21875], 1000)


@pytest.mark.parametrize("passes, expected", [
    (1, [(1, None)]), (2, [(1, 0.1), (2, None)]), (3, [(2, 0.1), (3, None)]),   # 7/8 of 3 = 2.6 -> 3, kept below 3
    (8, [(7, 0.1), (8, None)]), (16, [(14, 0.1), (16, None)])])
def test_the_lr_drops_for_the_last_eighth(passes, expected):
    assert schedule.epoch_schedule(passes) == expected
    cfg = _finetune(10, extra=[f"TRAIN.DATASET_PASSES={passes}"])
    assert cfg.TRAIN.MAX_EPOCH == passes and cfg.TRAIN.LR_EPOCH_SCHEDULE == expected


def test_dataset_passes_take_precedence_over_the_schedule_keys_and_a_saved_config_keeps_its_values():
    cfg = _finetune(64, extra=["TRAIN.LR_EPOCH_SCHEDULE=[(2, 0.1), (3, None)]", "TRAIN.IMAGES_PER_EPOCH=1000"])
    assert cfg.TRAIN.MAX_STEPS == 256
    # a finished run's config.json, finalized again without the training data (predict, export)
    saved = new_config()
    saved.update_args(f"{k}={cfg.get(k)!r}" for k in ("TRAIN.DATASET_PASSES", "TRAIN.IMAGES_PER_EPOCH",
                                                       "TRAIN.LR_EPOCH_SCHEDULE", "TRAIN.WARMUP", "TRAIN.BATCH_SIZE_PER_GPU"))
    again = finalize(saved, num_ranks=1, has_gpu=False).TRAIN
    assert (again.MAX_STEPS, again.LR_BOUNDARIES, again.WARMUP_STEPS) == (256, [224], 32)


def test_bad_dataset_passes_are_named():
    with pytest.raises(ConfigError, match="TRAIN.DATASET_PASSES must be an integer >= 0"):
        _finetune(64, extra=["TRAIN.DATASET_PASSES=-1"])


def test_the_plan_printed_at_the_start():
    assert schedule.plan(_finetune(64), num_images=64) == (
        "plan: 512 images = 8.0 passes over 64 training images; 256 steps of 2 = 8 epochs of 32 steps; "
        "evaluation every 1 epoch(s), the first after step 32")
    coco = finalize(new_config(), num_ranks=8, has_gpu=False, num_train_images=117266)
    assert schedule.plan(coco, num_images=117266) == (
        "plan: 2,880,000 images = 24.6 passes over 117,266 training images; 360,000 steps of 8 = 24 epochs of "
        "15000 steps; evaluation every 1 epoch(s), the first after step 15000")
    # 1000 images left at 2 images/s: 500 s = 0.14 h
    assert schedule.planned_time(images_left=1000, images_per_second=2.0, measured_steps=(2, 22)) == (
        "plan: 1,000 images left take about 0.14 hours at 2.00 images/s (steps 2-22)")


def test_presets_combine_in_order_and_an_unknown_one_is_named():
    from training.train import build_config
    cfg = build_config(["TRAIN.EVAL_PERIOD=2"], preset="cpu_synthetic,finetune")
    assert cfg.TRAIN.DATASET_PASSES == 8 and cfg.BACKBONE.BLOCK == "basic" and cfg.TRAIN.EVAL_PERIOD == 2
    with pytest.raises(ConfigError, match="no preset 'fine_tune'"):
        build_config([], preset="cpu_synthetic,fine_tune")
