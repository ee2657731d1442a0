"""Fail the image build unless the GPU libraries the image loads are those TensorFlow was built for.

    python check_gpu_stack.py [--efa]

TensorFlow's GPU wheel states the CUDA libraries it was built and tested with in its ``and-cuda``
extra (nvidia-cudnn-cu12==9.3.0.75, nvidia-nccl-cu12==2.21.5, ...). An older library on the loader
path is found first and TensorFlow refuses it at the first convolution ("DNN library initialization
failed": the nvidia/cuda:12.5.1-cudnn images carry cuDNN 9.2.1). So this checks, without a GPU:

- every ``and-cuda`` pin of the installed TensorFlow is installed at exactly that version;
- the cuDNN, NCCL and CUDA runtime that the dynamic loader hands out report those versions
  (``cudnnGetVersion``, ``ncclGetVersion`` and ``cudaRuntimeGetVersion`` need no GPU or driver),
  agree with ``tf.sysconfig.get_build_info()``, and are the only copies the loader knows;
- Horovod's TensorFlow library finds every library it links (the driver, ``libcuda.so.1``, comes
  from the host at run time);
- with ``--efa``: NCCL's network plugin from aws-ofi-nccl (``libnccl-net.so``) is on the loader
  path with all its libraries, so NCCL uses EFA instead of falling back to TCP sockets.

Python 3.10 (the image's); the decoding and comparison are tested on CPU in
tests/launch/test_dockerfile.py with stand-in libraries.
"""
from __future__ import annotations

import ctypes
import importlib.metadata
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

AND_CUDA_PIN = re.compile(r"^\s*(nvidia-[a-z0-9-]+)\s*==\s*([0-9][0-9.]*)\s*;\s*extra\s*==\s*[\"']and-cuda[\"']\s*$")
DRIVER = "libcuda.so.1"   # provided by the NVIDIA container runtime from the host
NCCL_NET_PLUGIN = "libnccl-net.so"


@dataclass(frozen=True)
class Library:
    """A library TensorFlow loads, the wheel that ships it and how it reports its version."""
    name: str
    distribution: str
    soname: str
    symbol: str
    by_pointer: bool        # version through an int* argument (else the return value)
    significant: int        # version components the library reports (the wheel adds a build number)

    def decode(self, code: int) -> tuple[int, ...]:
        if self.significant == 2:                 # CUDA runtime: 1000 * major + 10 * minor
            return code // 1000, code % 1000 // 10
        return code // 10000, code % 10000 // 100, code % 100   # cuDNN 9, NCCL >= 2.9


LIBRARIES = (
    Library("cuDNN", "nvidia-cudnn-cu12", "libcudnn.so.9", "cudnnGetVersion", False, 3),
    Library("NCCL", "nvidia-nccl-cu12", "libnccl.so.2", "ncclGetVersion", True, 3),
    Library("CUDA runtime", "nvidia-cuda-runtime-cu12", "libcudart.so.12", "cudaRuntimeGetVersion", True, 2),
)


def and_cuda_pins(requirements: list[str]) -> dict[str, str]:
    """``{distribution: version}`` of the ``and-cuda`` extra in a wheel's Requires-Dist lines."""
    return {m.group(1): m.group(2) for m in map(AND_CUDA_PIN.match, requirements) if m}


def version_tuple(version: str, components: int) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split(".")[:components])


def loaded_version(library: Library, path: str | None = None) -> tuple[int, ...]:
    """The version the library reports, loaded as the dynamic loader finds ``library.soname``
    (or from ``path``)."""
    handle = ctypes.CDLL(path or library.soname)
    function = getattr(handle, library.symbol)
    if library.by_pointer:
        value = ctypes.c_int(0)
        function.argtypes = [ctypes.POINTER(ctypes.c_int)]
        status = function(ctypes.byref(value))
        if status != 0:
            raise OSError(f"{library.symbol} returned status {status}")
        return library.decode(value.value)
    function.restype = ctypes.c_size_t
    return library.decode(function())


def problems(*, pins: dict[str, str], installed: dict[str, str | None], build_info: dict,
             loaded: dict[str, tuple[int, ...]],
             copies: dict[str, dict[str, tuple[int, ...] | None]]) -> list[str]:
    """Every mismatch between TensorFlow's build and what the image holds; empty when they agree.

    ``loaded``: library name -> the version of the copy the loader hands out; ``copies``: soname ->
    {every file the loader's cache knows for it: its version}."""
    out = []
    if not pins:
        out.append("the installed TensorFlow states no and-cuda pins: is it the GPU wheel `tensorflow`?")
    for dist, version in sorted(pins.items()):
        if installed.get(dist) != version:
            out.append(f"{dist} {installed.get(dist) or 'is not installed'}: TensorFlow pins {version} "
                       f"(install tensorflow[and-cuda] with the pins in constraints.txt)")
    if not build_info.get("is_cuda_build"):
        out.append("TensorFlow is not a CUDA build")
    built_cuda = version_tuple(str(build_info.get("cuda_version", "0")), 2)
    built_cudnn_major = version_tuple(str(build_info.get("cudnn_version", "0")), 1)
    tensorflow = " ".join(("TensorFlow", build_info.get("tf_version", ""))).strip()
    for library in LIBRARIES:
        want = version_tuple(pins.get(library.distribution, "0"), library.significant)
        have = loaded.get(library.name)
        shown = ".".join(map(str, have)) if have else "not loadable"
        if have != want:
            out.append(f"{library.name} {shown} is what the loader finds ({library.soname}); {tensorflow} "
                       f"was built for {'.'.join(map(str, want))}")
        if library.name == "CUDA runtime" and have and have != built_cuda:
            out.append(f"CUDA runtime {shown}; TensorFlow's build info says CUDA {build_info.get('cuda_version')}")
        if library.name == "cuDNN" and have and have[:1] != built_cudnn_major:
            out.append(f"cuDNN {shown}; TensorFlow's build info says cuDNN {build_info.get('cudnn_version')}")
        for path, version in sorted(copies.get(library.soname, {}).items()):
            if version != want:
                shown = ".".join(map(str, version)) if version else "an unloadable library"
                out.append(f"{path} is {library.name} {shown}, on the loader path beside the pinned "
                           f"{'.'.join(map(str, want))}: it can shadow it; remove it")
    return out


def loader_copies(soname: str) -> list[str]:
    """Resolved files the dynamic loader's cache knows for ``soname``."""
    listing = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=True).stdout
    paths = [line.split("=>")[-1].strip() for line in listing.splitlines()
             if line.strip().startswith(soname + " ")]
    return [str(Path(p).resolve()) for p in paths]


def copy_versions(library: Library) -> dict[str, tuple[int, ...] | None]:
    versions = {}
    for path in loader_copies(library.soname):
        try:
            versions[path] = loaded_version(library, path)
        except OSError:
            versions[path] = None
    return versions


def linked_libraries(path: str, library_path: str = "") -> dict[str, str]:
    """{soname: where the loader finds it, or 'not found'} for what ``path`` links."""
    env = {**os.environ, "LD_LIBRARY_PATH": library_path} if library_path else None
    out = subprocess.run(["ldd", path], capture_output=True, text=True, check=True, env=env).stdout
    found = {}
    for line in out.splitlines():
        name, sep, where = line.strip().partition(" => ")
        if sep:
            found[name] = where.split(" (")[0].strip()
    return found


def missing_libraries(path: str, library_path: str = "") -> list[str]:
    """Libraries ``path`` links that the loader cannot find, the host's driver excepted."""
    return [name for name, where in linked_libraries(path, library_path).items()
            if where == "not found" and name != DRIVER]


def horovod_problems() -> list[str]:
    import horovod
    import tensorflow as tf
    out = []
    libraries = sorted(Path(horovod.__file__).parent.glob("tensorflow/mpi_lib*.so"))
    if not libraries:
        out.append("Horovod has no TensorFlow library (horovod/tensorflow/mpi_lib*.so)")
    for lib in libraries:
        # TensorFlow's own libraries are loaded by `import tensorflow` before Horovod's.
        missing = missing_libraries(str(lib), tf.sysconfig.get_lib())
        if missing:
            out.append(f"{lib} links libraries the loader cannot find: {', '.join(missing)}")
    return out


def efa_problems() -> list[str]:
    copies = loader_copies(NCCL_NET_PLUGIN)
    if not copies:
        return [f"aws-ofi-nccl's {NCCL_NET_PLUGIN} is not on the loader path (ldconfig -p): NCCL would "
                f"fall back to TCP sockets on EFA nodes; add its directory under /opt/amazon/ofi-nccl to "
                f"/etc/ld.so.conf.d"]
    out = []
    missing = missing_libraries(copies[0])
    if missing:
        out.append(f"{copies[0]} links libraries the loader cannot find: {', '.join(missing)}")
    fabric = linked_libraries(copies[0]).get("libfabric.so.1", "")
    if fabric and not fabric.startswith("/opt/amazon/efa/"):
        out.append(f"the NCCL plugin loads {fabric}, not the EFA installer's libfabric in /opt/amazon/efa/lib: "
                   f"list /opt/amazon/efa/lib in a /etc/ld.so.conf.d file that sorts before x86_64-linux-gnu.conf")
    return out


def main(argv: list[str]) -> int:
    import tensorflow as tf

    pins = and_cuda_pins(importlib.metadata.requires("tensorflow") or [])

    def version_of(dist):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return None

    loaded = {}
    for library in LIBRARIES:
        try:
            loaded[library.name] = loaded_version(library)
        except OSError as err:
            print(f"{library.name}: {err}", file=sys.stderr)
    found = problems(pins=pins, installed={d: version_of(d) for d in pins},
                     build_info={**tf.sysconfig.get_build_info(), "tf_version": tf.__version__},
                     loaded=loaded, copies={lib.soname: copy_versions(lib) for lib in LIBRARIES})
    found += horovod_problems()
    if "--efa" in argv:
        found += efa_problems()
    for name, version in loaded.items():
        print(f"{name} {'.'.join(map(str, version))}")
    if found:
        print("GPU stack check failed:\n  " + "\n  ".join(found), file=sys.stderr)
        return 1
    print(f"GPU stack matches TensorFlow {tf.__version__}'s build (CUDA {tf.sysconfig.get_build_info()['cuda_version']})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
