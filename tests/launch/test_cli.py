"""The `maskrcnn` command as installed (the console script pyproject.toml declares, in the venv
scripts/install.sh makes): every subcommand answers --help with its own usage and an example, and
bad input ends with one clear line and a non-zero status. Each subcommand's behaviour is tested
with its module."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from launch.cli import COMMANDS

TOOL = Path(sys.executable).parent / "maskrcnn"
REPO_ROOT = Path(__file__).resolve().parents[2]


def _run(*args, timeout=120):
    return subprocess.run([str(TOOL), *args], capture_output=True, text=True, timeout=timeout)


def test_the_tool_is_installed_and_lists_every_command():
    result = _run("--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: maskrcnn COMMAND")
    listed = [line.split()[0] for line in result.stdout.splitlines() if line.startswith("  ")]
    assert listed == list(COMMANDS)


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_command_has_help_with_its_usage_and_an_example(name):
    result = _run(name, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: maskrcnn {name}"), result.stdout[:200]
    example = result.stdout.rstrip().splitlines()[-1]
    assert example.startswith(f"example: maskrcnn {name}")


def test_an_unknown_command_is_one_line_and_status_2():
    result = _run("trian")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert "unknown command 'trian'" in result.stderr and "train" in result.stderr


def test_bad_input_to_a_command_is_one_error_line_before_anything_is_written(tmp_path):
    result = _run("synthetic", "--output", str(tmp_path / "out"), "--categories", "circle,blob")
    assert result.returncode == 2
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith("maskrcnn synthetic: error:") and "blob" in error
    assert not (tmp_path / "out").exists()


def test_version_is_the_one_pyproject_declares():
    declared = re.search(r'^version = "([^"]+)"', (REPO_ROOT / "pyproject.toml").read_text(), re.M).group(1)
    result = _run("--version")
    assert result.returncode == 0 and result.stdout == f"maskrcnn {declared}\n", result


def test_a_trainer_command_without_the_trainer_names_the_install_it_needs(tmp_path):
    """As in the client install (no TensorFlow): one line naming the missing module and the extra."""
    code = ("import sys; sys.modules['tensorflow'] = None; from launch.cli import main; "
            f"sys.exit(main(['train', '--logdir', {str(tmp_path / 'run')!r}, '--preset', 'cpu_synthetic']))")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2 and result.stdout == "", result
    assert result.stderr == ("maskrcnn: error: `maskrcnn train` runs the trainer, which this install lacks "
                             "(no module 'tensorflow'): python -m pip install -c constraints.txt -e '.[train]'\n")
    assert not (tmp_path / "run").exists()


# Help for every trainer command, in one interpreter where TensorFlow, tensorpack and Horovod cannot
# be imported: the arguments are read before any of them loads.
_HELP_WITHOUT_THE_TRAINER = """
import contextlib, io, json, sys
for blocked in ("tensorflow", "tensorpack", "horovod"):
    sys.modules[blocked] = None
from launch.cli import main
results = {}
for name in sys.argv[1:]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([name, "--help"])
        except SystemExit as done:
            code = done.code
    results[name] = {"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()}
print(json.dumps(results))
"""


def test_trainer_commands_answer_help_without_loading_tensorflow():
    names = ["train", "predict", "evaluate", "export"]
    result = subprocess.run([sys.executable, "-c", _HELP_WITHOUT_THE_TRAINER, *names], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    answers = json.loads(result.stdout.splitlines()[-1])
    for name in names:
        assert answers[name]["code"] == 0, (name, answers[name]["stderr"])
        assert answers[name]["stdout"].startswith(f"usage: maskrcnn {name}"), (name, answers[name]["stdout"][:200])
