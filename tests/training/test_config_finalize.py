"""config.finalize: validation messages, derived values and the LR schedule."""
import pytest

from training.config import ConfigError, finalize, learning_rate_at, new_config


def _cfg(*overrides):
    cfg = new_config()
    cfg.update_args(list(overrides))
    return cfg


def test_defaults_derive_tensorpack_schedule():
    cfg = finalize(_cfg(), num_ranks=8, class_names=["BG", "a", "b"], has_gpu=True)
    t = cfg.TRAIN
    assert t.NUM_GPUS == 8 and t.STEPS_PER_EPOCH == 15000
    assert t.LR_BOUNDARIES == [240000, 320000] and t.MAX_STEPS == 360000 and t.MAX_EPOCH == 24
    assert t.SCALED_LR == pytest.approx(0.01)
    assert cfg.DATA.NUM_CATEGORY == 2 and cfg.BACKBONE.DATA_FORMAT == "NCHW"


def test_step_schedule_scales_with_global_batch():
    cfg = finalize(_cfg("TRAIN.BATCH_SIZE_PER_GPU=4"), num_ranks=32, has_gpu=False)
    t = cfg.TRAIN
    # global batch 128 = 16x the reference 8: 16x fewer steps, 16x the LR; the warmup keeps its
    # 1000 steps (scaled down to 62 it let 32 GPUs x 4 images diverge)
    assert t.LR_BOUNDARIES == [15000, 20000] and t.MAX_STEPS == 22500
    assert t.SCALED_LR == pytest.approx(0.16) and t.WARMUP_STEPS == 1000
    assert cfg.BACKBONE.DATA_FORMAT == "NHWC"


def test_epoch_schedule_and_warmup():
    cfg = finalize(_cfg("TRAIN.LR_EPOCH_SCHEDULE=[(16, 0.1), (20, 0.01), (24, None)]",
                        "TRAIN.BATCH_SIZE_PER_GPU=4", "TRAIN.IMAGES_PER_EPOCH=1000", "TRAIN.WARMUP=80"),
                   num_ranks=2, has_gpu=False)
    t = cfg.TRAIN
    assert t.STEPS_PER_EPOCH == 125 and t.LR_BOUNDARIES == [2000, 2500] and t.MAX_STEPS == 3000
    assert t.LR_MULTIPLIERS == [1.0, 0.1, 0.01] and t.WARMUP_STEPS == 80
    assert learning_rate_at(cfg, 0) == pytest.approx(t.WARMUP_INIT_LR)
    assert learning_rate_at(cfg, 40) == pytest.approx(0.5 * t.WARMUP_INIT_LR + 0.5 * t.SCALED_LR)
    assert learning_rate_at(cfg, 1000) == pytest.approx(t.SCALED_LR)
    assert learning_rate_at(cfg, 2100) == pytest.approx(t.SCALED_LR * 0.1)
    assert learning_rate_at(cfg, 2999) == pytest.approx(t.SCALED_LR * 0.01)


@pytest.mark.parametrize("override, message", [
    ("BACKBONE.RESNET_NUM_BLOCKS=[3, 4]", "unknown backbone"),
    ("BACKBONE.BLOCK='dense'", "unknown backbone block"),
    ("BACKBONE.NORM='BatchNorm'", "FreezeBN, SyncBN, GN, None"),
    ("TRAIN.BATCH_SIZE_PER_GPU=0", "BATCH_SIZE_PER_GPU"),
    ("TRAIN.LR_SCHEDULE=[300, 200]", "LR_SCHEDULE"),
    ("TRAIN.LR_EPOCH_SCHEDULE=[(2, 0.1), (4, 0.5)]", "last"),
    ("RPN.ANCHOR_SIZES=(32, 64)", "one size per FPN level"),
    ("FPN.ANCHOR_STRIDES=(4, 6, 8)", "ANCHOR_STRIDES"),
    ("PREPROC.TRAIN_SHORT_EDGE_SIZE=[800, 600]", "TRAIN_SHORT_EDGE_SIZE"),
    ("MRCNN.MASK_SIZE=27", "MASK_SIZE"),
    ("TRAIN.IMAGES_PER_EPOCH=0", "IMAGES_PER_EPOCH"),
    ("DATA.TRAIN=()", "DATA.TRAIN must name at least one split"),
    ("DATA.ASPECT_RATIO_GROUPING=1", "DATA.ASPECT_RATIO_GROUPING must be True or False"),
    ("TRAIN.SEED=-1", "TRAIN.SEED must be an integer >= 0"),
    ("DATA.VAL=('',)", "DATA.VAL must be a list of split names .* or () to train without evaluating"),
])
def test_bad_values_are_rejected_with_a_message(override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        finalize(_cfg(override), num_ranks=1, has_gpu=False)


def test_unknown_key_and_unparsable_value():
    with pytest.raises(ConfigError, match="unknown config key"):
        _cfg("TRAIN.NO_SUCH_KEY=1")
    with pytest.raises(ConfigError, match="cannot parse"):
        _cfg("TRAIN.BASE_LR=fast")
    with pytest.raises(ConfigError, match="cannot parse"):
        _cfg("PREPROC.TRAIN_SHORT_EDGE_SIZE=big")       # a list of numbers takes no bare word


def test_a_bare_split_name_or_entry_is_a_list_of_one():
    """As a shell passes an unquoted value: `DATA.TRAIN=train2017`, `DATA.VAL=labels/val.json:photos/val`."""
    cfg = _cfg("DATA.TRAIN=train2017", "DATA.VAL=labels/val.json:photos/val")
    assert cfg.DATA.TRAIN == ("train2017",) and cfg.DATA.VAL == ("labels/val.json:photos/val",)
    assert _cfg("DATA.TRAIN=('a.json:a', 'b.json:b')").DATA.TRAIN == ("a.json:a", "b.json:b")


def test_finalized_config_is_frozen():
    cfg = finalize(_cfg(), num_ranks=1, has_gpu=False)
    with pytest.raises(ConfigError):
        cfg.TRAIN.NEW_KEY = 1


def test_an_empty_validation_list_trains_without_evaluating():
    assert finalize(_cfg("DATA.VAL=()"), num_ranks=1, has_gpu=False).DATA.VAL == ()


@pytest.mark.parametrize("name, steps", [
    # tensorpack examples/FasterRCNN/config.py: "1x" = Detectron's [120k, 160k, 180k]; its comment
    # states 3x = [420000, 500000, 540000]; the SageMaker EFS example trained with [240k, 320k, 360k] = 2x
    ("1x", [120000, 160000, 180000]), ("2x", [240000, 320000, 360000]), ("3x", [420000, 500000, 540000])])
def test_schedule_names_are_tensorpacks_presets(name, steps):
    cfg = finalize(_cfg(f"TRAIN.LR_SCHEDULE={name!r}"), num_ranks=8, has_gpu=False)
    assert cfg.TRAIN.LR_SCHEDULE == steps
    assert cfg.TRAIN.LR_BOUNDARIES == steps[:2] and cfg.TRAIN.MAX_STEPS == steps[2]
    # at global batch 16 the same schedule takes half the steps
    half = finalize(_cfg(f"TRAIN.LR_SCHEDULE={name!r}", "TRAIN.BATCH_SIZE_PER_GPU=2"), num_ranks=8, has_gpu=False)
    assert half.TRAIN.MAX_STEPS == steps[2] // 2


def test_the_default_schedule_is_2x():
    assert new_config().TRAIN.LR_SCHEDULE == "2x"
    with pytest.raises(ConfigError, match=r"'12' is not a schedule name: use '1x', '2x'"):
        finalize(_cfg("TRAIN.LR_SCHEDULE='12'"), num_ranks=1, has_gpu=False)


def test_freeze_at_keeps_its_meaning_when_fine_tuning_from_a_model():
    """tensorpack freezes FREEZE_AT stages whatever the weights come from; only a run with no pretrained
    weights at all (nothing to protect) trains every stage."""
    tuned = finalize(_cfg("TRAIN.LOAD_MODEL='COCO-MaskRCNN-R50FPN2x.npz'"), num_ranks=1, has_gpu=False)
    assert tuned.BACKBONE.FREEZE_AT == 2
    scratch = finalize(_cfg(), num_ranks=1, has_gpu=False)
    assert scratch.BACKBONE.FREEZE_AT == 0


def test_fpn_max_size_is_rounded_up_to_the_coarsest_stride_as_tensorpack_does():
    # tensorpack's finalize_configs: ceil(1333 / 32) * 32 = 42 * 32 = 1344, for FPN models only
    cfg = finalize(_cfg(), num_ranks=1, has_gpu=False)
    assert cfg.PREPROC.MAX_SIZE == 1344
    again = _cfg(f"PREPROC.MAX_SIZE={cfg.PREPROC.MAX_SIZE}")   # a saved config, finalized again
    assert finalize(again, num_ranks=1, has_gpu=False).PREPROC.MAX_SIZE == 1344
    assert finalize(_cfg("PREPROC.MAX_SIZE=1000"), num_ranks=1, has_gpu=False).PREPROC.MAX_SIZE == 1024
    c4 = finalize(_cfg("MODE_FPN=False"), num_ranks=1, has_gpu=False)
    assert c4.PREPROC.MAX_SIZE == 1333
