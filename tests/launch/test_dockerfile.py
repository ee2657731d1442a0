"""The training image's Dockerfile and entry script (no Docker engine here: lint and static checks,
and the entry script run for real)."""
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "docker" / "Dockerfile"
ENTRYPOINT = REPO / "docker" / "entrypoint.sh"
HADOLINT = Path(sys.executable).parent / "hadolint"


def _instructions(text: str) -> list[str]:
    """Dockerfile instructions with continuation lines joined and comments dropped."""
    out, current = [], ""
    for line in text.splitlines():
        if line.strip().startswith("#") and not current:
            continue
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1] + " "
        else:
            out.append((current + line).strip())
            current = ""
    return [i for i in out if i]


def _pins() -> dict[str, str]:
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if "==" in line:
            name, version = line.split("==")
            pins[name.strip().lower()] = version.strip()
    return pins


def _pip_installs() -> list[list[str]]:
    """Argument lists of every `pip install` in the Dockerfile."""
    installs = []
    for instruction in _instructions(DOCKERFILE.read_text()):
        if not instruction.startswith("RUN"):
            continue
        for part in re.split(r"&&|;", instruction[3:]):
            words = shlex.split(part)
            if "pip" in words and "install" in words:
                installs.append(words[words.index("install") + 1:])
    return installs


def test_hadolint_is_clean():
    result = subprocess.run([str(HADOLINT), str(DOCKERFILE)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_does_catch_problems(tmp_path):  # the check above can fail
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu\nRUN apt-get install curl\nRUN cd /tmp && git clone https://example.com/x\n")
    result = subprocess.run([str(HADOLINT), str(bad)], capture_output=True, text=True)
    assert result.returncode != 0
    assert "DL3006" in result.stdout  # untagged base image


def test_python_versions_come_from_constraints_only():
    pins = _pins()
    installs = _pip_installs()
    assert len(installs) >= 3
    packages = []
    for args in installs:
        assert "-c" in args and args[args.index("-c") + 1] == "constraints.txt", args
        for word in args:
            if word.startswith("-") or word == "constraints.txt":
                continue
            assert not re.search(r"[=<>~!]", word), f"version pinned in the Dockerfile: {word}"
            packages.append(re.sub(r"\[.*\]", "", word).lower())
    unpinned = [p for p in packages if p not in pins]
    assert not unpinned, f"installed in the image but not pinned in constraints.txt: {unpinned}"
    assert {"tensorflow", "tf-keras", "horovod", "tensorpack", "sagemaker-training", "mpi4py"} <= set(packages)


def test_image_builds_horovod_with_nccl_and_mpi_and_no_git():
    text = DOCKERFILE.read_text()
    for flag in ("HOROVOD_GPU_OPERATIONS=NCCL", "HOROVOD_WITH_MPI=1", "HOROVOD_WITH_GLOO=1",
                 "HOROVOD_WITH_TENSORFLOW=1"):
        assert flag in text
    assert "git clone" not in text
    base = re.search(r"ARG CUDA_IMAGE=(\S+)", text).group(1)
    assert base.startswith("nvidia/cuda:") and "cudnn-devel-ubuntu22.04" in base
    assert "openssh-server" in text and "openmpi-bin" in text
    assert re.search(r"ARG EFA_INSTALLER_VERSION=\d+\.\d+\.\d+", text)  # libfabric + aws-ofi-nccl


def test_copied_paths_exist_and_entrypoint_dispatches():
    instructions = _instructions(DOCKERFILE.read_text())
    for instruction in instructions:
        if instruction.startswith("COPY"):
            for source in shlex.split(instruction)[1:-1]:
                assert (REPO / source).exists(), source
    entry = [i for i in instructions if i.startswith("ENTRYPOINT")][0]
    assert json.loads(entry.split(None, 1)[1]) == ["/usr/local/bin/maskrcnn-entrypoint"]
    assert [i for i in instructions if i.startswith("CMD")] == ['CMD ["train"]']
    assert os.access(ENTRYPOINT, os.X_OK)
    subprocess.run(["bash", "-n", str(ENTRYPOINT)], check=True)


def _entry(*args, env=None):
    full_env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
                "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run(["bash", str(ENTRYPOINT), *args], capture_output=True, text=True, env=full_env,
                          cwd=REPO, timeout=300)


def test_entrypoint_runs_other_commands_and_refuses_a_node_without_keys(tmp_path):
    assert _entry("echo", "hello").stdout == "hello\n"
    result = _entry("cluster-node", env={"MASKRCNN_CLUSTER_DIR": str(tmp_path)})
    assert result.returncode == 2
    assert "authorized_keys is missing" in result.stderr


def test_entrypoint_train_is_the_sagemaker_entry(tmp_path):
    base = tmp_path / "ml"
    (base / "input" / "config").mkdir(parents=True)
    (base / "input" / "config" / "hyperparameters.json").write_text("{}")
    (base / "input" / "config" / "resourceconfig.json").write_text('{"current_host": "algo-1", "hosts": ["algo-1"]}')
    (base / "input" / "config" / "inputdataconfig.json").write_text("{}")
    result = _entry("train", env={"SAGEMAKER_BASE_DIR": str(base), "AWS_DEFAULT_REGION": "us-east-1"})
    assert result.returncode != 0
    assert (base / "output" / "failure").read_text().startswith("no 'train' channel")


@pytest.mark.parametrize("command, module", [("cluster-train", "launch.cluster.run"),
                                             ("cluster-health", "launch.cluster.health"),
                                             ("hostfile", "launch.cluster.hostfile")])
def test_entrypoint_cluster_commands(command, module):
    result = _entry(command, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage:")
