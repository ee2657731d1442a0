"""The training script's hyperparameters: one definition for the script (train.py) and for the
SageMaker launcher, which checks a job's hyperparameters before anything is uploaded.

Importing this module does not import TensorFlow, so the launcher can use it anywhere.
SageMaker passes hyperparameters as ``--name value`` with the name as written, so each option
accepts both spellings (``--batch-size`` and ``--batch_size``).
"""
from __future__ import annotations

import argparse
import os

STRATEGIES = ("auto", "ps", "horovod", "single")
DEFAULTS = {"epochs": 4, "batch_size": 64, "learning_rate": 2e-3, "target_accuracy": 0.95}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="Train the digit classifier (script mode).",
                                exit_on_error=False)
    p.add_argument("--strategy", choices=STRATEGIES, default="auto",
                   help="auto: ps if TF_CONFIG has ps tasks, horovod under horovodrun/mpirun, "
                        "else one process")
    p.add_argument("--epochs", type=int, default=DEFAULTS["epochs"])
    p.add_argument("--batch-size", "--batch_size", dest="batch_size", type=int,
                   default=DEFAULTS["batch_size"], help="images per step on each worker / rank")
    p.add_argument("--learning-rate", "--learning_rate", dest="learning_rate", type=float,
                   default=DEFAULTS["learning_rate"])
    p.add_argument("--target-accuracy", "--target_accuracy", dest="target_accuracy", type=float,
                   default=DEFAULTS["target_accuracy"],
                   help="report the training time at which test accuracy first reaches this")
    p.add_argument("--threads", type=int, default=0,
                   help="TensorFlow intra-op threads per process (0: TensorFlow decides)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model-dir", "--model_dir", dest="model_dir",
                   default=os.environ.get("SM_MODEL_DIR", "runs/script_mode/model"))
    p.add_argument("--data-dir", "--data_dir", dest="data_dir",
                   default=os.environ.get("SM_CHANNEL_TRAINING", "data/script_mode"))
    p.add_argument("--startup-timeout", "--startup_timeout", dest="startup_timeout", type=float,
                   default=600.0, help="seconds a worker/ps waits for the chief to appear")
    return p


def check(args: argparse.Namespace) -> argparse.Namespace:
    for name in ("epochs", "batch_size"):
        if getattr(args, name) < 1:
            raise ValueError(f"{name} must be at least 1, got {getattr(args, name)}")
    if args.learning_rate <= 0:
        raise ValueError(f"learning_rate must be positive, got {args.learning_rate}")
    if not 0 < args.target_accuracy <= 1:
        raise ValueError(f"target_accuracy must be in (0, 1], got {args.target_accuracy}")
    return args


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """For the script: argparse's usual exit with a message on bad input."""
    p = parser()
    try:
        args, unknown = p.parse_known_args(argv)
        if unknown:
            p.error(f"unrecognized arguments: {' '.join(unknown)}")
        return check(args)
    except (argparse.ArgumentError, ValueError) as e:
        p.error(str(e))


def validate(hyperparameters: dict[str, object]) -> list[str]:
    """For a launcher: the ``--name value`` list SageMaker will pass, or ValueError naming the
    wrong hyperparameter and what is allowed."""
    known = {opt.lstrip("-") for a in parser()._actions for opt in a.option_strings} - {"h", "help"}
    for name in hyperparameters:
        if name not in known:
            raise ValueError(f"unknown hyperparameter {name!r}; the script takes: "
                             f"{', '.join(sorted(n for n in known if '-' not in n))}")
    argv = [item for name, value in hyperparameters.items() for item in (f"--{name}", str(value))]
    try:
        args, _ = parser().parse_known_args(argv)
        check(args)
    except (argparse.ArgumentError, ValueError) as e:
        raise ValueError(f"bad hyperparameter: {e}") from None
    return argv
