"""Passing a stop request (SIGTERM) on to the training ranks of a run on this host.

Training stops cleanly on SIGTERM: every rank stops after the same step, rank 0 saves a checkpoint
of it (training/stopping.py). The signal has to reach the ranks themselves, though, and not only
their launchers:

- SageMaker sends SIGTERM to PID 1 of each container, which is the entry
  (launch/sagemaker/entry.py, exec'd by docker/entrypoint.sh). The kernel drops signals to a PID 1
  that has no handler for them; the entry installs :class:`StopForwarder`.
- The ranks are not all the entry's children: on the leader they run under mpirun or horovodrun,
  on the other hosts of a multi-host job under sshd and Open MPI's orted.
- The launchers must not get it: mpirun answers SIGTERM by killing its ranks (SIGTERM, then SIGKILL
  after ``odls_base_sigkill_timeout``, 1 s by default: measured with Open MPI 4.1.4, a rank with a
  SIGTERM handler was gone within a second), and horovodrun terminates its ranks with SIGKILL 5 s
  after SIGTERM (horovod.runner.common.util.safe_shell_exec). Neither leaves time to save.

So each host finds its ranks of the run by their command line (``python -m training.train
--logdir LOGDIR ...`` as the entry, horovodrun and job scripts start them, or ``python -m mpi4py
maskrcnn_rank.py --logdir LOGDIR ...`` as sagemaker-training's mpirun does) and signals them
directly. The launchers then see the ranks exit, after the checkpoint.

    python -m launch.rank_signals --logdir /efs/logs/run1            # SIGTERM this host's ranks of run1
    python -m launch.rank_signals --logdir /efs/logs/run1 --signal KILL
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time

RANK_MODULE = "training.train"
# The script every rank of a multi-host SageMaker job runs under `python -m mpi4py` (launch/sagemaker/entry.py).
RANK_SCRIPT = "maskrcnn_rank.py"


def is_rank_command(argv: list[str]) -> bool:
    """Whether ``argv`` starts a training rank: a Python interpreter whose options lead to
    ``-m training.train`` or ``-m mpi4py maskrcnn_rank.py``. A launcher whose arguments merely
    contain that command (horovodrun: ``python .../horovodrun -np 2 python -m training.train``, mpirun,
    ``sh -c '...'``) is not one, nor is an input worker (``python -m training.data.workers``)."""
    if not argv or not os.path.basename(argv[0]).startswith("python"):
        return False
    for i, arg in enumerate(argv[1:], start=1):
        if arg == "-m":
            module = argv[i + 1] if i + 1 < len(argv) else ""
            if module == RANK_MODULE:
                return True
            return module == "mpi4py" and i + 2 < len(argv) and os.path.basename(argv[i + 2]) == RANK_SCRIPT
        if not arg.startswith("-") or arg == "-c":   # a script or a command: not a module run
            return False
    return False


def logdir_of(argv: list[str]) -> str | None:
    for flag, value in zip(argv, argv[1:]):
        if flag == "--logdir":
            return os.path.normpath(value)
        if flag.startswith("--logdir="):
            return os.path.normpath(flag.split("=", 1)[1])
    return None


def _command_line(pid: str, proc: str) -> list[str]:
    try:
        with open(os.path.join(proc, pid, "cmdline"), "rb") as f:
            raw = f.read()
    except OSError:   # gone meanwhile, or not ours to read
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def training_ranks(logdir: str, *, proc: str = "/proc") -> list[int]:
    """PIDs of this host's training ranks of the run writing ``logdir``."""
    want, me = os.path.normpath(logdir), os.getpid()
    ranks = []
    for pid in os.listdir(proc):
        if not pid.isdigit() or int(pid) == me:
            continue
        argv = _command_line(pid, proc)
        if is_rank_command(argv) and logdir_of(argv) == want:
            ranks.append(int(pid))
    return sorted(ranks)


def signal_ranks(logdir: str, sig: signal.Signals = signal.SIGTERM, *, skip: set[int] = frozenset()) -> list[int]:
    """Send ``sig`` to this host's ranks of the run in ``logdir`` (not to those in ``skip``); the PIDs signalled."""
    sent = []
    for pid in training_ranks(logdir):
        if pid in skip:
            continue
        try:
            os.kill(pid, sig)
            sent.append(pid)
        except ProcessLookupError:
            pass
    return sent


class StopForwarder:
    """In a job's first process (a container's PID 1): SIGTERM is passed on to this host's ranks of
    the run, to ranks that start within the next ``kill_after`` seconds too (a launcher that was
    still starting them), and ranks still running ``kill_after`` seconds after the request get
    SIGKILL, so the caller can finish (export, failure file) before the platform's own SIGKILL.

    ``install()`` first, ``watch(logdir)`` once the run's log dir is known (a request before that
    is kept: check ``requested_at`` before starting training)."""

    def __init__(self, *, kill_after: float, poll: float = 1.0, log=None):
        self.kill_after = kill_after
        self.poll = poll
        self.requested_at: float | None = None
        self.signalled: set[int] = set()
        self.killed: list[int] = []
        self._logdir: str | None = None
        self._log = log or (lambda line: print(line, file=sys.stderr, flush=True))
        self._lock = threading.Lock()

    def install(self) -> StopForwarder:
        signal.signal(signal.SIGTERM, self._on_signal)
        return self

    def watch(self, logdir: str) -> None:
        self._logdir = logdir

    def _on_signal(self, signum, _frame) -> None:
        # Runs in the main thread between bytecodes; the work (and any printing) is the thread's.
        if self.requested_at is None:
            self.requested_at = time.time()
            threading.Thread(target=self._forward, name="stop-forwarder", daemon=True).start()

    def _forward(self) -> None:
        deadline = self.requested_at + self.kill_after
        while time.time() < deadline:
            if self._logdir:
                with self._lock:
                    sent = signal_ranks(self._logdir, signal.SIGTERM, skip=self.signalled)
                    self.signalled.update(sent)
                if sent:
                    self._log(f"[entry] SIGTERM: asked training rank(s) {sent} on this host to save a checkpoint "
                              f"and stop")
            time.sleep(self.poll)
        if self._logdir:
            self.killed = signal_ranks(self._logdir, signal.SIGKILL)
            if self.killed:
                self._log(f"[entry] training rank(s) {self.killed} still running {self.kill_after:g} s after SIGTERM: "
                          f"killed, to finish before the platform's own SIGKILL")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--logdir", required=True, help="the run's --logdir, as its ranks were given it")
    p.add_argument("--signal", default="TERM", choices=["TERM", "KILL"],
                   help="TERM: save a checkpoint at the next step and exit (default); KILL: at once")
    a = p.parse_args(argv)
    sent = signal_ranks(a.logdir, getattr(signal, f"SIG{a.signal}"))
    print(f"SIG{a.signal} sent to {len(sent)} training rank(s) of {a.logdir} on this host: {sent}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
