"""The training image's Dockerfile and entry script (no Docker engine here: lint and static checks,
and the entry script run for real)."""
import importlib.metadata
import importlib.util
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
CHECK_SCRIPT = REPO / "docker" / "check_gpu_stack.py"   # a plain script in the image build, not a package
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


def _stages() -> list[tuple[str, list[str]]]:
    """(base image with ARGs substituted, its instructions) per build stage."""
    instructions = _instructions(DOCKERFILE.read_text())
    args = {}   # the global ARGs, before the first FROM
    for i in instructions:
        if i.startswith("FROM"):
            break
        if i.startswith("ARG") and "=" in i:
            args.update([re.match(r"ARG (\w+)=(\S*)", i).groups()])
    stages = []
    for i in instructions:
        if i.startswith("FROM"):
            image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], i.split()[1])
            stages.append((image, []))
        elif stages:
            stages[-1][1].append(i)
    return stages


def _check_module():
    spec = importlib.util.spec_from_file_location("check_gpu_stack", CHECK_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("check_gpu_stack", module)   # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _gpu_stack_pins() -> dict[str, str]:
    return {name: version for name, version in _pins().items() if name.startswith("nvidia-")}


def test_image_builds_horovod_with_nccl_and_mpi_and_no_git():
    text = DOCKERFILE.read_text()
    for flag in ("HOROVOD_GPU_OPERATIONS=NCCL", "HOROVOD_WITH_MPI=1", "HOROVOD_WITH_GLOO=1",
                 "HOROVOD_WITH_TENSORFLOW=1", "HOROVOD_NCCL_HOME="):
        assert flag in text
    assert "git clone" not in text
    assert "openssh-server" in text and "openmpi-bin" in text
    assert re.search(r"ARG EFA_INSTALLER_VERSION=\d+\.\d+\.\d+", text)  # libfabric + aws-ofi-nccl


def test_gpu_stack_pins_are_tensorflows_own():
    """constraints.txt's GPU stack is exactly the `and-cuda` extra of the pinned TensorFlow: the
    CUDA, cuDNN and NCCL its GPU build was built against. tensorflow-cpu of the same version carries
    the same extra (checked against the `tensorflow` 2.18.1 wheel's METADATA when this was written)."""
    and_cuda_pins = _check_module().and_cuda_pins
    pins = _pins()
    assert importlib.metadata.version("tensorflow-cpu") == pins["tensorflow"] == pins["tensorflow-cpu"]
    tensorflows = and_cuda_pins(importlib.metadata.requires("tensorflow-cpu"))
    assert len(tensorflows) == 12 and tensorflows["nvidia-cudnn-cu12"] == "9.3.0.75"
    assert _gpu_stack_pins() == tensorflows


def test_image_runs_tensorflows_cuda_libraries_and_no_others():
    """An nvidia/cuda:12.5.1-cudnn-devel base carries cuDNN 9.2.1, which TensorFlow 2.18
    refuses: no base image may bring its own cuDNN or NCCL, the CUDA version of both stages is the
    pinned CUDA runtime's, TensorFlow comes with its pinned wheels, and the build checks the result."""
    stages = _stages()
    assert len(stages) >= 2
    cuda = ".".join(_gpu_stack_pins()["nvidia-cuda-runtime-cu12"].split(".")[:2])
    for image, _ in stages:
        assert re.fullmatch(rf"nvidia/cuda:{re.escape(cuda)}\.\d+-(devel|base)-ubuntu22\.04", image), image
        assert "cudnn" not in image
    final_image, final = stages[-1]
    assert final_image.endswith("-base-ubuntu22.04")       # the runtime: no cuDNN, NCCL or compilers
    packages = [args for args in _pip_installs() if "tensorflow[and-cuda]" in args]
    assert packages, "TensorFlow must be installed with its and-cuda extra"
    run = " ".join(i for i in final if i.startswith("RUN"))
    apt = [w for m in re.finditer(r"apt-get install ([^&;]*)", run) for w in m.group(1).split()
           if not w.startswith("-")]
    assert "openmpi-bin" in apt and "curl" in apt
    # The SageMaker SDK's driver (sm_train.sh, script-mode jobs) exits unless `pip3` or `pip` is on PATH.
    from sagemaker.train.templates import TRAIN_SCRIPT_TEMPLATE
    assert "command -v pip3" in TRAIN_SCRIPT_TEMPLATE and "python3-pip" in apt
    for package in apt:
        assert not package.startswith(("libcudnn", "libnccl", "cuda-", "build-essential", "cmake", "python3-dev")), \
            package
    assert "python docker/check_gpu_stack.py ${EFA_INSTALLER_VERSION:+--efa}" in run
    copies = [i for i in final if i.startswith("COPY --from=")]
    assert any("/usr/local/lib/python3.10/dist-packages" in c for c in copies)


def test_nccl_efa_plugin_goes_on_the_loader_path_and_spare_mpis_go():
    """aws-ofi-nccl lands in /opt/amazon/ofi-nccl/lib/x86_64-linux-gnu on Ubuntu, off the loader
    path: the EFA step puts the directory it finds there on it (ahead of Ubuntu's libfabric) and
    fails without libnccl-net.so; the installer's own Open MPI builds are removed in the same layer."""
    efa = [i for i in _stages()[-1][1] if i.startswith("RUN") and "efa_installer.sh" in i]
    assert len(efa) == 1
    step = efa[0]
    assert "find /opt/amazon/ofi-nccl -name 'libnccl-net*.so'" in step
    assert '"$plugin_dir" > /etc/ld.so.conf.d/00-efa.conf' in step
    assert "00-efa.conf" < "x86_64-linux-gnu.conf"
    assert "grep -q 'libnccl-net\\.so '" in step and "exit 1" in step
    assert "rm -rf /opt/amazon/openmpi /opt/amazon/openmpi5" in step


STAND_IN = """
#include <stddef.h>
size_t cudnnGetVersion(void) { return CUDNN; }
int ncclGetVersion(int *v) { *v = NCCL; return 0; }
int cudaRuntimeGetVersion(int *v) { *v = CUDART; return 0; }
"""
# TensorFlow 2.18.1's GPU wheel, tensorflow/python/platform/build_info.py.
TF_GPU_BUILD_INFO = {"cuda_version": "12.5.1", "cudnn_version": "9", "is_cuda_build": True, "tf_version": "2.18.1"}


def _stand_in(tmp_path, name, cudnn, nccl, cudart):
    """A library answering the three version calls like the real ones (none of those runs here)."""
    source = tmp_path / "stand_in.c"
    source.write_text(STAND_IN)
    lib = tmp_path / f"{name}.so"
    subprocess.run(["cc", "-shared", "-fPIC", f"-DCUDNN={cudnn}", f"-DNCCL={nccl}", f"-DCUDART={cudart}",
                    "-o", str(lib), str(source)], check=True)
    return str(lib)


def test_build_check_refuses_the_cudnn_tensorflow_rejects(tmp_path):
    check = _check_module()
    LIBRARIES, and_cuda_pins, loaded_version, problems = (check.LIBRARIES, check.and_cuda_pins,
                                                          check.loaded_version, check.problems)
    pins = and_cuda_pins(importlib.metadata.requires("tensorflow-cpu"))
    installed = dict(pins)
    right = _stand_in(tmp_path, "right", 90300, 22105, 12050)
    old = _stand_in(tmp_path, "old", 90201, 22105, 12050)          # nvidia/cuda:12.5.1-cudnn-*: 9.2.1
    loaded = {lib.name: loaded_version(lib, right) for lib in LIBRARIES}
    assert loaded == {"cuDNN": (9, 3, 0), "NCCL": (2, 21, 5), "CUDA runtime": (12, 5)}
    copies = {lib.soname: {right: loaded[lib.name]} for lib in LIBRARIES}
    assert problems(pins=pins, installed=installed, build_info=TF_GPU_BUILD_INFO, loaded=loaded,
                    copies=copies) == []

    cudnn = LIBRARIES[0]
    found = problems(pins=pins, installed=installed, build_info=TF_GPU_BUILD_INFO,
                     loaded={**loaded, "cuDNN": loaded_version(cudnn, old)}, copies=copies)
    assert found == ["cuDNN 9.2.1 is what the loader finds (libcudnn.so.9); TensorFlow 2.18.1 was built for 9.3.0"]
    shadowed = {**copies, cudnn.soname: {right: (9, 3, 0), old: loaded_version(cudnn, old)}}
    found = problems(pins=pins, installed=installed, build_info=TF_GPU_BUILD_INFO, loaded=loaded, copies=shadowed)
    assert len(found) == 1 and found[0].startswith(f"{old} is cuDNN 9.2.1, on the loader path")
    found = problems(pins=pins, installed={**installed, "nvidia-nccl-cu12": "2.23.4"},
                     build_info={**TF_GPU_BUILD_INFO, "cuda_version": "12.3.2"}, loaded=loaded, copies=copies)
    assert any(p.startswith("nvidia-nccl-cu12 2.23.4: TensorFlow pins 2.21.5") for p in found)
    assert any("build info says CUDA 12.3.2" in p for p in found)
    assert problems(pins={}, installed={}, build_info={}, loaded={}, copies={})[0].startswith(
        "the installed TensorFlow states no and-cuda pins")


def test_copied_paths_exist_and_entrypoint_dispatches():
    instructions = _instructions(DOCKERFILE.read_text())
    for instruction in instructions:
        if instruction.startswith("COPY") and "--from=" not in instruction:  # --from: another stage
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


def test_entrypoint_runs_other_commands_and_refuses_a_node_the_boot_did_not_set_up(tmp_path):
    assert _entry("echo", "hello").stdout == "hello\n"
    result = _entry("cluster-node", env={"MASKRCNN_CLUSTER_DIR": str(tmp_path)})
    assert result.returncode == 2
    assert f"{tmp_path}/cluster.env not found" in result.stderr


def test_entrypoint_train_is_the_sagemaker_entry(tmp_path):
    base = tmp_path / "ml"
    (base / "input" / "config").mkdir(parents=True)
    (base / "input" / "config" / "hyperparameters.json").write_text("{}")
    (base / "input" / "config" / "resourceconfig.json").write_text('{"current_host": "algo-1", "hosts": ["algo-1"]}')
    (base / "input" / "config" / "inputdataconfig.json").write_text("{}")
    result = _entry("train", env={"SAGEMAKER_BASE_DIR": str(base), "AWS_DEFAULT_REGION": "us-east-1"})
    assert result.returncode != 0
    assert (base / "output" / "failure").read_text().startswith("no 'train' channel")


def test_entrypoint_job_command():
    result = _entry("job", "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: maskrcnn job")


def test_build_check_names_libraries_the_loader_cannot_find(tmp_path):
    """What Horovod's library (and the NCCL plugin) link must resolve in the image; only the driver,
    libcuda.so.1, is left to the host."""
    check = _check_module()
    source = tmp_path / "empty.c"
    source.write_text("int placeholder(void) { return 0; }\n")
    for name in ("cuda", "standin_dep"):
        subprocess.run(["cc", "-shared", "-fPIC", f"-Wl,-soname,lib{name}.so.1", "-o",
                        str(tmp_path / f"lib{name}.so"), str(source)], check=True)
    user = tmp_path / "user.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(user), str(source), f"-L{tmp_path}", "-Wl,--no-as-needed",
                    "-lcuda", "-lstandin_dep"], check=True)
    (tmp_path / "libstandin_dep.so.1").symlink_to(tmp_path / "libstandin_dep.so")
    assert check.missing_libraries(str(user)) == ["libstandin_dep.so.1"]
    assert check.missing_libraries(str(user), str(tmp_path)) == []
    linked = check.linked_libraries(str(user), str(tmp_path))
    assert linked["libstandin_dep.so.1"] == str(tmp_path / "libstandin_dep.so.1")
