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


SAVE_UNTRAINED_RUN = """
import json, sys
from training.compat import tf1, use_graph_mode
use_graph_mode()
from tensorpack.tfutils.tower import TowerContext
from training.config import finalize, new_config
from training.configs.cpu_synthetic import OVERRIDES
from training.data.coco import load_split
from training.model.generalized_rcnn import MaskRCNN
data, logdir = sys.argv[1:3]
split = load_split(data, "train2017")
cfg = new_config()
cfg.update_args(OVERRIDES + [f"DATA.BASEDIR={data!r}", "PREPROC.TRAIN_SHORT_EDGE_SIZE=[64, 64]",
                             "PREPROC.TEST_SHORT_EDGE_SIZE=64", "PREPROC.MAX_SIZE=64", "TEST.RESULT_SCORE_THRESH=0.0"])
finalize(cfg, num_ranks=1, class_names=split.class_names, has_gpu=False)
model = MaskRCNN(cfg)
with TowerContext("", is_training=False):
    model.build_graph(*[tf1.placeholder(s.dtype, s.shape, s.name) for s in model.inputs()])
tf1.train.get_or_create_global_step()
with tf1.Session() as sess:
    sess.run(tf1.global_variables_initializer())
    tf1.train.Saver().save(sess, logdir + "/model-1")
with open(logdir + "/config.json", "w") as f:
    json.dump({**cfg.to_dict(), "_category_ids": split.contiguous_to_coco_id}, f)
"""


@pytest.mark.slow
def test_predict_command_on_a_relative_log_dir_prints_no_grappler_warnings(tmp_path):
    """`python -m training.predict --checkpoint runs/r1 ...` as the README shows it: finds the
    checkpoint, writes results, and stderr holds no cost-model warning per CropAndResize."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path
    from training.data.synthetic import SyntheticSpec, generate
    repo = Path(__file__).resolve().parents[2]
    generate(tmp_path / "data", SyntheticSpec(train=2, val=2, size=64, min_object_size=12, max_object_size=32))
    (tmp_path / "runs" / "r1").mkdir(parents=True)
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(repo))
    run = lambda *args: subprocess.run([sys.executable, *args], cwd=tmp_path, env=env, capture_output=True,  # noqa: E731
                                       text=True, timeout=600)
    saved = run("-c", SAVE_UNTRAINED_RUN, str(tmp_path / "data"), "runs/r1")
    assert saved.returncode == 0, saved.stderr[-3000:]
    proc = run("-m", "training.predict", "--checkpoint", "runs/r1", "--split", "val2017", "--output", "results.json")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "PredictCost" not in proc.stderr and "op_level_cost_estimator" not in proc.stderr, proc.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results and {r["image_id"] for r in results} <= {1, 2} and all("segmentation" in r for r in results)
