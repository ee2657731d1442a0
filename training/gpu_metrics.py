"""What a rank's GPU does during training: TensorFlow's peak memory on it and the utilisation
``nvidia-smi`` reports for it, sampled in a background thread and averaged per log period.

Utilisation comes from::

    nvidia-smi --query-gpu=<QUERY_FIELDS> --format=csv,noheader,nounits

one line per GPU, values separated by comma and space, in the order asked for. Drivers answer some
fields under other names in a header (driver 580: ``clocks.sm`` as ``clocks.current.sm``), so values
are read by position, never by header name. With ``--format=csv`` the values carry units
(``100 %``, ``39287 MiB``) and a header line comes first: :func:`parse_query_gpu` reads that form too.
``[N/A]`` or ``[Not Supported]`` (a MIG slice has no utilisation counter) read as None.
tests/recorded_machines/h200-1gpu holds an H200's real outputs of this query.

nvidia-smi numbers GPUs in PCI bus order and ignores ``CUDA_VISIBLE_DEVICES``; a rank's GPU is the
``local_rank``-th CUDA device (tensorpack's Horovod trainer maps GPU:0 to it), which is the GPU whose
index is the ``local_rank``-th entry of ``CUDA_VISIBLE_DEVICES`` when that lists indices, else
``local_rank``. (CUDA orders identical GPUs, as on p4d and p5, by PCI bus id too.)

Peak memory is ``tf.config.experimental.get_memory_info('GPU:0')['peak']``: the most TensorFlow's
allocator on that GPU has held since the process started. TensorFlow reads it through its eager
context, which creates its GPU devices on first use: :func:`pin_eager_gpu` makes that context see
the rank's GPU only, so its GPU:0 is the trainer session's GPU:0 (one allocator per GPU a process
uses, shared by both), and is called before anything initialises the context.

Neither source exists on a CPU machine: the trainer then says once that GPU metrics are unavailable
and why, and trains as before.
"""
from __future__ import annotations

import os
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Callable

# The H200 recording's query (tests/recorded_machines/h200-1gpu/README.md), so its output is this
# query's output. clocks_throttle_reasons.active is the name older drivers know; driver 580 answers
# it as clocks_event_reasons.active.
QUERY_FIELDS = ("index", "pci.bus_id", "name", "utilization.gpu", "utilization.memory", "memory.used",
                "memory.total", "temperature.gpu", "power.draw", "clocks.sm", "clocks_throttle_reasons.active")
QUERY_FORMAT = "csv,noheader,nounits"
SAMPLE_SECONDS = 5.0        # nvidia-smi's own utilisation counter covers the last 1/6 s to 1 s
COMMAND_TIMEOUT_S = 10.0    # a GPU in trouble can hang nvidia-smi: never wait on it for long
_NOT_AVAILABLE = {"n/a", "[n/a]", "not supported", "[not supported]", "unknown error", "[unknown error]", ""}
_UNITS = ("%", "MiB", "W", "MHz")


def query_command(program: str = "nvidia-smi") -> list[str]:
    return [program, f"--query-gpu={','.join(QUERY_FIELDS)}", f"--format={QUERY_FORMAT}"]


def _value(text: str) -> float | str | None:
    value = text.strip()
    if value.lower() in _NOT_AVAILABLE:
        return None
    number, _, unit = value.partition(" ")
    if unit and unit not in _UNITS:
        return value   # a name with spaces ("NVIDIA H200"), not a number with a unit
    try:
        return float(number)
    except ValueError:
        return value


def parse_query_gpu(text: str, fields: tuple[str, ...] = QUERY_FIELDS) -> list[dict[str, float | str | None]]:
    """One dict per GPU line of ``nvidia-smi --query-gpu=FIELDS``: numbers as floats (units dropped),
    None where the GPU has no such value, other values as text. A header line (``--format=csv``) is
    skipped. Raises ValueError on a line with another number of values."""
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        values = line.split(", ")
        if len(values) != len(fields):
            raise ValueError(f"nvidia-smi printed {len(values)} values for the {len(fields)} fields "
                             f"{','.join(fields)}: {line!r}")
        if values[0].strip() == fields[0]:   # the header of --format=csv
            continue
        rows.append({f: _value(v) for f, v in zip(fields, values)})
    return rows


def gpu_index(local_rank: int, environ=os.environ) -> int:
    """nvidia-smi's index of the GPU the rank with ``local_rank`` computes on."""
    visible = [v.strip() for v in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if local_rank < len(visible) and visible[local_rank].isdigit():
        return int(visible[local_rank])
    return local_rank


@dataclass(frozen=True)
class Sample:
    time: float
    utilization: float       # utilization.gpu, percent
    memory_used_mib: float   # memory.used of the whole GPU (every process on it), MiB


def read_sample(index: int, *, program: str = "nvidia-smi", run=subprocess.run,
                clock: Callable[[], float] = time.monotonic) -> Sample:
    """One sample of GPU ``index``; raises RuntimeError saying why there is none."""
    try:
        proc = run(query_command(program), capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    except FileNotFoundError:
        raise RuntimeError(f"{program} is not on PATH (no NVIDIA driver on this machine)") from None
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{program} did not answer within {COMMAND_TIMEOUT_S:g} s") from None
    if proc.returncode != 0:
        raise RuntimeError(f"{program} exited with status {proc.returncode}: "
                           f"{(proc.stderr or proc.stdout).strip()[:300]}")
    try:
        rows = parse_query_gpu(proc.stdout)
    except ValueError as err:
        raise RuntimeError(str(err)) from None
    for row in rows:
        if row["index"] == index:
            if not isinstance(row["utilization.gpu"], float):
                raise RuntimeError(f"{program} reports no utilization.gpu for GPU {index} "
                                   f"({row['utilization.gpu']!r}; a MIG slice has none)")
            used = row["memory.used"]
            return Sample(clock(), row["utilization.gpu"], used if isinstance(used, float) else float("nan"))
    raise RuntimeError(f"{program} lists no GPU with index {index} (it lists {[r['index'] for r in rows]})")


class UtilizationSampler:
    """Samples GPU ``index`` every ``seconds`` in a daemon thread. A failure before any sample
    succeeded ends the sampling and is kept in :attr:`unavailable` (a machine without nvidia-smi does
    not grow one); a later one (a busy driver's timeout) only loses that sample (:attr:`failures`)."""

    def __init__(self, index: int, *, seconds: float = SAMPLE_SECONDS, program: str = "nvidia-smi",
                 clock: Callable[[], float] = time.monotonic):
        self.index, self._seconds, self._program, self._clock = index, seconds, program, clock
        self._samples: list[Sample] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._succeeded = False
        self.unavailable: str | None = None
        self.failures = 0

    def sample(self) -> Sample | None:
        if self.unavailable:
            return None
        try:
            s = read_sample(self.index, program=self._program, clock=self._clock)
        except RuntimeError as err:
            if not self._succeeded:
                self.unavailable = str(err)
            self.failures += 1
            return None
        with self._lock:
            self._succeeded = True
            self._samples.append(s)
            del self._samples[:-10_000]   # 14 hours at 5 s: more than any log period needs
        return s

    def start(self) -> "UtilizationSampler":
        if self.sample() is not None:   # the first sample here: unavailable is known at once
            self._thread = threading.Thread(target=self._loop, name="gpu-utilization", daemon=True)
            self._thread.start()
        return self

    def _loop(self):
        while not self._stop.wait(self._seconds):
            self.sample()

    def stop(self):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=COMMAND_TIMEOUT_S + 1)

    def since(self, start: float) -> list[Sample]:
        with self._lock:
            return [s for s in self._samples if s.time >= start]


class UtilizationWindow:
    """One reader's view of a sampler: the mean utilisation of the samples since its last
    :meth:`take` (one sample taken then and there when none came in between)."""

    def __init__(self, sampler: UtilizationSampler, clock: Callable[[], float] = time.monotonic):
        self._sampler, self._clock = sampler, clock
        self._start = clock()

    def take(self) -> float | None:
        samples = self._sampler.since(self._start)
        if not samples and (s := self._sampler.sample()) is not None:
            samples = [s]
        self._start = self._clock()
        return sum(s.utilization for s in samples) / len(samples) if samples else None


def pin_eager_gpu(local_rank: int) -> str | None:
    """Makes TensorFlow's eager context see only this rank's GPU (see the module docstring); returns
    why GPU memory cannot be read (None: it can). Creates no device."""
    from training.compat import tf
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return "TensorFlow sees no GPU"
    if local_rank >= len(gpus):
        return f"local rank {local_rank} has no GPU of its own ({len(gpus)} visible)"
    try:
        tf.config.set_visible_devices(gpus[local_rank], "GPU")
    except RuntimeError as err:   # the context already exists: its GPU:0 may be another GPU
        return f"TensorFlow's devices were set up before the GPU could be chosen ({err})"
    return None


def peak_memory_bytes() -> int:
    """TensorFlow's peak memory on GPU:0 since the process started, in bytes."""
    from training.compat import tf
    return int(tf.config.experimental.get_memory_info("GPU:0")["peak"])


class GpuMetrics:
    """A rank's GPU figures for the progress line and the CloudWatch records.

    ``start()`` once the trainer's session exists; each reader takes its own :meth:`window` for
    utilisation means over its own periods. :attr:`unavailable` says why there is nothing (None
    when both figures can be read)."""

    def __init__(self, *, local_rank: int, memory_unavailable: str | None, environ=os.environ,
                 program: str = "nvidia-smi", sample_seconds: float = SAMPLE_SECONDS):
        self.memory_unavailable = memory_unavailable
        self.sampler = UtilizationSampler(gpu_index(local_rank, environ), seconds=sample_seconds, program=program)
        self._started = False

    def start(self) -> None:
        if not self._started:
            self._started = True
            self.sampler.start()

    def stop(self) -> None:
        self.sampler.stop()

    @property
    def unavailable(self) -> str | None:
        reasons = [f"peak memory: {self.memory_unavailable}" if self.memory_unavailable else "",
                   f"utilisation: {self.sampler.unavailable}" if self.sampler.unavailable else ""]
        return "; ".join(r for r in reasons if r) or None

    def window(self) -> UtilizationWindow:
        return UtilizationWindow(self.sampler)

    def peak_memory_bytes(self) -> int | None:
        if self.memory_unavailable:
            return None
        try:
            return peak_memory_bytes()
        except (ValueError, RuntimeError) as err:
            self.memory_unavailable = str(err)
            return None
