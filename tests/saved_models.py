"""A small exported model for the export and serving tests (tests/ is on sys.path through
tests/conftest.py): a synthetic dataset, an untrained tiny run's checkpoint and config.json (as
tests/untrained_run.py writes them: score threshold 0, so every image has detections), and ``maskrcnn export`` of it."""
from collections import namedtuple
from pathlib import Path

from untrained_run import REPO, python_env, run_python, save_untrained_run  # noqa: F401  (the tests' helpers)

Exported = namedtuple("Exported", "data run model")


def export_untrained_model(root: Path) -> Exported:
    """``root``/data (64 px synthetic images), ``root``/run (checkpoint + config.json), ``root``/model
    (the SavedModel)."""
    from training.data.synthetic import SyntheticSpec, generate

    generate(root / "data", SyntheticSpec(train=2, val=3, size=64, min_object_size=12, max_object_size=32))
    save_untrained_run(root / "data", root / "run", cwd=root)
    exported = run_python("-m", "training.export", "--checkpoint", str(root / "run"), "--output", str(root / "model"))
    assert exported.returncode == 0, exported.stdout[-2000:] + exported.stderr[-3000:]
    return Exported(root / "data", root / "run", root / "model")
