"""Finding and signalling a run's training ranks on this host (launch/rank_signals.py), with real
processes: stand-in ranks started with the command lines the launchers use, next to a launcher
whose arguments contain that command line, an input worker and a rank of another run."""
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from launch.rank_signals import is_rank_command, training_ranks

PY = sys.executable

# The command lines as the launchers start them (horovodrun's and mpirun's are their own processes;
# sagemaker-training's MasterRunner runs `python -m mpi4py maskrcnn_rank.py ARGS` on every host).
RANKS = [
    [PY, "-m", "training.train", "--logdir", "/efs/logs/r1", "--config", "A=1"],
    ["/usr/bin/python3", "-u", "-m", "training.train", "--logdir", "/efs/logs/r1"],
    ["/opt/conda/bin/python3.10", "-m", "mpi4py", "maskrcnn_rank.py", "--logdir", "/opt/ml/input/data/log/job"],
]
NOT_RANKS = [
    [PY, f"{Path(PY).parent}/horovodrun", "-np", "2", "-H", "localhost:2", PY, "-m", "training.train", "--logdir", "x"],
    ["mpirun", "--host", "algo-1:2", "-x", "NCCL_DEBUG", PY, "-m", "mpi4py", "maskrcnn_rank.py", "--logdir", "x"],
    ["/bin/sh", "-c", f"{PY} -m training.train --logdir x"],
    [PY, "-m", "training.data.workers", "5", "6"],
    [PY, "-c", "import time", "-m", "training.train", "--logdir", "x"],
    [PY, "-m", "mpi4py", "other_script.py", "--logdir", "x"],
    [],
]


@pytest.mark.parametrize("argv", RANKS)
def test_rank_command_lines(argv):
    assert is_rank_command(argv)


@pytest.mark.parametrize("argv", NOT_RANKS)
def test_launchers_workers_and_others_are_not_ranks(argv):
    assert not is_rank_command(argv)


# A stand-in `training` package: `python -m training.train` here records the signals it gets in
# <logdir>/signals-<pid> and keeps running (or, with --stubborn, ignores SIGTERM), as a rank does.
STAND_IN = {
    "training/__init__.py": "",
    "training/data/__init__.py": "",
    "training/train.py": """
        import os, signal, sys, time
        logdir = sys.argv[sys.argv.index("--logdir") + 1]
        def record(signum, _frame):
            with open(os.path.join(logdir, f"signals-{os.getpid()}"), "a") as f:
                f.write(signal.Signals(signum).name + "\\n")
        signal.signal(signal.SIGTERM, record)
        open(os.path.join(logdir, f"ready-{os.getpid()}"), "w").close()
        while True:
            time.sleep(0.05)
    """,
    "training/data/workers.py": """
        import time
        while True:
            time.sleep(0.05)
    """,
}


@pytest.fixture
def stand_in(tmp_path):
    root = tmp_path / "stand_in"
    for name, text in STAND_IN.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text))
    procs = []

    def start(*argv, wait_ready: Path | None = None):
        proc = subprocess.Popen([PY, *argv], cwd=root, env={**os.environ, "PYTHONPATH": str(root)})
        procs.append(proc)
        if wait_ready is not None:
            deadline = time.monotonic() + 30
            while not (wait_ready / f"ready-{proc.pid}").exists():
                assert proc.poll() is None and time.monotonic() < deadline, "stand-in rank did not start"
                time.sleep(0.05)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def _signals(logdir: Path, pid: int) -> list[str]:
    path = logdir / f"signals-{pid}"
    return path.read_text().split() if path.exists() else []


def test_only_the_runs_ranks_on_this_host_are_found_and_signalled(stand_in, tmp_path):
    run, other = tmp_path / "logs" / "run", tmp_path / "logs" / "other"
    run.mkdir(parents=True)
    other.mkdir()
    rank = stand_in("-m", "training.train", "--logdir", str(run), wait_ready=run)
    other_rank = stand_in("-m", "training.train", "--logdir", str(other), wait_ready=other)
    launcher = stand_in("-c", "import time; time.sleep(60)", "-m", "training.train", "--logdir", str(run))
    worker = stand_in("-m", "training.data.workers", "--logdir", str(run))
    time.sleep(0.3)   # the last two have no readiness file; their command lines exist from the start

    assert training_ranks(str(run)) == [rank.pid]
    assert training_ranks(str(run) + "/") == [rank.pid]          # the same directory, spelled differently
    assert training_ranks(str(other)) == [other_rank.pid]

    from launch.rank_signals import signal_ranks
    assert signal_ranks(str(run)) == [rank.pid]
    deadline = time.monotonic() + 10
    while not _signals(run, rank.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _signals(run, rank.pid) == ["SIGTERM"]
    assert _signals(other, other_rank.pid) == []
    for proc in (rank, other_rank, launcher, worker):
        assert proc.poll() is None, "a process that was not signalled (or that records SIGTERM) ended"


# The forwarder as the entry runs it: this script stands in for the entry (PID 1 of a container).
FORWARDER = """
import sys, time
from launch.rank_signals import StopForwarder
stop = StopForwarder(kill_after=float(sys.argv[2]), poll=0.1).install()
stop.watch(sys.argv[1])
print("ready", flush=True)
while stop.requested_at is None:
    time.sleep(0.05)
time.sleep(float(sys.argv[2]) + 1)
print("signalled", sorted(stop.signalled), "killed", sorted(stop.killed), flush=True)
"""


def test_the_forwarder_passes_sigterm_on_also_to_late_ranks_and_kills_them_when_time_is_up(stand_in, tmp_path):
    run = tmp_path / "logs" / "run"
    run.mkdir(parents=True)
    early = stand_in("-m", "training.train", "--logdir", str(run), wait_ready=run)
    repo = Path(__file__).resolve().parents[2]
    entry = subprocess.Popen([PY, "-c", FORWARDER, str(run), "2"], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(repo)})
    try:
        assert entry.stdout.readline().strip() == "ready"
        entry.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        late = stand_in("-m", "training.train", "--logdir", str(run))   # a launcher still starting ranks
        out, _ = entry.communicate(timeout=30)
    finally:
        if entry.poll() is None:
            entry.kill()
    assert entry.returncode == 0
    # the stand-in records SIGTERM and goes on: 2 s after the request the forwarder killed it
    assert _signals(run, early.pid) == ["SIGTERM"]
    assert early.wait(timeout=10) == -signal.SIGKILL
    # The late one got SIGTERM too: within its first milliseconds, before its handler existed, it
    # dies of it (a real rank then has trained nothing in this attempt, so nothing is lost); had
    # the forwarder missed it, it would live until the SIGKILL.
    late_status = late.wait(timeout=10)
    assert late_status == -signal.SIGTERM or (_signals(run, late.pid) == ["SIGTERM"]
                                              and late_status == -signal.SIGKILL), late_status
    assert f"signalled {sorted([early.pid, late.pid])}" in out
    assert f"killed {[early.pid]}" in out or f"killed {sorted([early.pid, late.pid])}" in out
