"""Resume picks the newest complete checkpoint; a half-written one is never used."""
import numpy as np

from training.callbacks import latest_checkpoint, resume_step


def _save(tf, sess, saver, logdir, step, gs):
    sess.run(gs.assign(step))
    return saver.save(sess, str(logdir / "model"), global_step=step)


def test_resume_uses_newest_complete_checkpoint(tmp_path):
    from training.compat import tf, tf1
    assert latest_checkpoint(str(tmp_path)) is None and resume_step(str(tmp_path)) == (None, 0)
    graph = tf.Graph()
    with graph.as_default(), tf1.Session(graph=graph) as sess:
        gs = tf1.train.get_or_create_global_step()
        tf1.get_variable("w", initializer=np.ones(3, np.float32))
        sess.run(tf1.global_variables_initializer())
        saver = tf1.train.Saver(max_to_keep=5)
        _save(tf, sess, saver, tmp_path, 250, gs)
        _save(tf, sess, saver, tmp_path, 500, gs)
    assert resume_step(str(tmp_path)) == (str(tmp_path / "model-500"), 500)
    # a crash while writing step 750: data files exist, the state file was not updated yet
    (tmp_path / "model-750.data-00000-of-00001").write_bytes(b"partial")
    assert resume_step(str(tmp_path))[1] == 500
    # the newest listed checkpoint lost its files: fall back to the previous one
    for f in tmp_path.glob("model-500.*"):
        f.unlink()
    assert resume_step(str(tmp_path)) == (str(tmp_path / "model-250"), 250)
