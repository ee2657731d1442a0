"""training.predict finds a run's checkpoint from the log dir as users type it (relative, as the
README shows) and from a log dir copied from another machine."""
import pytest


def _save_checkpoint(tf1, logdir, entry):
    """A real checkpoint model-5 in ``logdir`` whose ``checkpoint`` state file names it as ``entry``."""
    logdir.mkdir(parents=True)
    graph = tf1.Graph()
    with graph.as_default(), tf1.Session(graph=graph) as sess:
        tf1.train.get_or_create_global_step()
        sess.run(tf1.global_variables_initializer())
        tf1.train.Saver().save(sess, str(logdir / "model-5"), write_state=False)
    tf1.train.update_checkpoint_state(str(logdir), entry)


@pytest.mark.parametrize("entry", ["model-5", "/opt/ml/model/model-5"], ids=["relative_entry", "entry_from_another_machine"])
def test_relative_log_dir_resolves_to_its_checkpoint(tmp_path, monkeypatch, entry):
    from training.compat import tf1
    from training.predict import resolve_checkpoint
    _save_checkpoint(tf1, tmp_path / "runs" / "r1", entry)
    monkeypatch.chdir(tmp_path)
    prefix, logdir = resolve_checkpoint("runs/r1")
    assert prefix in ("runs/r1/model-5", str(tmp_path / "runs/r1/model-5"))
    assert str(logdir) == "runs/r1"


def test_log_dir_without_checkpoint_is_a_clear_error(tmp_path, monkeypatch):
    from training.predict import resolve_checkpoint
    (tmp_path / "runs" / "empty").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match="no checkpoint in runs/empty"):
        resolve_checkpoint("runs/empty")


@pytest.mark.slow
def test_predict_command_on_a_relative_log_dir_prints_no_grappler_warnings(untrained_model, tmp_path):
    """`maskrcnn predict --checkpoint runs/r1 ... --evaluate` as the README shows it: finds
    the checkpoint, writes results, prints the mAP table with the AP of each class, and stderr holds
    no cost-model warning per CropAndResize."""
    import json
    import shutil
    from untrained_run import run_python
    shutil.copytree(untrained_model.run, tmp_path / "runs" / "r1")   # the untrained run (tests/saved_models.py)
    proc = run_python("-m", "training.predict", "--checkpoint", "runs/r1", "--split", "val2017", "--output", "results.json",
                      "--evaluate", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "PredictCost" not in proc.stderr and "op_level_cost_estimator" not in proc.stderr, proc.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results and {r["image_id"] for r in results} <= {1, 2, 3, 4} and all("segmentation" in r for r in results)
    table = proc.stdout[proc.stdout.index("AP per class"):].splitlines()
    assert table[0].split()[-2:] == ["bbox", "segm"]
    assert {row.split()[0] for row in table[2:5]} == {"circle", "square", "triangle"}
