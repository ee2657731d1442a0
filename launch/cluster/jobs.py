"""Training runs on the cluster as Slurm jobs: submit, status, logs, stop, list.

On the master (``maskrcnn job`` runs this in the container)::

    maskrcnn job submit [--run-name NAME] [--resume] [KEY=VALUE ...]
    maskrcnn job status [NAME]          maskrcnn job logs NAME [--follow]
    maskrcnn job stop NAME              maskrcnn job list [--json]

Each is a thin wrapper over Slurm's own commands (sbatch, squeue, scancel, scontrol and the
job-completion log), which work directly too: a run is the job named after it.

A run is its log directory, ``<EFS>/logs/<run name>``: checkpoints, config.json, heartbeat.json and
the job's output (``slurm-<job id>.out``). Every run gets its own name (``maskrcnn-<UTC time>-<4 hex digits>``)
unless the user gives one; a name whose directory exists is refused unless ``--resume`` is given,
so a new run never resumes or overwrites an old one. The SageMaker launcher names jobs by the same
rule (:func:`launch.run_names.new_run_name`).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import boto3

from infra.instance_types import INSTANCE_TYPES
from launch import cost
from launch.aws import LaunchError
from launch.cluster import capacity, idle, slurm
from launch.cluster.job import (MIN_STOP_GRACE_S, STOP_GRACE_S, cluster_job_writing, describe_attempts,
                                mark_ended, record_attempt, stop_grace_problem)
from launch.cluster.node_env import CLUSTER_ENV, read_cluster_env
from launch.cluster.stage import LUSTRE_COCO_DIR, choose_data, dataset_problem
from launch.run_names import check_run_name, new_run_name

ACTIVE_STATES = ("PENDING", "RUNNING", "REQUEUED", "CONFIGURING", "COMPLETING", "RESIZING", "SUSPENDED")
# squeue's states of a job that has left for good (squeue(1), JOB STATE CODES); squeue lists such a
# job for MinJobAge after its end. Any other state may still start or requeue the job.
FINAL_STATES = ("COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "BOOT_FAIL", "OUT_OF_MEMORY",
                "DEADLINE")


def _slurm(argv: list[str], *, what: str) -> str:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise LaunchError(f"{argv[0]} not found: run this on the cluster's master, inside the maskrcnn "
                          f"container (maskrcnn job does)") from None
    if proc.returncode != 0:
        raise LaunchError(f"{what} failed: {proc.stderr.strip() or proc.stdout.strip()} "
                          f"(is slurmctld up? `sinfo` on the master shows the cluster)")
    return proc.stdout


def logdir_of(env: dict[str, str], run_name: str) -> Path:
    return Path(env.get("EFS_MOUNT", "/efs"), "logs", run_name)


def ranks_per_node(env: dict[str, str]) -> int:
    """One rank per GPU; one on a CPU instance type."""
    info = INSTANCE_TYPES.get(env.get("INSTANCE_TYPE", ""))
    slots = env.get("SLOTS") or (info.gpus if info else 0)
    return max(1, int(slots))


def submit(env: dict[str, str], *, run_name: str | None, resume: bool, overrides: list[str],
           nodes: int | None, data_dir: str | None, stage_to_nvme: bool, max_attempts: int,
           stall_minutes: float, dataset: str = LUSTRE_COCO_DIR, stop_grace: int = STOP_GRACE_S) -> tuple[str, str]:
    """Queues the run's job; returns (run name, job id)."""
    if problem := stop_grace_problem(stop_grace):
        raise LaunchError(problem)
    name = run_name or new_run_name()
    check_run_name(name)
    logdir = logdir_of(env, name)
    if logdir.exists() and not resume:
        raise LaunchError(f"a run named {name} exists ({logdir}): pass --resume to continue it from its "
                          f"latest checkpoint, or choose another --run-name (or leave it out for a new name)")
    if resume and not logdir.exists():
        raise LaunchError(f"--resume: there is no run named {name} ({logdir} does not exist); "
                          f"`maskrcnn job list` shows the runs")
    mark_left_jobs(env)
    active = [j for j in queue() if j["name"] == name]
    if active:
        raise LaunchError(f"run {name} is already queued or running as job {active[0]['job_id']} "
                          f"({active[0]['state']}): `maskrcnn job stop {name}` first")
    plan = choose_data(env, data_dir=data_dir, stage_to_nvme=stage_to_nvme, dataset=dataset)
    if any(o.startswith("DATA.BASEDIR=") for o in overrides):
        plan = type(plan)(train_dir=plan.train_dir)
    elif problem := dataset_problem(plan.stage_from or plan.train_dir, overrides):
        raise LaunchError(problem)
    count = nodes or 1 + int(env.get("WORKER_COUNT", "0"))
    per_node = ranks_per_node(env)
    logdir.mkdir(parents=True, exist_ok=True)
    body = [sys.executable, "-m", "launch.cluster.job", "--logdir", str(logdir), "--data-dir", plan.train_dir,
            "--ranks-per-node", str(per_node), "--max-attempts", str(max_attempts),
            "--stall-minutes", str(stall_minutes), "--stop-grace", str(stop_grace),
            "--instance-type", env.get("INSTANCE_TYPE", "")]
    if plan.stage_from:
        body += ["--stage-from", plan.stage_from]
    if int(env.get("EFA_INTERFACES", "0") or 0) > 0:
        body += ["--efa"]
    body += ["--", *overrides]
    argv = ["sbatch", "--parsable", f"--job-name={name}", f"--nodes={count}", f"--ntasks-per-node={per_node}",
            "--exclusive", "--requeue", "--open-mode=append", f"--output={logdir}/slurm-%j.out",
            f"--chdir={Path(__file__).resolve().parents[2]}", "--wrap", " ".join(_quote(a) for a in body)]
    with idle.training_lock():   # the idle check sees this job, or scales down before the scale-up below
        job_id = _slurm(argv, what="sbatch").strip().split(";")[0]
        (logdir / "job_id").write_text(job_id + "\n")
        # queued: the SageMaker launcher sees that this job may write the run (attempt 0: none started)
        record_attempt(str(logdir), job_id=job_id, attempt=0, max_attempts=max_attempts)
        _scale_up_workers(env)
    return name, job_id


def _scale_up_workers(env: dict[str, str]) -> None:
    """The workers back to the configured count when the idle check scaled them to zero: the job
    pends until their nodes have booted and registered with Slurm."""
    if not env.get("WORKER_ASG_NAME"):
        return
    session = boto3.session.Session(region_name=env.get("AWS_REGION"))
    worker = capacity.scale_up_workers(session, capacity.describe_groups(
        session, {"worker": env["WORKER_ASG_NAME"]}))
    if worker is not None:
        print(f"scaling the worker group {worker.name} from {worker.desired} to {worker.max_size} node(s) "
              f"(its configured size); the job starts once they have booted and passed their "
              f"health checks (a GPU node takes ~10-15 min)", flush=True)


def _quote(arg: str) -> str:
    import shlex
    return shlex.quote(arg)


def queue() -> list[dict]:
    """The queued and running jobs (squeue)."""
    out = _slurm(["squeue", "-h", "-o", "%i|%j|%T|%D|%N|%r|%M"], what="squeue")
    jobs = []
    for line in out.splitlines():
        job_id, name, state, nodes, nodelist, reason, elapsed = line.split("|", 6)
        jobs.append({"job_id": job_id, "name": name, "state": state, "nodes": int(nodes), "nodelist": nodelist,
                     "reason": reason, "elapsed": elapsed})
    return jobs


def mark_left_jobs(env: dict[str, str]) -> list[str]:
    """Marks ended (``attempts.json``) the runs whose job has left Slurm's queue although the file
    says it may still write the run: a job cancelled while it waited (``scancel`` by hand) never
    runs the job script, which would have said so, and neither does a job whose batch node was lost
    before Slurm requeued it. Without this, ``--resume`` of such a run is refused for good. Returns
    the runs marked. The runs are read before the queue: a job submitted in between is in the queue."""
    root = logdir_of(env, "x").parent
    writing = {d: job for d in (sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else [])
               if (job := cluster_job_writing(str(d))) not in (None, "?")}
    if not writing:
        return []
    queued = {j["job_id"] for j in queue() if j["state"] not in FINAL_STATES}
    marked = []
    for logdir, job in writing.items():
        if job not in queued:
            mark_ended(str(logdir), job)
            marked.append(logdir.name)
    return marked


def finished(env: dict[str, str]) -> list[dict]:
    """Finished jobs from Slurm's job-completion log (KEY=VALUE per line), oldest first."""
    log = slurm.layout(env).job_log
    if not log.exists():
        return []
    jobs = []
    for line in log.read_text().splitlines():
        fields = dict(re.findall(r"(\w+)=(\S*)", line))
        if "JobId" in fields:
            jobs.append({"job_id": fields["JobId"], "name": fields.get("Name", ""),
                         "state": fields.get("JobState", ""), "nodes": int(fields.get("NodeCnt", 0) or 0),
                         "nodelist": fields.get("NodeList", ""), "start": fields.get("StartTime", ""),
                         "end": fields.get("EndTime", ""), "exit_code": fields.get("ExitCode", "")})
    return jobs


def runs(env: dict[str, str]) -> list[dict]:
    """Every run under <EFS>/logs with its latest job's state and its heartbeat's step."""
    from launch.cluster.job import heartbeat_step
    mark_left_jobs(env)
    latest: dict[str, dict] = {}
    for job in finished(env) + queue():          # a queued job is newer than any finished one
        latest[job["name"]] = job
    root = logdir_of(env, "x").parent
    result = []
    for logdir in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []:
        job = latest.get(logdir.name, {})
        result.append({"run": logdir.name, "job_id": job.get("job_id", ""), "state": job.get("state", "UNKNOWN"),
                       "nodes": job.get("nodes", 0), "step": heartbeat_step(str(logdir)),
                       "logdir": str(logdir)})
    return result


def run_cost(env: dict[str, str], name: str) -> str | None:
    """The run's estimated cost so far: every attempt of its jobs in the job-completion log, its
    nodes for its start-to-end time (the job holds the nodes exclusively), at the instance type's
    price (recorded, else AWS's Price List). None before an attempt has ended."""
    attempts = [j for j in finished(env) if j["name"] == name and j["nodes"] > 0 and j["start"] and j["end"]]
    if not attempts:
        return None
    node_seconds = sum(j["nodes"] * (datetime.fromisoformat(j["end"]) - datetime.fromisoformat(j["start"]))
                       .total_seconds() for j in attempts)
    nodes = attempts[-1]["nodes"]         # the job asks for a fixed count: every attempt has it
    # A type without a recorded price: AWS's Price List, with the master's role, in its region.
    return cost.estimate(env.get("INSTANCE_TYPE", "unknown"), nodes, node_seconds / nodes,
                         price_list=bool(env.get("AWS_REGION")), region=env.get("AWS_REGION")).line()


def wait_for(env: dict[str, str], job_id: str, *, poll_s: float = 15.0) -> str:
    """Waits until the job has left the queue for good; its final state from the completion log.
    A requeued job leaves a line per attempt in that log: only the one after the queue lets go counts."""
    while any(j["job_id"] == job_id for j in queue()):
        time.sleep(poll_s)
    for _ in range(10):              # slurmctld appends the line as the job leaves the queue
        ended = [j for j in finished(env) if j["job_id"] == job_id]
        if ended:
            return ended[-1]["state"]
        time.sleep(1)
    return "UNKNOWN"


def _job_of(env: dict[str, str], name: str) -> dict:
    for job in queue():
        if job["name"] == name:
            return job
    done = [j for j in finished(env) if j["name"] == name]
    if done:
        return done[-1]
    raise LaunchError(f"no job for a run named {name}: `maskrcnn job list` shows the runs")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="maskrcnn job", description=__doc__.splitlines()[0])
    p.add_argument("--cluster-env", default=CLUSTER_ENV)
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("submit", help="queue a training run", epilog="example: maskrcnn job submit "
                       "TRAIN.LR_EPOCH_SCHEDULE='[(16, 0.1), (20, 0.01), (24, None)]'")
    s.add_argument("overrides", nargs="*", help="training config overrides, KEY=VALUE (training/config.py)")
    s.add_argument("--run-name", help="default: maskrcnn-<UTC time>-<4 hex digits>, a new run")
    s.add_argument("--resume", action="store_true", help="continue the named run from its latest checkpoint")
    s.add_argument("--nodes", type=int, help="default: every node of the cluster (master and workers)")
    data = s.add_mutually_exclusive_group()
    data.add_argument("--dataset", default=LUSTRE_COCO_DIR,
                      help="a dataset staged under its name (maskrcnn data upload --name): /fsx/NAME when "
                           "FSx for Lustre has it, else /efs/data/NAME (default: %(default)s)")
    data.add_argument("--data-dir", help="the dataset's directory, instead of --dataset")
    s.add_argument("--no-stage-to-nvme", dest="stage_to_nvme", action="store_false",
                   help="read the dataset from EFS even on nodes with local NVMe")
    s.add_argument("--max-attempts", type=int, default=4,
                   help="failed attempts before the job fails for good (requeues the system causes, such as "
                        "spot reclaims and node failures, do not count)")
    s.add_argument("--stall-minutes", type=float, default=30.0,
                   help="stop and requeue an attempt whose training step has not advanced for this long")
    s.add_argument("--stop-grace", type=int, default=STOP_GRACE_S, metavar="SECONDS",
                   help="when Slurm stops or requeues an attempt, how long the ranks get to save a checkpoint "
                        "before they are killed; the nodes are free about this long later (%(default)s, the "
                        f"most; at least {MIN_STOP_GRACE_S})")
    s.add_argument("--wait", action="store_true",
                   help="wait for the run to end; exit 0 only when it completed (for scripts)")
    st = sub.add_parser("status", help="a run's job (default: every queued or running job)")
    st.add_argument("run", nargs="?")
    st.add_argument("--json", action="store_true")
    lg = sub.add_parser("logs", help="a run's output (every attempt)")
    lg.add_argument("run")
    lg.add_argument("--follow", "-f", action="store_true")
    sp = sub.add_parser("stop", help="stop a run: training checkpoints first (SIGTERM), then the job ends")
    sp.add_argument("run")
    ls = sub.add_parser("list", help="every run with its latest job's state")
    ls.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    try:
        env = read_cluster_env(a.cluster_env)
        if a.command == "submit":
            bad = [o for o in a.overrides if "=" not in o]
            if bad:
                raise LaunchError(f"overrides must be KEY=VALUE, got {bad}")
            name, job_id = submit(env, run_name=a.run_name, resume=a.resume, overrides=a.overrides,
                                  nodes=a.nodes, data_dir=a.data_dir, stage_to_nvme=a.stage_to_nvme,
                                  max_attempts=a.max_attempts, stall_minutes=a.stall_minutes, dataset=a.dataset,
                                  stop_grace=a.stop_grace)
            print(f"submitted run {name} as job {job_id}; follow it with: maskrcnn job logs {name} -f")
            if a.wait:
                state = wait_for(env, job_id)
                print(f"run {name} (job {job_id}) ended: {state}")
                print(run_cost(env, name) or "estimated cost: the job never started")
                return 0 if state == "COMPLETED" else 1
        elif a.command == "status":
            jobs = [_job_of(env, a.run)] if a.run else queue()
            if a.json:
                print(json.dumps(jobs))
            for j in [] if a.json else jobs:
                print(f"{j['name']}  job {j['job_id']}  {j['state']}  {j['nodes']} node(s) {j['nodelist']}"
                      + (f"  ({j['reason']})" if j.get("reason") not in (None, "", "None") else ""))
                if budget := describe_attempts(str(logdir_of(env, j["name"])), j["job_id"]):
                    print(f"  {budget}")
            spent = run_cost(env, a.run) if a.run and not a.json else None
            if spent:
                print(f"{spent} (the attempts that ended)")
        elif a.command == "logs":
            logdir = logdir_of(env, a.run)
            outs = sorted(logdir.glob("slurm-*.out"), key=lambda f: f.stat().st_mtime)
            if not outs:
                raise LaunchError(f"no output for run {a.run} in {logdir} (not started yet?)")
            if a.follow:
                os.execvp("tail", ["tail", "-n", "+1", "-F", str(outs[-1])])
            for out in outs:
                sys.stdout.write(out.read_text())
        elif a.command == "stop":
            job = _job_of(env, a.run)
            if job["state"] not in ACTIVE_STATES:
                raise LaunchError(f"run {a.run}'s job {job['job_id']} has already ended ({job['state']})")
            _slurm(["scancel", job["job_id"]], what="scancel")
            # a job cancelled while it waits never runs its script, which would say so
            if job["state"] == "PENDING":
                mark_ended(str(logdir_of(env, a.run)), job["job_id"])
            print(f"stopping run {a.run} (job {job['job_id']}): training saves a checkpoint first; "
                  f"`maskrcnn job submit --run-name {a.run} --resume` continues it")
        elif a.command == "list":
            rows = runs(env)
            if a.json:
                print(json.dumps(rows))
            else:
                print(f"{'RUN':32} {'JOB':>6} {'STATE':12} {'NODES':>5} {'STEP':>8}")
                for r in rows:
                    print(f"{r['run']:32} {r['job_id']:>6} {r['state']:12} {r['nodes']:>5} "
                          f"{r['step'] if r['step'] is not None else '-':>8}")
        return 0
    except LaunchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
