"""The cluster's own automation against one run, on the emulated Slurm cluster (emulated_cluster.py:
real munged, slurmctld and slurmd in three emulated hosts, moto's auto-scaling groups, Horovod ranks).

One training job; while it trains, each automated action in turn, every one waiting for the job to
resume and make progress before the next:

1. a health check that times out once and then passes, on a busy worker;
2. a failing health check on a busy worker (then, once the worker is idle, the next run of the check
   replaces it, and the group's replacement joins under its name);
3. a failing health check on the master (never replaced; resumed by hand as the Runbook says);
4. a spot interruption notice on a worker (the instance metadata's ``spot/instance-action``), then
   EC2 takes the instance and the group replaces it.

The checks run as Slurm runs them (the node's /run/maskrcnn/node-check), not at Slurm's 5-minute
HealthCheckInterval; the notice is served by a stand-in of the instance metadata service and the
node's interruption watcher (its real command) checks it once. Everything asserted comes from the
run's files and from Slurm and moto, not from the code's messages: ``stopped.json`` (the step of each
graceful stop), ``cloudwatch-metrics.log`` (rank 0's records: the step each attempt starts at, the
end), ``attempts.json`` (the failure budget), the checkpoints, ``scontrol show node`` and ``sinfo -R``
(the drain and its reason), ``scontrol show job`` (Restarts, JobState: the requeue) and moto's
auto-scaling health status of each instance.

Checkpoints are written every 10 epochs (40 steps): a stop that lost the steps since the periodic
checkpoint would show, one that saves gracefully loses none.
"""
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from training.run_status import read_heartbeat, read_stop_record
from launch.cluster.job import read_attempts

from emulated_cluster import (RECORDED, STOP_GRACE, TRAINING, host_env, instance_health, instance_id,
                              job, job_fields, node_state, replace_instance, runs, sinfo_reasons, slurm_name,
                              start_node, wait_for)

EPOCHS, STEPS_PER_EPOCH, CHECKPOINT_EPOCHS = 30, 4, 10
MAX_STEPS = EPOCHS * STEPS_PER_EPOCH
RUN = "faults"
FAULT_TRAINING = [*TRAINING, f"TRAIN.IMAGES_PER_EPOCH={3 * 2 * STEPS_PER_EPOCH}",
                  f"TRAIN.LR_EPOCH_SCHEDULE=[({EPOCHS - 10}, 0.5), ({EPOCHS}, None)]",
                  f"TRAIN.CHECKPOINT_PERIOD={CHECKPOINT_EPOCHS}", "TRAIN.CHECKPOINT_MINUTES=0"]
# A worker's check as a p4d.24xlarge's (the recorded healthy machine's GPU tools), where
# `nvidia-smi -L` hangs on its first call only: a driver busy for a while.
STALL_ONCE = '[ -e /tmp/stalled-once ] || { touch /tmp/stalled-once; sleep 120; }\n'
# The instance metadata service (IMDSv2) of a Spot Instance that has its two-minute notice.
# argv: its port, the instance id, the time of the interruption.
IMDS = """
import http.server, json, sys
items = {"/latest/meta-data/spot/instance-action": json.dumps({"action": "terminate", "time": sys.argv[3]}),
         "/latest/meta-data/instance-id": sys.argv[2]}
class H(http.server.BaseHTTPRequestHandler):
    def _send(self, code, body):
        self.send_response(code); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body.encode())
    def do_PUT(self):
        self._send(200, "token") if self.path == "/latest/api/token" else self._send(404, "")
    def do_GET(self):
        self._send(200, items[self.path]) if self.path in items else self._send(404, "")
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""
IMDS_PORT = 8049


def _records(logdir: Path) -> list[dict]:
    """Rank 0's CloudWatch records (embedded metric format, one JSON object a line)."""
    path = logdir / "cloudwatch-metrics.log"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:   # a line being written
            pass
    return out


def _starts(logdir: Path) -> list[int]:
    """The step each attempt's training started at (its first record: step, run_active, heartbeat)."""
    return [r["step"] for r in _records(logdir) if "step" in r and "run_active" in r and "progress" not in r
            and not any(k in r for k in ("run_finished", "run_failed", "run_stopped"))]


def _drained_idle(master, env, node: str) -> bool:
    """Drained and idle as ParallelCluster reads it (IDLE+DRAIN or DOWN+DRAIN): no job holds it."""
    state = node_state(master, env, node)
    return "DRAIN" in state and bool(state & {"IDLE", "DOWN"}) and "COMPLETING" not in state


def _node_check(host, env, *extra_env_lines: str) -> subprocess.CompletedProcess:
    """The node's health check as Slurm runs it (its HealthCheckProgram), with ``extra_env_lines``
    added to its cluster.env for this run only."""
    path = host.path("/etc/maskrcnn/cluster.env")
    kept = path.read_text()
    try:
        if extra_env_lines:
            path.write_text(kept + "".join(f"{line}\n" for line in extra_env_lines))
        return host.run(["/run/maskrcnn/node-check"], env=env, timeout=120)
    finally:
        path.write_text(kept)


@pytest.mark.slow
def test_a_run_survives_the_clusters_own_automation(slurm_cluster, tmp_path):
    hosts, efs, env, munge_key, nodes = slurm_cluster
    master = hosts["node-a"]
    logdir = efs / "logs" / RUN
    submitted = job(master, env, "submit", "--run-name", RUN, "--max-attempts", "2", "--stall-minutes", "10",
                     "--stop-grace", str(STOP_GRACE), *FAULT_TRAINING)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    job_id = re.search(r"as job (\d+)", submitted.stdout).group(1)
    matrix = []

    # A second run waits behind it (every job holds all the nodes); a plain scancel takes it from the
    # queue before it ever started, so its job script never says it ended: the master's next look at
    # the queue does, else `--resume` of that run would be refused for good (SageMaker's launcher).
    waiting = job(master, env, "submit", "--run-name", "waits", *FAULT_TRAINING)
    assert waiting.returncode == 0, waiting.stdout + waiting.stderr
    waiting_job = re.search(r"as job (\d+)", waiting.stdout).group(1)
    assert read_attempts(str(efs / "logs" / "waits"))["ended"] is False
    assert master.run(["scancel", waiting_job], env=env, timeout=30).returncode == 0
    wait_for(lambda: waiting_job not in master.run(["squeue", "-h", "-t", "PD,R,CG", "-o", "%i"], env=env,
                                                   timeout=30).stdout.split(),
             60, "the waiting job to leave the queue", poll=0.5)
    assert read_attempts(str(efs / "logs" / "waits"))["ended"] is False
    assert job(master, env, "list").returncode == 0
    assert read_attempts(str(efs / "logs" / "waits")) == {"job_id": waiting_job, "attempt": 0, "max_attempts": 4,
                                                          "failures": [], "ended": True}

    def progressed(since_attempt: int) -> int:
        """Waits for attempt ``since_attempt`` to have started training and written a later step; its start."""
        wait_for(lambda: (read_attempts(str(logdir)) or {}).get("attempt") == since_attempt
                         and len(_starts(logdir)) >= since_attempt, 400, f"attempt {since_attempt} to start training")
        start = _starts(logdir)[since_attempt - 1]
        wait_for(lambda: (read_heartbeat(str(logdir)) or {}).get("step", 0) > start, 200,
                 f"attempt {since_attempt} to train past step {start}")
        assert read_heartbeat(str(logdir))["step"] < MAX_STEPS, "the run ended before the matrix did"
        return start

    def graceful(action: str, what: str, asked: float, attempt: int) -> None:
        """The attempt that ``action`` stopped saved its step; the next resumes there and trains on."""
        record = wait_for(lambda: read_stop_record(str(logdir), since=asked), 150, f"{action}: stopped.json")
        assert record["signal"] == "SIGTERM" and record["checkpoint"] == f"model-{record['step']}", record
        assert (logdir / f"{record['checkpoint']}.index").exists()
        start = progressed(attempt + 1)
        lost = record["step"] - start
        assert lost == 0, f"{action}: stopped at step {record['step']}, resumed at {start}"
        matrix.append((action, what, record["step"], start, lost))

    # 1. A check that times out once on a busy worker, then answers: nothing happens to the node or the job.
    attempt = 1
    progressed(attempt)
    worker = hosts["node-b"]
    name, instance = slurm_name(worker), instance_id(worker)
    stall = worker.path("/etc/maskrcnn/recorded-bin")
    (stall / "nvidia-smi").write_text(f"#!/bin/sh\ncase \"$1\" in -L) {STALL_ONCE};; esac\n"
                                      f"RECORDED_MACHINE=p4d-healthy exec {RECORDED / 'bin' / 'nvidia-smi'} \"$@\"\n")
    (stall / "nvidia-smi").chmod(0o755)
    for tool in ("fi_info", "dcgmi", "dmesg"):
        (stall / tool).write_text(f"#!/bin/sh\nRECORDED_MACHINE=p4d-healthy exec {RECORDED / 'bin' / tool} \"$@\"\n")
        (stall / tool).chmod(0o755)
    before = read_heartbeat(str(logdir))["step"]
    check = _node_check(worker, env, "INSTANCE_TYPE=p4d.24xlarge", "EFA_INTERFACES=0")
    for tool in ("nvidia-smi", "fi_info", "dcgmi", "dmesg"):
        (stall / tool).unlink()
    assert check.returncode == 0, check.stdout + check.stderr
    assert "on a retry" in check.stdout, check.stdout
    state = node_state(master, env, name)
    assert state & {"ALLOCATED", "MIXED"} and "DRAIN" not in state, state
    wait_for(lambda: read_heartbeat(str(logdir))["step"] > before, 120, "training to go on")
    assert read_attempts(str(logdir))["attempt"] == 1 and read_stop_record(str(logdir)) is None
    assert instance_health(master, env, instance).upper() == "HEALTHY"
    matrix.append(("check times out once, then passes (busy worker)", "nothing: the retry passes", None, None, 0))

    # 2. A failing check on a busy worker: drained, its job requeued (it saves first), replaced only once idle.
    asked = time.time()
    check = _node_check(worker, env, "NODE_HEALTH_MIN_FREE_GIB=1000000")
    assert check.returncode == 1, check.stdout + check.stderr
    assert instance_health(master, env, instance).upper() == "HEALTHY", "marked for replacement while busy"
    record = wait_for(lambda: read_stop_record(str(logdir), since=asked), 150, "the requeued attempt's stopped.json")
    wait_for(lambda: _drained_idle(master, env, name), 150, f"{name} drained and idle", poll=0.5)
    assert instance_health(master, env, instance).upper() == "HEALTHY"
    # Slurm's next run of the check on the drained node: now it is marked for replacement.
    check = _node_check(worker, env, "NODE_HEALTH_MIN_FREE_GIB=1000000")
    assert check.returncode == 1, check.stdout + check.stderr
    assert instance_health(master, env, instance).upper() == "UNHEALTHY"
    replace_instance(master, env, hosts, worker, munge_key=munge_key)
    nodes[worker.name] = start_node(worker, env)
    graceful("failing check on a busy worker",
             "drain, requeue (ranks checkpoint); instance marked Unhealthy once the node is idle", asked, attempt)
    attempt += 1
    assert read_stop_record(str(logdir))["step"] == record["step"]

    # 3. A failing check on the master: drained, its job requeued; never marked for replacement.
    master_instance = instance_id(master)
    asked = time.time()
    check = _node_check(master, env, "NODE_HEALTH_MIN_FREE_GIB=1000000")
    assert check.returncode == 1, check.stdout + check.stderr
    wait_for(lambda: read_stop_record(str(logdir), since=asked), 150, "the master's requeued attempt's stopped.json")
    wait_for(lambda: _drained_idle(master, env, "master"), 150, "the master drained, idle", poll=0.5)
    assert _node_check(master, env, "NODE_HEALTH_MIN_FREE_GIB=1000000").returncode == 1
    assert instance_health(master, env, master_instance).upper() == "HEALTHY"
    resumed = master.run(["scontrol", "update", "NodeName=master", "State=RESUME"], env=env, timeout=30)
    assert resumed.returncode == 0, resumed.stderr
    graceful("failing check on the master", "drain, requeue (ranks checkpoint); never replaced; "
             "`scontrol update State=RESUME` by hand", asked, attempt)
    attempt += 1

    # 4. A spot interruption notice on a worker: drained, its job requeued; EC2 then takes the instance.
    spot = hosts["node-c"]
    name, instance = slurm_name(spot), instance_id(spot)
    # Slurm's own count of the job's requeues (scontrol show job: Restarts), the number the job script
    # numbers its attempts by (SLURM_RESTART_COUNT).
    assert job_fields(master, env, job_id)["Restarts"] == str(attempt - 1)
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 120))
    imds = spot.popen([sys.executable, "-c", IMDS, str(IMDS_PORT), instance, when], env=host_env(),
                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        asked = time.time()
        watcher = spot.run([sys.executable, "-m", "launch.cluster.interruption", "--once", "--node", name,
                            "--state-dir", "/tmp/interruption"],
                           env={**env, "AWS_EC2_METADATA_SERVICE_ENDPOINT": f"http://127.0.0.1:{IMDS_PORT}"},
                           cwd=str(RECORDED.parents[1]), timeout=120)
        # Exit status 1: this cluster.env names no alerts topic, so nobody could be told; nothing else failed.
        (marker,) = spot.path("/tmp/interruption").glob("spot-*.json")
        assert watcher.returncode == 1 and len(json.loads(marker.read_text())["failed"]) == 1, \
            watcher.stdout + watcher.stderr + marker.read_text()
        # What Slurm itself says once the watcher is done: the node is drained, for the notice; the job
        # is requeued (no longer RUNNING: its processes are being ended; Restarts up by one).
        assert "DRAIN" in node_state(master, env, name)
        assert sinfo_reasons(master, env)[name] == f"spot interruption at {when}"
        requeued = job_fields(master, env, job_id)
        assert requeued["JobState"] != "RUNNING" and requeued["Requeue"] == "1", requeued
        wait_for(lambda: job_fields(master, env, job_id)["Restarts"] == str(attempt), 150,
                 "Slurm to count the requeue", poll=0.5)
        wait_for(lambda: read_stop_record(str(logdir), since=asked), 150, "the interrupted attempt's stopped.json")
    finally:
        imds.terminate()
        imds.wait(timeout=10)
    # EC2 takes the instance two minutes after its notice; by then the attempt has left it.
    wait_for(lambda: _drained_idle(master, env, name), 150, f"{name} drained and idle", poll=0.5)
    assert instance_health(master, env, instance).upper() == "HEALTHY"
    replace_instance(master, env, hosts, spot, munge_key=munge_key)
    nodes[spot.name] = start_node(spot, env)
    graceful("Spot interruption notice", "drain, requeue (ranks checkpoint); EC2 takes the instance, the group "
             "replaces it", asked, attempt)
    attempt += 1
    assert job_fields(master, env, job_id)["Restarts"] == str(attempt - 1), "requeued more than once"

    # The run finishes; no system requeue spent the failure budget.
    wait_for(lambda: f"model-{MAX_STEPS}" in (logdir / "checkpoint").read_text(), 600, "the run's last checkpoint")
    wait_for(lambda: runs(master, env).get(RUN, {}).get("state") == "COMPLETED", 180, "the job to complete", poll=1)
    attempts = read_attempts(str(logdir))
    assert attempts["attempt"] == attempt and attempts["failures"] == [] and attempts["ended"], attempts
    assert any(r.get("run_finished") == 1 and r.get("step") == MAX_STEPS for r in _records(logdir))
    table = "\n".join(f"| {a} | {w} | {'-' if s is None else s} | {'-' if r is None else r} | {lost} |"
                      for a, w, s, r, lost in matrix)
    print(f"\n| action | what the system does | stopped at | resumed at | steps lost |\n| --- | --- | --- | --- | --- |"
          f"\n{table}")
