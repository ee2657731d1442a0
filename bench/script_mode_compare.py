"""Compare the two script-mode strategies on this machine: throughput and time to a test accuracy.

    .venv/bin/python bench/script_mode_compare.py [--epochs 4] [--repeats 2] [--target 0.95]

Same data (the generated digits, seed 0), model, per-worker batch size, learning rate and epochs
for every run:
- ps: 1 parameter server + 2 workers + a chief, separate processes (asynchronous updates);
- horovod: 2 ranks over Gloo (synchronous all-reduce);
- horovod-scaled-lr: the same with the learning rate times the number of ranks (Horovod's advice);
- single: one process, the baseline.
Writes bench/results/script_mode_compare.json (every run's metrics.json, plus a summary).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

sys.path.insert(0, str(REPO / "examples"))   # the example is a package of its own there
from script_mode import data, hyperparameters, local  # noqa: E402

OUT = REPO / "bench" / "results" / "script_mode_compare.json"


def run_single(data_dir: Path, run_dir: Path, script_args: list[str]) -> tuple[dict, float]:
    env = {**os.environ, "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2",
           "SM_CHANNEL_TRAINING": str(data_dir), "SM_MODEL_DIR": str(run_dir / "model")}
    start = time.perf_counter()
    subprocess.run([sys.executable, str(local.DEFAULT_SCRIPT), "--strategy", "single",
                    *script_args], env=env, check=True)
    wall = time.perf_counter() - start
    return json.loads((run_dir / "model" / "metrics.json").read_text()), wall


def run_one(strategy: str, data_dir: Path, run_dir: Path, script_args: list[str],
            workers: int, ps: int) -> tuple[dict, float]:
    if strategy == "single":
        return run_single(data_dir, run_dir, script_args)
    if strategy == "horovod-scaled-lr":
        # Horovod's usual advice: with N ranks the global batch is N times larger, so scale the
        # learning rate by N. (The ps strategy keeps one worker's batch per update.)
        lr = hyperparameters.DEFAULTS["learning_rate"] * workers
        strategy, script_args = "horovod", [*script_args, "--learning-rate", str(lr)]
    plan = local.make_plan(strategy, workers=workers, ps=ps if strategy == "ps" else None,
                           data_dir=data_dir, run_dir=run_dir, script_args=script_args,
                           timeout_s=1200)
    result = local.run(plan)
    if result.returncode != 0:
        raise SystemExit(f"{strategy} run failed with exit code {result.returncode}")
    return result.metrics, result.wall_time_s


def summarize(runs: list[dict]) -> dict:
    def med(key):
        values = [r[key] for r in runs if r.get(key) is not None]
        return round(statistics.median(values), 3) if values else None
    reached = [r["time_to_target_s"] for r in runs if r["time_to_target_s"] is not None]
    return {
        "runs": len(runs),
        "images_per_s": med("images_per_s"),
        "images_per_s_steady": med("images_per_s_steady"),
        "time_to_target_s": round(statistics.median(reached), 3) if reached else None,
        "reached_target": f"{len(reached)}/{len(runs)}",
        "final_test_accuracy": med("test_accuracy"),
        "train_time_s": med("train_time_s"),
        "process_wall_time_s": med("launch_wall_time_s"),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--target", type=float, default=0.95, help="test accuracy to time")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--ps", type=int, default=1)
    p.add_argument("--strategies", default="ps,horovod,horovod-scaled-lr,single")
    p.add_argument("--out", type=Path, default=OUT)
    a = p.parse_args(argv)
    script_args = ["--epochs", str(a.epochs), "--target-accuracy", str(a.target)]
    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="script-mode-bench-") as tmp:
        data_dir = Path(tmp) / "data"
        data.ensure(data_dir / data.DATA_FILE)
        for repeat in range(a.repeats):
            # Interleave strategies so a change in the machine's load hits all of them alike.
            for strategy in a.strategies.split(","):
                run_dir = Path(tmp) / f"{strategy}-{repeat}"
                metrics, wall = run_one(strategy, data_dir, run_dir, script_args, a.workers, a.ps)
                metrics["launch_wall_time_s"] = round(wall, 3)
                results.setdefault(strategy, []).append(metrics)
                print(f"{strategy} #{repeat}: accuracy {metrics['test_accuracy']}, "
                      f"{metrics['images_per_s']} images/s, time to {a.target}: "
                      f"{metrics['time_to_target_s']} s", flush=True)
    report = {
        "config": {"epochs": a.epochs, "target_accuracy": a.target, "workers": a.workers,
                   "parameter_servers": a.ps,
                   "batch_size_per_worker": hyperparameters.DEFAULTS["batch_size"],
                   "train_images": data.DEFAULT_TRAIN, "test_images": data.DEFAULT_TEST,
                   "repeats": a.repeats},
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version(),
                    "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
                    "note": "shared machine; runs under the caller's nice level"},
        "summary": {s: summarize(r) for s, r in results.items()},
        "runs": results,
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report["summary"], indent=2))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
