"""Rank 0's CloudWatch records (training/cloudwatch_metrics.py), read as CloudWatch Logs reads them:
each line checked against the embedded metric format's published schema and rules
(tests/cloudwatch_emf.py), the metrics extracted per dimension set, the values compared with what
the steps' losses make by hand. A real tensorpack loop produces them (a toy model whose loss is
read from its data). The records of a run of the trainer itself are checked with the other
checks of that run, in test_train_run.py."""
from __future__ import annotations

import math

import pytest

from cloudwatch_emf import extracted_metrics, parse_emf_line, toy_run
from training import cloudwatch_metrics as cwm
from training import metrics

DEPLOYMENT = "team-a-EfsClusterStack"


@pytest.fixture(scope="module")
def toy_records(tmp_path_factory):
    """case -> the records of a toy run (6 steps of 8 images on 4 ranks, losses from the data
    0.9, 0.8, NaN, 0.6, 0.5, 0.4) that finished, failed at step 3, or was stopped at step 3."""
    root = tmp_path_factory.mktemp("toy")
    tensorboard = root / "tensorboard"
    out = {}
    for case in ("finished", "failed", "stopped"):
        env = {cwm.DEPLOYMENT_ENV: DEPLOYMENT}
        if case == "finished":
            env[cwm.TENSORBOARD_DIR_ENV] = str(tensorboard)
        lines = toy_run(root / f"run-{case}", case, environ=env)
        out[case] = [parse_emf_line(line) for line in lines]
    out["tensorboard"] = tensorboard
    return out


def _values(record: dict) -> dict:
    return {m["Name"]: record[m["Name"]] for m in record["_aws"]["CloudWatchMetrics"][0]["Metrics"]}


def test_a_finished_run_writes_start_progress_evaluation_and_end(toy_records):
    start, progress, evaluation, end = toy_records["finished"]
    assert _values(start) == {metrics.STEP: 0, metrics.RUN_ACTIVE: 1, metrics.HEARTBEAT: 1}
    v = _values(progress)
    # The mean over the 5 finite steps: box = x, label = x / 2; the NaN step counted, not averaged.
    assert v[metrics.FASTRCNN_BOX_LOSS] == pytest.approx((0.9 + 0.8 + 0.6 + 0.5 + 0.4) / 5)
    assert v[metrics.FASTRCNN_LABEL_LOSS] == pytest.approx((0.9 + 0.8 + 0.6 + 0.5 + 0.4) / 10)
    assert v[metrics.LOSS_NOT_FINITE] == 1
    assert (v[metrics.STEP], v[metrics.EPOCH], v[metrics.PROGRESS]) == (6, 2, 100.0)
    assert v[metrics.IMAGES_PER_SECOND] > 0
    assert v[metrics.IMAGES_PER_SECOND_PER_GPU] == pytest.approx(v[metrics.IMAGES_PER_SECOND] / 4)
    assert v[metrics.LEARNING_RATE] == pytest.approx(0.01)
    assert (v[metrics.HEARTBEAT], v[metrics.RUN_ACTIVE]) == (1, 1)
    # The COCO figures, put by name as COCOEvaluator puts them.
    assert _values(evaluation) == {**{name: pytest.approx(0.01 * (i + 1))
                                      for i, name in enumerate(metrics.EVALUATION_METRICS)},
                                   metrics.EPOCH: 2, metrics.STEP: 6}
    assert _values(end) == {metrics.RUN_FINISHED: 1, metrics.RUN_ACTIVE: 0, metrics.STEP: 6}
    assert end["Reason"] == "ended at step 6 of 6"
    timestamps = [r["_aws"]["Timestamp"] for r in toy_records["finished"]]
    assert timestamps == sorted(timestamps)


@pytest.mark.parametrize("case, status, reason", [
    ("failed", metrics.RUN_FAILED, "RuntimeError: a step failed"),
    ("stopped", metrics.RUN_STOPPED, "ended at step 3 of 6"),
])
def test_a_run_that_ends_early_says_how(toy_records, case, status, reason):
    *_, progress, end = toy_records[case]
    # The steps up to the end are still reported: 0.9, 0.8 finite, the NaN at step 3.
    assert _values(progress)[metrics.FASTRCNN_BOX_LOSS] == pytest.approx(0.85)
    assert _values(progress)[metrics.LOSS_NOT_FINITE] == 1
    assert _values(end) == {status: 1, metrics.RUN_ACTIVE: 0, metrics.STEP: 3}
    assert end["Reason"] == reason


def test_cloudwatch_extracts_every_metric_per_deployment_and_per_run(toy_records):
    for record in toy_records["finished"]:
        assert (record[metrics.DEPLOYMENT_DIMENSION], record[metrics.RUN_DIMENSION]) == (DEPLOYMENT, "run-finished")
        points = extracted_metrics(record)
        names = set(_values(record))
        assert {(ns, name, dims) for ns, name, dims, _ in points} == (
            {(metrics.NAMESPACE, n, (("Deployment", DEPLOYMENT),)) for n in names}
            | {(metrics.NAMESPACE, n, (("Deployment", DEPLOYMENT), ("Run", "run-finished"))) for n in names})
        units = {m["Name"]: m["Unit"] for m in record["_aws"]["CloudWatchMetrics"][0]["Metrics"]}
        assert all(units[n] == metrics.UNITS.get(n, "None") for n in names)
    assert toy_records["finished"][1]["_aws"]["CloudWatchMetrics"][0]["Metrics"][3] == {
        "Name": metrics.IMAGES_PER_SECOND, "Unit": "Count/Second"}


def test_the_tensorboard_copy_holds_the_runs_scalars(toy_records):
    from training.compat import tf1
    (events,) = toy_records["tensorboard"].glob("events.out.tfevents.*")
    tags = {v.tag for e in tf1.train.summary_iterator(str(events)) for v in e.summary.value}
    assert set(metrics.EVALUATION_METRICS) <= tags


def test_values_json_cannot_hold_are_left_out():
    record = cwm.emf_record({"a": float("nan"), "b": float("inf"), "c": True, "d": 2, "e": 0.5},
                            deployment="D", run="r", path="cluster", timestamp_ms=1_700_000_000_000)
    assert [m["Name"] for m in record["_aws"]["CloudWatchMetrics"][0]["Metrics"]] == ["d", "e"]
    assert parse_emf_line(cwm.emf_line(record))["d"] == 2
    record["e"] = math.nan   # slipped in after the record was made
    with pytest.raises(ValueError):
        cwm.emf_line(record)


def test_dimension_values_are_visible_ascii():
    record = cwm.emf_record({"x": 1}, deployment="Stack", run="lauf-ä", path="cluster", timestamp_ms=0)
    assert record["Run"] == "lauf-?"
    with pytest.raises(ValueError, match="name the deployment or the run with letters and digits"):
        cwm.emf_record({"x": 1}, deployment="Stack", run="äö", path="cluster", timestamp_ms=0)
    with pytest.raises(ValueError, match="own members"):
        cwm.emf_record({metrics.RUN_DIMENSION: 1}, deployment="S", run="r", path="cluster", timestamp_ms=0)


def test_which_runs_write_records(tmp_path):
    cluster_env = tmp_path / "cluster.env"
    assert cwm.deployment_and_path({}, str(cluster_env)) == (None, cwm.PATH_LOCAL)
    # The node's cluster.env (mounted into the training container) names the stack.
    cluster_env.write_text("ROLE=master\nSTACK_NAME=team-a-EfsClusterStack\nEFS_MOUNT=/efs\n")
    assert cwm.deployment_and_path({}, str(cluster_env)) == ("team-a-EfsClusterStack", cwm.PATH_CLUSTER)
    assert cwm.deployment_and_path({cwm.DEPLOYMENT_ENV: "Other"}, str(cluster_env)) == ("Other", cwm.PATH_CLUSTER)
    # A SageMaker job: none unless told (its metrics are the job's metric definitions).
    assert cwm.deployment_and_path({"TRAINING_JOB_NAME": "j"}, str(cluster_env)) == (None, cwm.PATH_SAGEMAKER)
    assert cwm.monitors(lambda: {}, logdir=str(tmp_path), rank=1, ranks=2, global_batch=2, max_steps=1,
                        environ={cwm.DEPLOYMENT_ENV: "D", cwm.TENSORBOARD_DIR_ENV: str(tmp_path)}) == []


def test_run_status():
    assert cwm.run_status(failed=True, step=10, max_steps=10) == metrics.RUN_FAILED
    assert cwm.run_status(failed=False, step=10, max_steps=10) == metrics.RUN_FINISHED
    assert cwm.run_status(failed=False, step=9, max_steps=10) == metrics.RUN_STOPPED
