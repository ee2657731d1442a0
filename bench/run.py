"""Runs every benchmark in turn (`make bench`); each writes its JSON under bench/results/.

Benchmarks measure, they never assert: read the JSON (and the README's table) for the figures.
Pass benchmark names to run a subset: `python bench/run.py train_throughput synth_time`.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
# name -> arguments; ordered cheapest first so a partial run still yields figures.
BENCHMARKS = {
    "batch_padding": [],
    "input_pipeline": [],
    "train_throughput": [],
    "synth_time": [],
    "script_mode_compare": ["--repeats", "3"],
    "staging_efs": [],
}


def main(argv: list[str]) -> int:
    unknown = [name for name in argv if name not in BENCHMARKS]
    if unknown:
        print(f"unknown benchmark(s) {unknown}; choose from {list(BENCHMARKS)}", file=sys.stderr)
        return 2
    failed = []
    for name in argv or BENCHMARKS:
        print(f"== {name}", flush=True)
        rc = subprocess.call([sys.executable, str(BENCH / f"{name}.py"), *BENCHMARKS[name]])
        if rc:
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
