"""Run names, one rule for the EC2 cluster and SageMaker: SageMaker's training-job name pattern,
^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62} (CreateTrainingJob's TrainingJobName in the SageMaker API
reference), the strictest place a run name goes."""
import calendar
import re
import time

import pytest

from launch.aws import LaunchError
from launch.run_names import check_run_name, new_run_name


@pytest.mark.parametrize("name", ["a", "7", "coco-r50", "a--b", "x" * 63, "maskrcnn-20250101-120000-0f3a"])
def test_names_sagemaker_accepts_are_run_names(name):
    assert check_run_name(name) == name


# 64 characters with hyphens: the pattern's group repeats at most 62 times but may hold several
# hyphens each time, so only the length limit refuses it.
@pytest.mark.parametrize("name", ["", "x" * 64, "a-" * 31 + "bb", "-a", "a-", "coco_r50", "coco.r50", "a b", "a/b", "../other",
                                  ".hidden"])
def test_other_names_are_refused_with_the_rule(name):
    with pytest.raises(LaunchError, match=f"run name {re.escape(repr(name))}: use letters, digits and hyphens, "
                                          f"at most 63 characters, starting and ending with a letter or digit"):
        check_run_name(name)


def test_a_new_run_name_is_the_base_the_utc_time_and_4_hex_digits():
    before = int(time.time())
    name = new_run_name()
    after = int(time.time())
    match = re.fullmatch(r"maskrcnn-(\d{8}-\d{6})-[0-9a-f]{4}", name)
    assert match and check_run_name(name) == name
    stamp = calendar.timegm(time.strptime(match[1], "%Y%m%d-%H%M%S"))
    assert before <= stamp <= after


def test_a_base_too_long_for_a_run_name_is_refused_with_its_limit():
    # "-YYYYmmdd-HHMMSS-hhhh" is 21 characters: a 42-character base makes 63.
    assert len(new_run_name("b" * 42)) == 63
    with pytest.raises(LaunchError, match="base name 'b{43}': .* at most 42 characters"):
        new_run_name("b" * 43)
    with pytest.raises(LaunchError, match="base name 'my_job'"):
        new_run_name("my_job")
