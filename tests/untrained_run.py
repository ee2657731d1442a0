"""A run's log dir as training leaves it (``config.json`` + a checkpoint), with untrained weights, for
the tests of ``training.predict``, export and serving: a tiny cpu_synthetic model on 64 px images that keeps every
detection (TEST.RESULT_SCORE_THRESH=0), so even random weights give detections to write and draw.

Building the graph turns eager execution off, so it runs in a process of its own:
``python -c SAVE_UNTRAINED_RUN DATA_DIR LOG_DIR`` (or :func:`save_untrained_run`).
"""
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

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
tf1.set_random_seed(0)   # the same untrained weights in every run: the tests' outcomes do not vary
model = MaskRCNN(cfg)
with TowerContext("", is_training=False):
    model.build_graph(*[tf1.placeholder(s.dtype, s.shape, s.name) for s in model.inputs()])
tf1.train.get_or_create_global_step()
with tf1.Session() as sess:
    sess.run(tf1.global_variables_initializer())
    # Decisive masks: initialised, the mask predictor's logits are all near 0 (probabilities near the
    # 0.5 threshold), so any two correct ways of pasting a mask would disagree on most of its pixels.
    (predictor,) = [v for v in tf1.global_variables() if v.op.name == "maskrcnn/conv/W"]
    sess.run(predictor.assign(predictor * 30))
    # entries relative to the log dir, as tensorpack's ModelSaver writes them: a copied log dir works
    tf1.train.Saver(save_relative_paths=True).save(sess, logdir + "/model-1")
with open(logdir + "/config.json", "w") as f:
    json.dump({**cfg.to_dict(), "_category_ids": split.contiguous_to_coco_id}, f)
"""


def python_env() -> dict:
    return dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(REPO))


def run_python(*args, cwd=REPO, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *map(str, args)], cwd=cwd, env=python_env(), capture_output=True,
                          text=True, timeout=timeout)


# MODULE.main(argv) for each argv in turn, in one interpreter (TensorFlow imported once, not once a
# case): exit status, stdout and stderr per case, as JSON on the last line. A SystemExit ends a case
# as it ends `python -m MODULE`: its code, or status 1 with its message on stderr.
_MAIN_PER_CASE = """
import contextlib, importlib, io, json, sys
main = importlib.import_module(sys.argv[1]).main
results = []
for argv in json.loads(sys.argv[2]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as done:
            code = done.code if isinstance(done.code, int) or done.code is None else 1
            if not isinstance(done.code, int) and done.code is not None:
                print(done.code, file=sys.stderr)
    results.append({"code": code or 0, "stdout": out.getvalue(), "stderr": err.getvalue()})
print(json.dumps(results))
"""


def run_mains(module: str, argvs, *, cwd=REPO) -> list[dict]:
    """``python -m MODULE ARGV`` for each argv, as ``MODULE.main(argv)`` calls in one interpreter:
    ``{"code", "stdout", "stderr"}`` per argv."""
    proc = run_python("-c", _MAIN_PER_CASE, module, json.dumps([[str(a) for a in argv] for argv in argvs]), cwd=cwd)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def save_untrained_run(data: Path, logdir: Path, *, cwd: Path) -> None:
    """``logdir`` (created) holds an untrained run on the dataset at ``data``."""
    Path(cwd, logdir).mkdir(parents=True, exist_ok=True)
    saved = run_python("-c", SAVE_UNTRAINED_RUN, data, logdir, cwd=cwd)
    assert saved.returncode == 0, saved.stderr[-3000:]
