"""The checks of one node's health, each a small function returning an :class:`Outcome`
(ok, a one-line detail, the raw output it judged), and the parsers of the tools' outputs.

Every external command runs through :func:`run_bounded`: a broken GPU can hang ``nvidia-smi`` and a
hung NFS mount hangs any process that touches it, so each command gets a time limit and a command
that does not return is reported, never waited on forever (a process stuck in uninterruptible I/O
that survives SIGKILL is left behind rather than waited for).

Output formats, from the tools' documentation and real machines' outputs (tests/recorded_machines
replays one H200 machine's captured outputs and p4d outputs reconstructed from published ones):

- ``nvidia-smi -L``: one ``GPU <i>: <name> (UUID: GPU-...)`` line per GPU the driver sees.
- ``nvidia-smi --query-gpu=... --format=csv,noheader`` and ``--query-remapped-rows=...``: comma+space
  separated values; ``[N/A]`` where the GPU has no such counter (A100/H100 have no page retirement,
  V100 no row remapping); pending/failure flags as ``Yes``/``No`` (some drivers print 1/0).
- Kernel log: ``NVRM: Xid (PCI:0000:10:1c): 79, pid='<unknown>', name=<unknown>, GPU has fallen off
  the bus.`` (drivers 525 to 550; 570 and later leave out pid and name).
- ``dcgmi diag -r 1``: a ``| Diagnostic | Result |`` table, one row per test with Pass, Fail, Warn
  or Skip, followed by Error/Warning/Info rows that belong to the test above them.
- ``fi_info -p efa -t FI_EP_RDM``: a block per endpoint; each EFA device has a
  ``domain: <device>-rdm`` entry (libfabric 2 lists it twice, under the ``efa-direct`` and ``efa``
  fabrics; without ``-t`` the datagram endpoints, ``<device>-dgrm``, are listed as well).
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

# How much of a command's output an alert carries (the SNS message) and a line is cut to.
TAIL_LINES = 40
TAIL_LINE_CHARS = 300


class Outcome(NamedTuple):
    ok: bool
    detail: str
    raw: str
    skipped: bool = False
    # Failed only because a command did not answer in time: a stall that may pass (a busy driver, an
    # NFS server's failover), which earns the check a second try before the node is judged.
    timed_out: bool = False


def skipped(detail: str, raw: str = "") -> Outcome:
    return Outcome(True, detail, raw, skipped=True)


def tail(text: str, lines: int = TAIL_LINES) -> str:
    return "\n".join(line[:TAIL_LINE_CHARS] for line in text.rstrip().splitlines()[-lines:])


@dataclass(frozen=True)
class Completed:
    argv: tuple[str, ...]
    returncode: int | None  # None: not started, or killed at the time limit
    stdout: str
    stderr: str
    timed_out: bool = False
    missing: bool = False
    display: str | None = None  # how the command is shown in the raw output (an inline script is long)

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def raw(self) -> str:
        return f"$ {self.display or ' '.join(self.argv)}\n{self.stdout}{self.stderr}"

    @property
    def problem(self) -> str:
        """Why the command did not succeed, in a few words."""
        if self.missing:
            return f"{self.argv[0]} not found"
        if self.timed_out:
            return "no answer within the time limit"
        last = (self.stderr.strip() or self.stdout.strip()).splitlines()
        return last[-1][:200] if last else f"exit {self.returncode}"


def run_bounded(argv: list[str], *, timeout: float, display: str | None = None) -> Completed:
    """Runs ``argv`` for at most ``timeout`` seconds; on time-out kills its whole process group."""
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                errors="replace", start_new_session=True)
    except FileNotFoundError:
        return Completed(tuple(argv), None, "", "", missing=True, display=display)
    try:
        out, err = proc.communicate(timeout=timeout)
        return Completed(tuple(argv), proc.returncode, out, err, display=display)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            out, err = proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:  # stuck in uninterruptible I/O: leave it behind
            out, err = "", ""
        _wait_group_ended(proc.pid, timeout=1)
        return Completed(tuple(argv), None, out or "", err or "", timed_out=True, display=display)


def _wait_group_ended(pgid: int, *, timeout: float) -> None:
    """Waits until no process of group ``pgid`` is alive (zombies aside). A killed process closes its
    pipes before it has finished exiting, so the end of its output comes a moment before its end."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(_alive_in_group(stat, pgid) for stat in Path("/proc").glob("[0-9]*/stat")):
        time.sleep(0.01)


def _alive_in_group(stat: Path, pgid: int) -> bool:
    try:
        fields = stat.read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):   # the process ended while it was read
        return False
    return fields[0] != "Z" and int(fields[2]) == pgid


def find_program(name: str, *fallbacks: str) -> str:
    """``name`` from PATH, else the first of ``fallbacks`` that exists, else ``name`` (which then
    reports itself as not found)."""
    return shutil.which(name) or next((f for f in fallbacks if os.access(f, os.X_OK)), name)


# --- GPUs ------------------------------------------------------------------------------------------

def parse_gpu_list(text: str) -> list[str]:
    """The ``GPU <i>: ...`` lines of ``nvidia-smi -L`` (MIG devices are indented under them)."""
    return [line for line in text.splitlines() if line.startswith("GPU ")]


def check_gpu_count(*, expected: int, timeout: float) -> Outcome:
    """``nvidia-smi -L`` lists as many GPUs as the instance type has."""
    if expected == 0:
        return Outcome(True, "0 GPUs expected (CPU instance type): nvidia-smi not run", "")
    result = run_bounded(["nvidia-smi", "-L"], timeout=timeout)
    if result.missing or result.timed_out:
        return Outcome(False, f"nvidia-smi -L: {result.problem}", result.raw, timed_out=result.timed_out)
    seen = len(parse_gpu_list(result.stdout))
    detail = f"{seen} of {expected} GPUs visible"
    if seen != expected and (not result.ok or result.stderr.strip()):
        detail += f" (nvidia-smi -L: {result.problem})"
    return Outcome(seen == expected, detail, result.raw)


GPU_QUERY = ("index", "pci.bus_id", "ecc.errors.uncorrected.volatile.total", "retired_pages.pending")
REMAP_QUERY = ("gpu_bus_id", "remapped_rows.pending", "remapped_rows.failure")
_NOT_AVAILABLE = {"n/a", "[n/a]", "not supported", "[not supported]", "unknown error", "[unknown error]"}


def csv_value(text: str) -> int | bool | str | None:
    """One nvidia-smi CSV value: None where not available, bools for Yes/No, ints for counts."""
    value = text.strip()
    if value.lower() in _NOT_AVAILABLE or not value:
        return None
    if value in ("Yes", "No"):
        return value == "Yes"
    return int(value) if value.isdigit() else value


def parse_query_csv(text: str, fields: tuple[str, ...]) -> list[dict[str, int | bool | str | None]]:
    """Rows of ``nvidia-smi --query-...=FIELDS --format=csv,noheader``."""
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        values = [v.strip() for v in line.split(",")]
        if len(values) != len(fields):
            raise ValueError(f"nvidia-smi printed {len(values)} values for {len(fields)} fields: {line!r}")
        rows.append({f: csv_value(v) for f, v in zip(fields, values)})
    return rows


def _flag(value: int | bool | str | None) -> bool:
    """A pending/failure flag: Yes/No, or 1/0 on drivers that print numbers."""
    return value is True or value == 1


def gpu_problems(gpus: list[dict], remaps: list[dict]) -> list[str]:
    """What is wrong with each GPU: uncorrectable ECC errors since the driver loaded, pages pending
    retirement (V100 and older), row remapping pending or failed (A100 and newer)."""
    by_bus = {str(r["gpu_bus_id"]).lower(): r for r in remaps}
    problems = []
    for gpu in gpus:
        name = f"GPU {gpu['index']} ({gpu['pci.bus_id']})"
        found = []
        ecc = gpu["ecc.errors.uncorrected.volatile.total"]
        if isinstance(ecc, int) and ecc > 0:
            found.append(f"{ecc} uncorrectable ECC error{'s' if ecc > 1 else ''} since the driver loaded")
        if _flag(gpu["retired_pages.pending"]):
            found.append("pages pending retirement (needs a reboot)")
        remap = by_bus.get(str(gpu["pci.bus_id"]).lower(), {})
        if _flag(remap.get("remapped_rows.failure")):
            found.append("row remapping failed")
        if _flag(remap.get("remapped_rows.pending")):
            found.append("row remapping pending (needs a GPU reset)")
        if found:
            problems.append(f"{name}: {', '.join(found)}")
    return problems


def check_gpu_health(*, expected: int, timeout: float) -> Outcome:
    """Uncorrectable ECC errors, retired pages pending, row remapping pending or failed."""
    if expected == 0:
        return skipped("no GPUs on this instance type")
    fmt = "--format=csv,noheader"
    gpus_run = run_bounded(["nvidia-smi", f"--query-gpu={','.join(GPU_QUERY)}", fmt], timeout=timeout)
    if not gpus_run.ok:
        return Outcome(False, f"nvidia-smi --query-gpu: {gpus_run.problem}", gpus_run.raw,
                       timed_out=gpus_run.timed_out)
    remap_run = run_bounded(["nvidia-smi", f"--query-remapped-rows={','.join(REMAP_QUERY)}", fmt],
                            timeout=timeout)
    raw = gpus_run.raw + remap_run.raw
    try:
        gpus = parse_query_csv(gpus_run.stdout, GPU_QUERY)
        # A driver or GPU without row remapping: nothing to judge there, the ECC counters still count.
        remaps = parse_query_csv(remap_run.stdout, REMAP_QUERY) if remap_run.ok else []
    except ValueError as err:
        return Outcome(False, str(err), raw)
    problems = gpu_problems(gpus, remaps)
    if problems:
        return Outcome(False, "; ".join(problems), raw)
    return Outcome(True, f"{len(gpus)} GPUs: no uncorrectable ECC errors, no pending page "
                         f"retirement or row remapping", raw)


# --- Xid errors in the kernel log -----------------------------------------------------------------

# Xids that take a node out of service: NVIDIA's Xid catalogue (docs.nvidia.com/deploy/xid-errors)
# resolves these with a GPU reset or a node reboot, or hardware service, not by restarting the
# application. Application-level Xids (13, 31, 43, 45, ...) are a job's own errors and leave the node
# healthy. Xid lines stay in the kernel log until the next boot: a node that logged one of these is
# replaced rather than reset in place.
FATAL_XIDS: dict[int, str] = {
    48: "double-bit ECC error",
    63: "ECC page retirement or row remapping event, GPU reset needed",
    64: "ECC page retirement or row remapping failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
    140: "unrecovered ECC error",
}
_XID = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9A-Fa-f:.]+)\): (?P<xid>\d+),\s*(?P<text>.*)")


class XidEvent(NamedTuple):
    xid: int
    pci: str
    text: str


def parse_xids(log: str) -> list[XidEvent]:
    return [XidEvent(int(m["xid"]), m["pci"], m["text"].strip()) for m in _XID.finditer(log)]


KERNEL_LOG_COMMANDS = (["dmesg"], ["journalctl", "-k", "-b", "--no-pager", "--quiet"])


def read_kernel_log(*, timeout: float) -> tuple[str | None, str]:
    """The kernel log since boot, and the raw output of the attempts. ``dmesg`` first; in a container
    without CAP_SYSLOG it is refused, then ``journalctl -k -b`` (needs the host's journal)."""
    raw, reasons = [], []
    for argv in KERNEL_LOG_COMMANDS:
        result = run_bounded(argv, timeout=timeout)
        raw.append(result.raw)
        if result.ok and result.stdout.strip() and result.stdout.strip() != "-- No entries --":
            return result.stdout, "".join(raw)
        problem = result.problem if not result.ok else "no kernel messages"
        reasons.append(problem if problem.startswith(f"{argv[0]}:") else f"{' '.join(argv)}: {problem}")
    return None, "; ".join(reasons) + "\n" + "".join(raw)


def check_xid(*, expected_gpus: int, timeout: float) -> Outcome:
    """No Xid from :data:`FATAL_XIDS` in the kernel log since boot."""
    if expected_gpus == 0:
        return skipped("no GPUs on this instance type")
    log, raw = read_kernel_log(timeout=timeout)
    if log is None:
        return skipped(f"kernel log unreadable ({raw.splitlines()[0]}): give the container "
                       f"CAP_SYSLOG (docker run --cap-add SYSLOG) so that dmesg works", raw)
    events = parse_xids(log)
    fatal = list(dict.fromkeys((e.xid, e.pci) for e in events if e.xid in FATAL_XIDS))
    others = sorted({e.xid for e in events if e.xid not in FATAL_XIDS})
    noted = f" (application Xids seen: {', '.join(map(str, others))})" if others else ""
    xid_lines = "\n".join(line for line in log.splitlines() if "NVRM: Xid" in line)
    if fatal:
        named = "; ".join(f"Xid {xid} ({FATAL_XIDS[xid]}) on PCI:{pci}" for xid, pci in fatal)
        return Outcome(False, named + noted, xid_lines or tail(log))
    return Outcome(True, "no fatal Xid since boot" + noted, xid_lines)


# --- DCGM -----------------------------------------------------------------------------------------

_RESULT = re.compile(r"^(?:GPU\s*\d+:\s*)?(Pass|Fail|Warn|Skip)\b", re.IGNORECASE)
_SEVERITY = {"pass": 0, "skip": 0, "warn": 1, "fail": 2}
_NOTE_ROWS = {"error": "fail", "warning": "warn", "info": None}


@dataclass
class DiagTest:
    name: str
    result: str = "pass"
    notes: list[str] | None = None

    def worse(self, result: str) -> None:
        if _SEVERITY[result] > _SEVERITY[self.result]:
            self.result = result


def parse_dcgm_diag(text: str) -> list[DiagTest]:
    """The tests of a ``dcgmi diag`` result table, each with its worst result and its notes."""
    tests: list[DiagTest] = []
    note_open = False
    for line in text.splitlines():
        if not line.startswith("|") or line.startswith(("|-", "|=")):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 2 or cells[0] == "Diagnostic":
            continue
        name, value = cells
        result = _RESULT.match(value)
        if name.lower() in _NOTE_ROWS and tests:
            severity = _NOTE_ROWS[name.lower()]
            if severity:
                tests[-1].worse(severity)
            tests[-1].notes = (tests[-1].notes or []) + [value]
            note_open = True
        elif name and result:
            tests.append(DiagTest(name, result[1].lower()))
            note_open = False
        elif not name and result and tests:
            tests[-1].worse(result[1].lower())
        elif not name and note_open and tests and tests[-1].notes:
            tests[-1].notes[-1] += value  # dcgmi wraps long notes into the next row
    return tests


def check_dcgm(*, expected_gpus: int, timeout: float) -> Outcome:
    """DCGM's quick diagnostics (``dcgmi diag -r 1``), where DCGM is installed."""
    if expected_gpus == 0:
        return skipped("no GPUs on this instance type")
    dcgmi = shutil.which("dcgmi")
    if dcgmi is None:
        return skipped("dcgmi not installed")
    result = run_bounded([dcgmi, "diag", "-r", "1"], timeout=timeout)
    tests = parse_dcgm_diag(result.stdout)
    if not tests:
        # No table: DCGM itself did not run (no host engine, say), which says nothing about the GPUs.
        return skipped(f"dcgmi diag -r 1 gave no result table: {result.problem}", result.raw)
    failed = [t for t in tests if t.result == "fail"]
    warned = [t for t in tests if t.result == "warn"]
    if failed:
        named = "; ".join(f"{t.name}: Fail" + (f" ({' '.join(t.notes)})" if t.notes else "") for t in failed)
        return Outcome(False, named, result.raw)
    detail = f"{len(tests)} tests passed" + (f", warnings: {', '.join(t.name for t in warned)}" if warned else "")
    return Outcome(True, detail, result.raw)


# --- EFA and NCCL's network plugin ----------------------------------------------------------------

FI_INFO_FALLBACKS = ("/opt/amazon/efa/bin/fi_info",)


# The reliable-datagram endpoints NCCL's EFA plugin uses, one per device: the query AWS's EFA guides
# verify an instance with.
FI_INFO_ARGS = ("-p", "efa", "-t", "FI_EP_RDM")


def parse_fi_info(text: str) -> list[str]:
    """The distinct EFA devices in ``fi_info -p efa [-t FI_EP_RDM]`` output (``domain: <device>-rdm``)."""
    found = set(re.findall(r"^\s*domain:\s*(\S+)-rdm\s*$", text, re.MULTILINE))
    return sorted(found, key=lambda d: [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", d)])


def check_efa(*, expected: int, timeout: float) -> Outcome:
    """libfabric's EFA provider sees one device per EFA interface the node was launched with."""
    if expected == 0:
        return skipped("no EFA interfaces on this node")
    result = run_bounded([find_program("fi_info", *FI_INFO_FALLBACKS), *FI_INFO_ARGS], timeout=timeout)
    if result.missing or result.timed_out:
        return Outcome(False, f"fi_info {' '.join(FI_INFO_ARGS)}: {result.problem}", result.raw,
                       timed_out=result.timed_out)
    devices = parse_fi_info(result.stdout)
    detail = f"{len(devices)} of {expected} EFA devices"
    if len(devices) != expected:
        why = f" present: {', '.join(devices)}" if devices else f" ({result.problem})"
        return Outcome(False, detail + why, result.raw)
    return Outcome(True, f"{detail}: {', '.join(devices)}", result.raw)


# Where AWS's EFA installer puts aws-ofi-nccl: lib/x86_64-linux-gnu on Ubuntu with older installers,
# lib with newer ones; /opt/aws-ofi-nccl/lib on older Deep Learning AMIs.
NCCL_PLUGIN = "libnccl-net.so"
NCCL_PLUGIN_DIRS = ("/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu", "/opt/amazon/ofi-nccl/lib",
                    "/opt/aws-ofi-nccl/lib")

# Loads the plugin the way NCCL does (dlopen by name, or a path) in a process of its own (a plugin
# whose constructor crashes takes only the probe down), and prints where it came from and which
# plugin interface versions it exports (NCCL looks up ncclNetPlugin_v<N>).
_PLUGIN_PROBE = """
import ctypes, sys
try:
    lib = ctypes.CDLL(sys.argv[1])
except OSError as err:
    sys.exit(str(err))
versions = [f"ncclNetPlugin_v{n}" for n in range(20, 1, -1) if hasattr(lib, f"ncclNetPlugin_v{n}")]
path = next((l.split()[-1] for l in open("/proc/self/maps") if "libnccl-net" in l), sys.argv[1])
print(path, *versions)
sys.exit(0 if versions else "exports no ncclNetPlugin_v<N> symbol: not an NCCL network plugin")
"""


def _load_plugin(name: str, timeout: float) -> Completed:
    return run_bounded([sys.executable, "-I", "-c", _PLUGIN_PROBE, name], timeout=timeout,
                       display=f"load {name} as NCCL does (dlopen)")


def check_nccl_plugin(*, expected_efa: int, timeout: float,
                      search_dirs: tuple[str, ...] = NCCL_PLUGIN_DIRS) -> Outcome:
    """NCCL's EFA transport, the aws-ofi-nccl plugin, loads as NCCL loads it (``libnccl-net.so``
    from the loader path)."""
    if expected_efa == 0:
        return skipped("no EFA interfaces on this node")
    loaded = _load_plugin(NCCL_PLUGIN, timeout)
    if loaded.ok:
        path, *versions = loaded.stdout.split()
        return Outcome(True, f"{path} loads ({', '.join(versions)})", loaded.raw)
    if loaded.timed_out:
        return Outcome(False, f"loading {NCCL_PLUGIN}: {loaded.problem}", loaded.raw, timed_out=True)
    raw = loaded.raw
    for directory in search_dirs:
        candidate = Path(directory, NCCL_PLUGIN)
        if candidate.exists():
            direct = _load_plugin(str(candidate), timeout)
            raw += direct.raw
            if direct.ok:
                return Outcome(False, f"{candidate} loads but is not on the loader path, so NCCL falls "
                                      f"back to TCP sockets: add {directory} to LD_LIBRARY_PATH or "
                                      f"/etc/ld.so.conf.d", raw)
            return Outcome(False, f"{candidate} does not load: {direct.problem}", raw)
    return Outcome(False, f"{NCCL_PLUGIN} not found on the loader path ({loaded.problem}) nor in "
                          f"{', '.join(search_dirs)}", raw)


# --- file systems and disks -----------------------------------------------------------------------

MARKER_DIR = ".maskrcnn/node-health"  # under each shared mount: the probe's marker, removed after

# A stat, then a small write and read back of a marker, in a process of its own: on a hung NFS or
# Lustre mount the first call blocks, and only the probe is left waiting.
_FS_PROBE = """
import os, sys
mount, marker_dir, name = sys.argv[1:4]
try:
    if not os.path.isdir(mount):
        sys.exit(f"{mount} is not a directory: the file system is not mounted here")
    directory = os.path.join(mount, marker_dir)
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, name)
    data = f"node health marker {name}\\n".encode()
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    with open(path, "rb") as f:
        back = f.read()
    os.unlink(path)
except OSError as err:
    sys.exit(f"{err.strerror}: {err.filename}")
if back != data:
    sys.exit(f"{path}: read back {len(back)} bytes, not the {len(data)} written")
"""


def probe_mount(path: str, *, timeout: float) -> Completed:
    marker = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    return run_bounded([sys.executable, "-I", "-c", _FS_PROBE, path, MARKER_DIR, marker], timeout=timeout,
                       display=f"stat {path}, write and read back {path}/{MARKER_DIR}/{marker}")


def check_shared_fs(*, paths: list[str], timeout: float) -> Outcome:
    """Each shared mount answers a stat and a marker's write and read back within ``timeout``."""
    problems, raw, all_timed_out = [], "", True
    for path in paths:
        result = probe_mount(path, timeout=timeout)
        raw += result.raw
        if result.timed_out:
            problems.append(f"{path}: no answer within {timeout:.0f} s (hung mount)")
        elif not result.ok:
            problems.append(f"{path}: {result.problem}")
            all_timed_out = False
    if problems:
        return Outcome(False, "; ".join(problems), raw, timed_out=all_timed_out)
    return Outcome(True, f"{', '.join(paths)}: marker written and read back", raw)


def check_disk(*, paths: list[str], min_free_gib: float) -> Outcome:
    """Each local disk has at least ``min_free_gib`` free."""
    found, problems = [], []
    for path in paths:
        try:
            free = shutil.disk_usage(path).free / 2**30
        except OSError as err:
            problems.append(f"{path}: {err.strerror}")
            continue
        found.append(f"{path}: {free:.1f} GiB free")
        if free < min_free_gib:
            problems.append(f"{path}: {free:.2f} GiB free, below the floor of {min_free_gib:g} GiB")
    raw = "\n".join(found)
    if problems:
        return Outcome(False, "; ".join(problems), raw)
    return Outcome(True, "; ".join(found) + f" (floor {min_free_gib:g} GiB)", raw)
