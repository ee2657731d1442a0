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
