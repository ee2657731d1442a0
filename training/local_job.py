"""The complete local job (``make demo``): dataset, 2-process Horovod training on CPU, mAP table.

1. creates the synthetic shapes dataset (training/configs/cpu_synthetic.py's DATASET) if missing;
2. runs ``horovodrun -np 2 -H localhost:2 --gloo python -m training.train`` with the CPU preset
   (progress lines: step, losses, images/s, time left; COCO evaluation after the last epoch);
3. prints the final COCO mAP table from the run's eval_results.json and the wall time;
4. exits 1 when bbox or segm mAP@0.5 is below TARGET_AP50 (a job over TARGET_MINUTES is reported,
   and fails nothing: see below); 0 when the target is met.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
# What the CPU demo must show: it learns (bbox and segm mAP@0.5 >= TARGET_AP50), on 2 cores, in a
# quarter of an hour. Only the accuracy decides the exit status: the same job on this VM takes
# 5-12 minutes depending on the hour and on what else runs (its speed moves 30-50% between hours),
# so a time limit would fail a correct model on a slow hour and say nothing about the code. A job
# over TARGET_MINUTES is reported on its own line; a model below the bar exits 1.
TARGET_AP50 = 0.5
TARGET_MINUTES = 15


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="maskrcnn demo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=str(REPO_ROOT / "data" / "synthetic"), help="dataset dir (created if missing)")
    p.add_argument("--logdir", default="", help="default: runs/local-<UTC time>")
    p.add_argument("--np", type=int, default=2, help="Horovod processes")
    p.add_argument("--preset", default="cpu_synthetic")
    p.add_argument("--config", nargs="*", default=[], metavar="KEY=VALUE", help="extra config overrides")
    return p.parse_args(argv)


def ensure_dataset(data: Path, spec_fields: dict) -> None:
    from training.data.synthetic import SyntheticSpec, generate
    if all((data / "annotations" / f"instances_{s}.json").exists() for s in ("train2017", "val2017")):
        print(f"dataset: {data} (exists)", flush=True)
        return
    print(f"dataset: generating {spec_fields} into {data}", flush=True)
    generate(data, SyntheticSpec(**spec_fields))


def horovodrun() -> str:
    local = Path(sys.executable).parent / "horovodrun"
    found = str(local) if local.exists() else shutil.which("horovodrun")
    if not found:
        raise SystemExit("error: horovodrun not found: install Horovod (scripts/install.sh)")
    return found


def main(argv=None) -> int:
    args = parse_args(argv)
    import importlib
    preset = importlib.import_module(f"training.configs.{args.preset}")
    data = Path(args.data).resolve()
    start = time.time()
    ensure_dataset(data, getattr(preset, "DATASET", {}))
    logdir = Path(args.logdir or REPO_ROOT / "runs" / time.strftime("local-%Y%m%d-%H%M%S", time.gmtime())).resolve()
    cmd = [horovodrun(), "-np", str(args.np), "-H", f"localhost:{args.np}", "--gloo",
           sys.executable, "-m", "training.train", "--logdir", str(logdir), "--preset", args.preset,
           "--config", f"DATA.BASEDIR={str(data)!r}", *args.config]
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH", "")]))
    print("running: " + " ".join(cmd), flush=True)
    code = subprocess.call(cmd, env=env, cwd=REPO_ROOT)
    wall = time.time() - start
    if code != 0:
        print(f"training failed (exit code {code}) after {wall:.0f}s; logs in {logdir}", file=sys.stderr)
        return code
    from training.callbacks import EVAL_RESULTS_FILE
    from training.evaluation import format_table
    results_file = logdir / EVAL_RESULTS_FILE
    if not results_file.exists():
        print(f"no evaluation results in {results_file}", file=sys.stderr)
        return 1
    final = json.loads(results_file.read_text())[-1]
    print(f"\nfinal COCO evaluation (epoch {final['epoch']}, step {final['global_step']}), "
          f"wall time {wall / 60:.1f} min for the whole job; log dir {logdir}")
    print(format_table({k: v for k, v in final.items() if k.startswith("mAP")}, final.get("per_class_AP")))
    ap50 = {t: final.get(f"mAP({t})/IoU=0.5", 0.0) for t in ("bbox", "segm")}
    accurate = all(v >= TARGET_AP50 for v in ap50.values())  # a NaN (diverged run) is not >=: fails
    in_time = wall <= TARGET_MINUTES * 60
    print(f"target mAP@0.5 >= {TARGET_AP50} for bbox and segm within {TARGET_MINUTES} min: "
          f"{'met' if accurate and in_time else 'NOT met'}")
    if not in_time:
        print(f"note: the job took {wall / 60:.1f} min, over the {TARGET_MINUTES}-minute budget (reported, "
              f"not a failure: this machine's speed varies by hour and load)")
    if not accurate:
        got = ", ".join(f"{t} {v:.3f}" for t, v in ap50.items())
        print(f"error: the model did not learn enough: mAP@0.5 {got}; the target is >= {TARGET_AP50} for both "
              f"(logs in {logdir})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
