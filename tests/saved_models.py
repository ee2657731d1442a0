"""A small exported model for the predict, export and serving tests (tests/ is on sys.path through
tests/conftest.py): a synthetic dataset, an untrained tiny run's checkpoint and config.json (as
tests/untrained_run.py writes them: score threshold 0, so every image has detections), and ``maskrcnn export`` of it.
The session fixture ``untrained_model`` (tests/conftest.py) builds it once for all of them."""
from collections import namedtuple
from pathlib import Path

from untrained_run import REPO, python_env, run_python, save_untrained_run  # noqa: F401  (the tests' helpers)

Exported = namedtuple("Exported", "data run model")


def export_untrained_model(root: Path) -> Exported:
    """``root``/data (64 px synthetic images: 2 training, 4 validation), ``root``/run (checkpoint +
    config.json), ``root``/model (the SavedModel)."""
    from training.data.synthetic import SyntheticSpec, generate

    generate(root / "data", SyntheticSpec(train=2, val=4, size=64, min_object_size=12, max_object_size=32))
    save_untrained_run(root / "data", root / "run", cwd=root)
    exported = run_python("-m", "training.export", "--checkpoint", str(root / "run"), "--output", str(root / "model"))
    assert exported.returncode == 0, exported.stdout[-2000:] + exported.stderr[-3000:]
    return Exported(root / "data", root / "run", root / "model")


def shared_untrained_model(tmp_path_factory) -> Exported:
    """:func:`export_untrained_model`, built once per session for every test file that uses it
    (tests/shared_artifacts.py): read-only, copy what a test changes."""
    from shared_artifacts import session_root, shared_artifact
    root = shared_artifact(session_root(tmp_path_factory), "untrained-model", export_untrained_model)
    return Exported(root / "data", root / "run", root / "model")
