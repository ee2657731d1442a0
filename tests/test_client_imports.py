"""The client (pyproject.toml's dependencies: the CDK app and the `maskrcnn` commands that talk to
AWS) never loads the trainer: importing each client module in a fresh interpreter, in this
environment where the trainer is installed, leaves TensorFlow, tensorpack, Horovod, OpenCV and the
rest of the `train` extra out of sys.modules. A client module that pulls one in would break the
client install (tests/test_client_install.py builds it) on every laptop."""
from __future__ import annotations

import importlib.util
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

from launch.cli import COMMANDS, TRAINER_IMPORTS

REPO_ROOT = Path(__file__).resolve().parent.parent

# The commands that run the trainer (the `train` extra); every other command is the client's.
TRAINER_COMMANDS = frozenset({"check-data", "synthetic", "train", "demo", "predict", "evaluate", "export",
                              "serve"})
CLIENT_COMMANDS = sorted(set(COMMANDS) - TRAINER_COMMANDS)
# Modules of launch/ that run only inside the training container (the trainer is there).
CONTAINER_ONLY = frozenset({"launch.sagemaker.entry", "launch.sagemaker.serve"})
# The trainer modules the client reads for names and config (no TensorFlow at import).
TRAINER_MODULES_THE_CLIENT_READS = ("training.config", "training.hparams", "training.metrics",
                                    "training.cloudwatch_metrics", "training.run_status",
                                    "training.stopping", "training.data.splits")


def _package_modules(package: str) -> list[str]:
    path = [str(REPO_ROOT / package.replace(".", "/"))]
    return [package] + [info.name for info in pkgutil.walk_packages(path, prefix=f"{package}.")]


def client_modules() -> list[str]:
    modules = ["app", *_package_modules("infra"), "launch.cli"]
    modules += [COMMANDS[name].module for name in CLIENT_COMMANDS]
    modules += [m for m in _package_modules("launch") if m not in CONTAINER_ONLY]
    modules += TRAINER_MODULES_THE_CLIENT_READS
    return sorted(set(modules))


def _trainer_modules_loaded(module: str) -> list[str]:
    code = ("import importlib, json, sys; importlib.import_module(sys.argv[1]); "
            "print(json.dumps(sorted(sys.modules)))")
    result = subprocess.run([sys.executable, "-c", code, module], cwd=REPO_ROOT, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    loaded = json.loads(result.stdout.splitlines()[-1])
    return [name for name in loaded if name.partition(".")[0] in TRAINER_IMPORTS]


def test_every_command_is_either_the_clients_or_the_trainers():
    assert TRAINER_COMMANDS <= set(COMMANDS)
    assert {COMMANDS[name].module for name in CLIENT_COMMANDS}.isdisjoint(CONTAINER_ONLY)


def test_the_trainer_is_installed_here_so_the_check_can_fail():
    """Without the trainer in this environment an import of it would fail loudly instead."""
    for name in ("tensorflow", "tensorpack", "cv2"):
        assert importlib.util.find_spec(name) is not None, name


def test_importing_all_client_modules_at_once_loads_no_trainer_module():
    code = ("import importlib, json, sys\n"
            "for name in sys.argv[1:]: importlib.import_module(name)\n"
            "print(json.dumps(sorted(sys.modules)))")
    modules = client_modules()
    assert len(modules) > 40 and "infra.stacks.sagemaker" in modules and "launch.sagemaker.launcher" in modules
    result = subprocess.run([sys.executable, "-c", code, *modules], cwd=REPO_ROOT, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    loaded = json.loads(result.stdout.splitlines()[-1])
    assert not [name for name in loaded if name.partition(".")[0] in TRAINER_IMPORTS]


@pytest.mark.parametrize("name", CLIENT_COMMANDS)
def test_a_client_commands_module_loads_no_trainer_module(name):
    """One process per command, so a culprit is named by the failing case."""
    assert _trainer_modules_loaded(COMMANDS[name].module) == []
