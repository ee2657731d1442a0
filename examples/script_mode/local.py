"""Run a script-mode training script on this machine with either strategy, for real.

    python -m script_mode.local --strategy ps --workers 2 --ps 1 [-- --epochs 3]
    python -m script_mode.local --strategy horovod --workers 2 [--epochs 3]

- ``ps``: one process per task on 127.0.0.1 ports (a chief, the workers, the parameter servers),
  each with its own TF_CONFIG, as SageMaker's parameter-server mode gives every instance.
- ``horovod``: ``horovodrun -np N -H localhost:N --gloo`` (no MPI needed).

The script sees SageMaker's script-mode environment: SM_MODEL_DIR, SM_CHANNEL_TRAINING (the
generated digits are created there if missing), and unknown arguments as its hyperparameters.
Every input is checked before any process starts.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from script_mode import cluster as cl
from script_mode import data as digits_data
from script_mode import ps_tasks

STRATEGIES = ("ps", "horovod")
DEFAULT_SCRIPT = Path(__file__).with_name("train.py")
DEFAULT_TIMEOUT_S = 900


class LaunchError(ValueError):
    """Bad input for a local run; the message names the problem and the fix."""


@dataclass
class LaunchPlan:
    strategy: str
    workers: int
    ps: int
    script: Path
    data_dir: Path
    run_dir: Path
    script_args: list[str] = field(default_factory=list)
    timeout_s: float = DEFAULT_TIMEOUT_S

    @property
    def model_dir(self) -> Path:
        return self.run_dir / "model"

    @property
    def log_dir(self) -> Path:
        return self.run_dir / "logs"


@dataclass
class RunResult:
    returncode: int
    model_dir: Path
    wall_time_s: float

    @property
    def metrics(self) -> dict:
        return json.loads((self.model_dir / "metrics.json").read_text())


def horovodrun_path() -> str | None:
    """horovodrun from this interpreter's environment first (a venv need not be activated)."""
    beside = Path(sys.executable).with_name("horovodrun")
    return str(beside) if beside.is_file() else shutil.which("horovodrun")


def make_plan(strategy: str, workers: int, ps: int | None = None, script: str | Path | None = None,
              data_dir: str | Path = "data/script_mode", run_dir: str | Path | None = None,
              script_args: list[str] | None = None,
              timeout_s: float = DEFAULT_TIMEOUT_S) -> LaunchPlan:
    """Validate every input; raise LaunchError before anything is created or started."""
    if strategy not in STRATEGIES:
        raise LaunchError(f"unknown strategy {strategy!r}: choose one of {', '.join(STRATEGIES)}")
    if strategy == "ps":
        ps = 1 if ps is None else ps
        try:
            cl.validate_counts(workers, ps)
        except ValueError as e:
            raise LaunchError(f"{e}; for example --workers 2 --ps 1") from None
    else:
        if ps:
            raise LaunchError(f"--ps {ps} applies only to --strategy ps; Horovod has no parameter "
                              "servers (drop --ps)")
        if workers < 1:
            raise LaunchError(f"the horovod strategy needs at least 1 worker process, got "
                              f"--workers {workers}")
        if horovodrun_path() is None:
            raise LaunchError("horovodrun was not found beside this Python or on PATH: install "
                              "Horovod with `make install` (scripts/install.sh)")
        ps = 0
    script = Path(script) if script else DEFAULT_SCRIPT
    if not script.is_file():
        raise LaunchError(f"training script {script} does not exist: pass --script PATH to an "
                          f"existing .py file (default {DEFAULT_SCRIPT})")
    if timeout_s <= 0:
        raise LaunchError(f"--timeout must be positive, got {timeout_s}")
    run_dir = Path(run_dir) if run_dir else Path("runs/script_mode") / strategy
    return LaunchPlan(strategy, workers, ps, script.resolve(), Path(data_dir).resolve(),
                      run_dir.resolve(), list(script_args or []), timeout_s)


def _environment(plan: LaunchPlan, compute_processes: int) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("TF_USE_LEGACY_KERAS", "1")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["SM_MODEL_DIR"] = str(plan.model_dir)
    env["SM_CHANNEL_TRAINING"] = str(plan.data_dir)
    env.pop("TF_CONFIG", None)
    # Share the cores instead of every process starting one op thread per core. (Inter-op
    # threads stay TensorFlow's choice: with one per process the ps cluster hung here.)
    env.setdefault("TF_NUM_INTRAOP_THREADS", str(max(1, (os.cpu_count() or 1) // compute_processes)))
    return env


def _run_ps(plan: LaunchPlan, env: dict[str, str]) -> int:
    cluster = cl.local_cluster(plan.workers, plan.ps)
    tasks = [cl.Task(cl.CHIEF, 0)] + [cl.Task(cl.WORKER, i) for i in range(plan.workers)] + \
            [cl.Task(cl.PS, i) for i in range(plan.ps)]
    return ps_tasks.run_tasks([sys.executable, str(plan.script), *plan.script_args], cluster,
                              tasks, env, plan.log_dir, plan.timeout_s)


def _run_horovod(plan: LaunchPlan, env: dict[str, str]) -> int:
    n = plan.workers
    command = [horovodrun_path(), "-np", str(n), "-H", f"localhost:{n}", "--gloo",
               sys.executable, str(plan.script), *plan.script_args]
    # Its own process group, so a timeout stops horovodrun and every rank it started.
    proc = subprocess.Popen(command, env=env, start_new_session=True)
    try:
        return proc.wait(timeout=plan.timeout_s)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"the horovod run took longer than {plan.timeout_s:.0f} s") from None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def run(plan: LaunchPlan) -> RunResult:
    """Create the data if missing, start the processes, wait; the chief/rank 0 writes the model."""
    digits_data.ensure(plan.data_dir / digits_data.DATA_FILE)
    plan.log_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    if plan.strategy == "ps":
        code = _run_ps(plan, _environment(plan, plan.workers))
    else:
        code = _run_horovod(plan, _environment(plan, plan.workers))
    return RunResult(code, plan.model_dir, round(time.perf_counter() - start, 3))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m script_mode.local",
        description="Run a script-mode training script locally with a parameter server or "
                    "Horovod. Arguments not listed here are passed to the script.")
    p.add_argument("--strategy", required=True, help="ps or horovod")
    p.add_argument("--workers", type=int, required=True,
                   help="ps: worker processes (a chief is added); horovod: ranks")
    p.add_argument("--ps", type=int, default=None, help="parameter servers (ps only; default 1)")
    p.add_argument("--script", default=None, help=f"training script (default {DEFAULT_SCRIPT})")
    p.add_argument("--data-dir", default="data/script_mode",
                   help="the data channel (SM_CHANNEL_TRAINING); digits are generated if missing")
    p.add_argument("--run-dir", default=None,
                   help="model/ and logs/ go here (default runs/script_mode/<strategy>)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds")
    args, script_args = p.parse_known_args(argv)
    if script_args[:1] == ["--"]:
        script_args = script_args[1:]
    try:
        plan = make_plan(args.strategy, args.workers, args.ps, args.script, args.data_dir,
                         args.run_dir, script_args, args.timeout)
    except LaunchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        result = run(plan)
    except (RuntimeError, ps_tasks.TaskFailed) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"{plan.strategy}: exit code {result.returncode} after {result.wall_time_s:.1f} s; "
          f"model and metrics in {result.model_dir}")
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
