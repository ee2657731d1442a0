"""The SageMaker entry's data plan: split entries '<annotation file>:<image folder>' are relative to the
train channel, and one whose file or folder is not there fails the job before training starts."""
import pytest

from launch.sagemaker import entry


def _env(train_dir, hyperparameters):
    class Env:  # the attributes entry.plan reads from sagemaker_training's Environment
        channel_input_dirs = {"train": str(train_dir), "log": str(train_dir.parent / "log")}
        additional_framework_parameters = {}
        model_dir, num_gpus, network_interface_name = "/opt/ml/model", 1, "eth0"
        hosts, current_host, current_instance_type = ["algo-1"], "algo-1", "ml.g5.xlarge"
    Env.hyperparameters = hyperparameters
    return Env()


@pytest.fixture
def channel(tmp_path):
    train = tmp_path / "train"
    (train / "labels").mkdir(parents=True)
    (train / "labels" / "train.json").write_text("{}")
    (train / "photos" / "train").mkdir(parents=True)
    return train


def test_entries_relative_to_the_train_channel_are_planned(channel):
    job = entry.plan(_env(channel, {"data_train": "labels/train.json:photos/train", "data_val": "[]"}))
    assert job.overrides[0] == f"DATA.BASEDIR={str(channel)!r}"
    assert "DATA.TRAIN=('labels/train.json:photos/train',)" in job.overrides and "DATA.VAL=()" in job.overrides


@pytest.mark.parametrize("hyperparameters, message", [
    ({"data_train": "labels/none.json:photos/train"},
     r"^bad data \(DATA\.TRAIN\): annotation file .*/train/labels/none\.json of split "),
    ({"data_val": "labels/train.json:photos/val"}, r"^bad data \(DATA\.VAL\): image folder .*/train/photos/val "),
    ({"config:DATA.TRAIN": "['labels/train.json:/nowhere/photos']"}, r"image folder /nowhere/photos of split"),
])
def test_an_entry_whose_files_are_not_in_the_channel_fails_the_plan(channel, hyperparameters, message):
    with pytest.raises(entry.JobError, match=message):
        entry.plan(_env(channel, hyperparameters))


def test_split_names_are_left_to_the_trainer(channel):
    # no annotations/instances_train2017.json in the channel: the trainer says which paths it tried
    job = entry.plan(_env(channel, {"data_train": "train2017"}))
    assert "DATA.TRAIN=('train2017',)" in job.overrides
