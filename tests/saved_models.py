"""A small exported model for the export and serving tests (tests/ is on sys.path through
tests/conftest.py): a synthetic dataset, an untrained tiny run's checkpoint and config.json (as
tests/training/test_predict_checkpoint.py writes them: score threshold 0, so every image has
detections), and ``maskrcnn export`` of it."""
import os
import subprocess
import sys
from collections import namedtuple
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
Exported = namedtuple("Exported", "data run model")


def python_env() -> dict[str, str]:
    return dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(REPO))


def run_python(*args, cwd=None, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd or REPO, env=python_env(), capture_output=True, text=True,
                          timeout=timeout)


def export_untrained_model(root: Path) -> Exported:
    """``root``/data (64 px synthetic images), ``root``/run (checkpoint + config.json), ``root``/model
    (the SavedModel)."""
    sys.path.insert(0, str(REPO / "tests" / "training"))
    try:
        from test_predict_checkpoint import SAVE_UNTRAINED_RUN
    finally:
        sys.path.pop(0)
    from training.data.synthetic import SyntheticSpec, generate

    generate(root / "data", SyntheticSpec(train=2, val=3, size=64, min_object_size=12, max_object_size=32))
    (root / "run").mkdir()
    saved = run_python("-c", SAVE_UNTRAINED_RUN, str(root / "data"), str(root / "run"))
    assert saved.returncode == 0, saved.stderr[-3000:]
    exported = run_python("-m", "training.export", "--checkpoint", str(root / "run"), "--output", str(root / "model"))
    assert exported.returncode == 0, exported.stdout[-2000:] + exported.stderr[-3000:]
    return Exported(root / "data", root / "run", root / "model")
