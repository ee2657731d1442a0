"""An emulated 2-host SageMaker job against one host with the same total processes (docs/launch.md,
"Emulated hosts"). Needs root (the hosts are namespaces: tests/emulated_hosts.py).

Both run the image's `train` (launch.sagemaker.entry) on emulated SageMaker instances with the CPU
preset: 2 hosts x 2 processes start through the toolkit's sshd/mpirun (Horovod over MPI), 1 host x 4
processes through horovodrun (Gloo), as the entry starts each. Measured per run:
- seconds from `train` starting to the leader's first progress line (step 1),
- steps/s over the steps after ``--warmup`` (progress lines, one per step, timed as they arrive),
- wall seconds until every host has exited (the multi-host toolkit adds fixed waits at the end).
On 2 shared cores this measures the launch path's overhead, not scaling: 4 ranks share 2 cores either way.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from pathlib import Path

from _common import REPO, RESULTS, load_test_helper, write_result



def run(*, hosts_count: int, per_host: int, steps: int, warmup: int, workdir: Path, efs: Path) -> dict:
    emulated_hosts = load_test_helper("emulated_hosts")
    sagemaker = load_test_helper("emulated_sagemaker")
    from training.configs.cpu_synthetic import OVERRIDES

    batch = int(next(o for o in OVERRIDES if o.startswith("TRAIN.BATCH_SIZE_PER_GPU=")).split("=")[1])
    names = sagemaker.addresses(hosts_count, subnet="10.77.5")
    hps = sagemaker.cpu_hyperparameters(images_per_epoch=steps * batch * hosts_count * per_host,
                                        processes_per_host=per_host)
    with emulated_hosts.EmulatedHosts(names, workdir=workdir / "hosts", private=["/opt/ml"],
                                      shared={sagemaker.EFS: efs}) as hosts:
        for host in hosts:
            sagemaker.write_sagemaker_files(host, hosts=list(names), hyperparameters=hps,
                                            train_channel=f"{sagemaker.EFS}/data/coco")
        job = sagemaker.Job(hosts, job_name=f"bench-{hosts_count}x{per_host}", logs=workdir / "logs")
        seen: dict[int, float] = {}
        deadline = job.started + 1800
        while job.procs["algo-1"].poll() is None and time.time() < deadline:
            now = time.time()
            for step in re.findall(r"step (\d+)/\d+ ", job.log("algo-1")):
                seen.setdefault(int(step), now)
            time.sleep(0.1)
        codes = {name: job.wait(name, deadline=deadline) for name in names}
        wall = time.time() - job.started
        if any(codes.values()) or len(seen) < warmup + 2:
            raise SystemExit(f"{hosts_count}x{per_host} failed {codes}:\n{job.outputs()}")
    timed = sorted(s for s in seen if s > warmup)
    rate = (timed[-1] - timed[0]) / (seen[timed[-1]] - seen[timed[0]])
    return {"hosts": hosts_count, "processes_per_host": per_host, "launcher": "mpirun" if hosts_count > 1 else
            "horovodrun", "seconds_to_first_step": round(seen[min(seen)] - job.started, 1),
            "steps_per_second": round(rate, 3), "images_per_second": round(rate * batch * hosts_count * per_host, 2),
            "wall_seconds": round(wall, 1)}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=40, help="training steps per run")
    p.add_argument("--warmup", type=int, default=5, help="first steps left out of steps/s")
    p.add_argument("--output", default=str(RESULTS / "multihost_startup.json"))
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        print("multihost_startup: needs root (emulated hosts are network/mount/PID namespaces)", file=sys.stderr)
        return 2
    from training.configs.cpu_synthetic import DATASET
    from training.data.synthetic import SyntheticSpec, generate

    with tempfile.TemporaryDirectory(prefix="bench-multihost-") as tmp:
        efs = Path(tmp) / "efs"
        generate(efs / "data" / "coco", SyntheticSpec(**{**DATASET, "train": 200, "val": 4}))
        (efs / "logs").mkdir()
        load_before = os.getloadavg()[0]
        runs = [run(hosts_count=h, per_host=n, steps=args.steps, warmup=args.warmup, workdir=Path(tmp) / f"{h}x{n}",
                    efs=efs) for h, n in ((2, 2), (1, 4))]
    write_result("multihost_startup", args, {
        "config": f"cpu_synthetic preset, {args.steps} steps, global batch = 2 images x 4 ranks, 128 px",
        "load_average_1min_at_start": round(load_before, 2), "runs": runs})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
