"""The cluster's own automation against one run, on the emulated Slurm cluster (emulated_cluster.py:
real munged, slurmctld and slurmd in three emulated hosts, moto's auto-scaling groups, Horovod ranks).

One training job; while it trains, each automated action in turn, every one waiting for the job to
resume and make progress before the next:

1. a health check that times out once and then passes, on a busy worker;
2. ``maskrcnn cluster pause`` (the launch CLI, against the master's moto) while the run trains: it
   must refuse and change nothing;
3. a failing health check on a busy worker (then, once the worker is idle, the next run of the check
   replaces it, and the group's replacement joins under its name);
4. a failing health check on the master (never replaced; resumed by hand as the Runbook says);
5. a spot interruption notice on a worker (the instance metadata's ``spot/instance-action``), then
   EC2 takes the instance and the group replaces it;
6. a hung rank (SIGSTOP to a worker's rank: the other ranks block in their next collective, as behind
   a rank stuck in a GPU kernel or a dead mount) until the step watchdog of the job script stops the
   attempt and Slurm requeues the job.

Then ``maskrcnn job stop`` ends the run, and ``attempts.json`` must hold the stall as the job's one
failure; the system's requeues count none.

The checks run as Slurm runs them (the node's /run/maskrcnn/node-check), not at Slurm's 5-minute
HealthCheckInterval; the notice is served by a stand-in of the instance metadata service and the
node's interruption watcher (its real command) checks it once. moto's CloudWatch Logs does not turn
embedded-metric-format log events into metrics, as CloudWatch does with what the master's CloudWatch
agent ships from ``cloudwatch-metrics.log``: a stand-in of that path (SHIP_EMF) puts the records'
metrics into moto's CloudWatch by the format's specification before ``pause`` reads them. Everything asserted comes from the
run's files and from Slurm and moto, not from the code's messages: ``stopped.json`` (the step of each
graceful stop), ``cloudwatch-metrics.log`` (rank 0's records: the step each attempt starts at, the
end), ``attempts.json`` (the failure budget), the checkpoints, ``scontrol show node`` and ``sinfo -R``
(the drain and its reason), ``scontrol show job`` (Restarts, JobState: the requeue) and moto's
auto-scaling health status of each instance.

Checkpoints are written every 10 epochs (40 steps): a stop that lost the steps since the periodic
checkpoint would show, one that saves gracefully loses none. The job's ``--stall-minutes`` is short
(STALL_MINUTES) but has to outlast every attempt's start on these shared cores: the watchdog's clock
runs from the attempt's start, and its first step includes importing TensorFlow and building the graph.
"""
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from training.run_status import read_heartbeat, read_stop_record
from launch.cluster.job import STALLED_STATUS, read_attempts
from launch.rank_signals import training_ranks
from training import metrics as metric_names

from emulated_cluster import (GROUPS, RECORDED, REPO, STOP_GRACE, TRAINING, host_env, instance_health, instance_id,
                              job, job_fields, node_state, replace_instance, sinfo_reasons, slurm_name,
                              start_node, wait_for)

# More epochs than the matrix needs (the run is stopped once it is done): on lightly loaded cores a
# step takes well under a second, and the first action alone (a check that hangs) lasts minutes.
EPOCHS, STEPS_PER_EPOCH, CHECKPOINT_EPOCHS = 100, 4, 10
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
# The watchdog's limit for this job: above the longest attempt start (TensorFlow's import and the
# graph on cores shared by three ranks and, in the suite, another worker's tests), far below the
# default 30 min. 2 minutes passed on quiet cores, with too little margin for a loaded machine.
STALL_MINUTES = 4.0
# A bound for moto calls that may be a service's first in the master's moto server (it loads the
# service's models then).
MOTO_FIRST_CALL_S = 300
STACK = "EmulatedCluster"   # the cluster.env STACK_NAME of emulated_cluster.install_node: the records' Deployment
# Run inside the master against its moto: the cluster stack, as `maskrcnn cluster` reads it (its two
# group names among its outputs; a topic as its one resource, which a template needs).
CREATE_STACK = f"""
import json, boto3
boto3.client("cloudformation").create_stack(StackName="{STACK}", TemplateBody=json.dumps({{
    "Resources": {{"Alerts": {{"Type": "AWS::SNS::Topic"}}}},
    "Outputs": {{"MasterAutoScalingGroupName": {{"Value": "{GROUPS['master'][0]}"}},
                "WorkerAutoScalingGroupName": {{"Value": "{GROUPS['worker'][0]}"}}}}}}))
"""
# Run inside the master against its moto: what the master's CloudWatch agent and CloudWatch Logs do
# with the lines of cloudwatch-metrics.log, which moto's CloudWatch Logs does not (it stores log
# events, it makes no metrics of them): every complete line after the saved offset, read as an
# embedded-metric-format document (AWS, "Specification: Embedded metric format": under _aws, the
# Timestamp in ms and CloudWatchMetrics directives, each a Namespace, DimensionSets of member names and
# Metrics whose values are the members of those names), becomes one datum per metric and dimension
# set. argv: the file, the offset file.
SHIP_EMF = """
import boto3, json, os, sys
from datetime import datetime, timezone
path, saved = sys.argv[1], sys.argv[2]
offset = int(open(saved).read()) if os.path.exists(saved) else 0
with open(path, "rb") as f:
    f.seek(offset)
    data = f.read()
complete = data[:data.rfind(b"\\n") + 1]
by_namespace = {}
for line in complete.decode().splitlines():
    try:
        doc = json.loads(line)
    except ValueError:   # not a JSON object: CloudWatch extracts nothing from it either
        continue
    when = datetime.fromtimestamp(doc["_aws"]["Timestamp"] / 1000, timezone.utc)
    for directive in doc["_aws"]["CloudWatchMetrics"]:
        for dims in directive["Dimensions"]:
            for metric in directive["Metrics"]:
                by_namespace.setdefault(directive["Namespace"], []).append({
                    "MetricName": metric["Name"], "Value": doc[metric["Name"]], "Timestamp": when,
                    "Unit": metric.get("Unit", "None"),
                    "Dimensions": [{"Name": d, "Value": doc[d]} for d in dims]})
cloudwatch = boto3.client("cloudwatch")
for namespace, data_points in by_namespace.items():
    for i in range(0, len(data_points), 500):
        cloudwatch.put_metric_data(Namespace=namespace, MetricData=data_points[i:i + 500])
open(saved, "w").write(str(offset + len(complete)))
print(sum(len(d) for d in by_namespace.values()))
"""
# Run inside the master against its moto: each group's desired capacity and its instances' states.
GROUP_STATE = """
import boto3, json, sys
groups = boto3.client("autoscaling").describe_auto_scaling_groups(AutoScalingGroupNames=sys.argv[1:])
print(json.dumps({g["AutoScalingGroupName"]: [g["DesiredCapacity"], sorted(
    [i["InstanceId"], i["LifecycleState"]] for i in g["Instances"])] for g in groups["AutoScalingGroups"]}))
"""


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


def _active_minutes_apart(records: list[dict]) -> bool:
    """Whether a run_active=1 record came at least a minute after the last run_active=0 one (the end of
    an attempt): CloudWatch's one-minute statistics then have a latest minute without the 0."""
    def ms(value):
        return [r["_aws"]["Timestamp"] for r in records if r.get(metric_names.RUN_ACTIVE) == value]
    ended, active = ms(0), ms(1)
    return bool(active) and (not ended or max(active) - max(ended) >= 60_000)


def _ship_records(master, env, logdir: Path) -> int:
    """SHIP_EMF on the master for the run's records (its offset kept in the master's /tmp); how many data points."""
    shipped = master.run([sys.executable, "-c", SHIP_EMF, f"/efs/logs/{logdir.name}/cloudwatch-metrics.log",
                          "/tmp/emf-offset"], env=env, timeout=MOTO_FIRST_CALL_S)
    assert shipped.returncode == 0, shipped.stderr
    return int(shipped.stdout)


def _groups(master, env) -> dict:
    out = master.run([sys.executable, "-c", GROUP_STATE, *(name for name, _ in GROUPS.values())], env=env,
                     timeout=MOTO_FIRST_CALL_S)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _cluster_command(master, env, *args) -> subprocess.CompletedProcess:
    """`maskrcnn cluster ...` (the launch CLI) on the master against its moto, for the emulated stack."""
    return master.run([sys.executable, "-m", "launch.cli", "cluster", *args, "--stack", STACK,
                       "--region", "us-east-1"], env=env, timeout=MOTO_FIRST_CALL_S, cwd=str(REPO))


def _ranks_by_host(hosts, logdir: Path) -> dict[str, list[int]]:
    """The run's training ranks on each host (pids as this machine sees them), by host name: every host
    has its own network namespace, which /proc/PID/ns/net names."""
    net = {os.readlink(f"/proc/{h.init_pid}/ns/net"): h.name for h in hosts}
    found: dict[str, list[int]] = {}
    for pid in training_ranks(f"/efs/logs/{logdir.name}"):
        try:
            found.setdefault(net.get(os.readlink(f"/proc/{pid}/ns/net"), "?"), []).append(pid)
        except OSError:    # gone meanwhile
            pass
    return found


def _latest_checkpoint(logdir: Path) -> int | None:
    """The step of the run's latest checkpoint, as TensorFlow's ``checkpoint`` file names it."""
    path = logdir / "checkpoint"
    found = re.search(r'^model_checkpoint_path: "(?:.*/)?model-(\d+)"', path.read_text() if path.exists() else "",
                      re.M)
    return int(found.group(1)) if found else None


def _pending_signals(pid: int) -> int | None:
    """The signals pending for ``pid`` (its own and its process's: SigPnd | ShdPnd), or None once it has
    ended (gone, or a zombie its parent has not reaped yet)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    if re.search(r"^State:\s*[ZX]", status, re.M):
        return None
    masks = re.findall(r"^(?:SigPnd|ShdPnd):\s*([0-9a-f]+)$", status, re.M)
    return int(masks[0], 16) | int(masks[1], 16) if len(masks) == 2 else 0


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
    submitted = job(master, env, "submit", "--run-name", RUN, "--max-attempts", "2", "--stall-minutes", str(STALL_MINUTES),
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

    # 2. `maskrcnn cluster pause` while the run trains: refused (the error exit of the launch CLI), and
    # nothing changes: both groups keep their desired capacity and every instance, the job its attempt.
    # moto's first CloudFormation request imports the models of every service a template can create
    # (about 6 CPU s here): on cores shared with three ranks and another worker's tests, the call took
    # over the minute this step once allowed (a fresh-clone CI run).
    made = master.run([sys.executable, "-c", CREATE_STACK], env=env, timeout=MOTO_FIRST_CALL_S)
    assert made.returncode == 0, made.stderr
    wait_for(lambda: _active_minutes_apart(_records(logdir)), 150, "a run_active record a minute after the last end")
    assert _ship_records(master, env, logdir) > 0
    groups, restarts = _groups(master, env), job_fields(master, env, job_id)["Restarts"]
    assert {name: desired for name, (desired, _) in groups.items()} == dict(GROUPS.values()), groups
    before, asked = read_heartbeat(str(logdir))["step"], time.time()
    paused = _cluster_command(master, env, "pause")
    assert paused.returncode == 2, paused.stdout + paused.stderr
    assert RUN in paused.stderr and "maskrcnn job stop" in paused.stderr, paused.stderr
    assert _groups(master, env) == groups
    wait_for(lambda: read_heartbeat(str(logdir))["step"] > before, 120, "training to go on after pause")
    assert job_fields(master, env, job_id)["Restarts"] == restarts and read_attempts(str(logdir))["attempt"] == attempt
    assert read_stop_record(str(logdir), since=asked) is None
    matrix.append(("`maskrcnn cluster pause` while the run trains", "refuses (exit 2), naming the run and "
                   "`maskrcnn job stop`; both groups keep their desired capacity and instances", None, None, 0))

    # 3. A failing check on a busy worker: drained, its job requeued (it saves first), replaced only once idle.
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

    # 4. A failing check on the master: drained, its job requeued; never marked for replacement.
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

    # 5. A spot interruption notice on a worker: drained, its job requeued; EC2 then takes the instance.
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

    # 6. A rank hangs (SIGSTOP) once the next periodic checkpoint is on disk: the other ranks block in
    # their next collective; the watchdog stops the attempt, the job script requeues it, and the next
    # attempt resumes from that checkpoint. The stall is the job's one failure of --max-attempts 2.
    periodic = CHECKPOINT_EPOCHS * STEPS_PER_EPOCH
    target = (_starts(logdir)[attempt - 1] // periodic + 1) * periodic
    assert target < MAX_STEPS, f"the run is past its last periodic checkpoint before the end ({target})"
    wait_for(lambda: _latest_checkpoint(logdir) == target, 400, f"the periodic checkpoint model-{target}")
    # An epoch later (rank 0's heartbeat at the epoch's end): steps the checkpoint does not hold.
    wait_for(lambda: read_heartbeat(str(logdir))["step"] >= target + STEPS_PER_EPOCH, 200,
             f"training an epoch past model-{target}")
    ranks = _ranks_by_host(hosts, logdir)
    assert sorted(ranks) == sorted(h.name for h in hosts) and all(len(p) == 1 for p in ranks.values()), ranks
    (hung,) = ranks[worker.name]
    os.kill(hung, signal.SIGSTOP)
    stalled_at = time.time()
    sigterm, seen = 1 << (signal.SIGTERM - 1), {}
    while not any(f.get("attempt") == attempt for f in read_attempts(str(logdir))["failures"]):
        assert time.time() - stalled_at < STALL_MINUTES * 60 + 300, "the stalled attempt never ended"
        pending = _pending_signals(hung)
        if pending is not None and pending & sigterm:
            seen.setdefault("sigterm", time.time())
        if pending is None:
            seen.setdefault("gone", time.time())
        time.sleep(0.5)
    # The failure is recorded after training has ended and before the script asks Slurm to requeue.
    reached = read_heartbeat(str(logdir))["step"]
    assert _latest_checkpoint(logdir) == target and reached > target, (_latest_checkpoint(logdir), reached)
    if "gone" not in seen and wait_for(lambda: _pending_signals(hung) is None, 10, "the hung rank to end", poll=0.1):
        seen["gone"] = time.time()
    assert "sigterm" in seen, seen
    assert _ranks_by_host(hosts, logdir) == {}, "ranks still running after the stalled attempt ended"
    (failure,) = read_attempts(str(logdir))["failures"]
    assert failure["attempt"] == attempt and failure["exit"] == STALLED_STATUS, failure
    wait_for(lambda: job_fields(master, env, job_id)["Restarts"] == str(attempt), 200,
             "Slurm to count the stall's requeue", poll=0.5)
    requeued_at = time.time()
    start = progressed(attempt + 1)
    assert start == target, f"the attempt after the stall started at {start}, not at model-{target}"
    assert read_stop_record(str(logdir))["step"] < target, "the stalled attempt wrote a stop record"
    print(f"\nstall: SIGTERM pending on the hung rank {seen['sigterm'] - stalled_at:.0f} s after SIGSTOP, "
          f"the rank gone {seen['gone'] - seen['sigterm']:.0f} s after that; Slurm's Restarts up "
          f"{requeued_at - seen['gone']:.0f} s later (or less); next attempt trained past {start} "
          f"{time.time() - requeued_at:.0f} s after that")
    matrix.append((f"a rank hangs (SIGSTOP; --stall-minutes {STALL_MINUTES:g})",
                   "watchdog: SIGTERM to every rank, SIGKILL after the grace, requeue; one failure of "
                   "--max-attempts", reached, start, reached - start))
    attempt += 1
    table = "\n".join(f"| {a} | {w} | {'-' if s is None else s} | {'-' if r is None else r} | {lost} |"
                      for a, w, s, r, lost in matrix)
    print(f"\n| action | what the system does | stopped at | resumed at | steps lost |\n| --- | --- | --- | --- | --- |"
          f"\n{table}")

    # The run is stopped by hand (`maskrcnn job stop`: a graceful stop, and the job ends): no requeue by
    # the system spent the failure budget, the stall spent one failure of it.
    assert job_fields(master, env, job_id)["Restarts"] == str(attempt - 1), "requeued more than once a stop"
    asked = time.time()
    stopped = job(master, env, "stop", RUN)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    record = wait_for(lambda: read_stop_record(str(logdir), since=asked), 150, "the stopped run's stopped.json")
    wait_for(lambda: read_attempts(str(logdir))["ended"], 150, "the job to end")
    attempts = read_attempts(str(logdir))
    assert attempts["attempt"] == attempt, attempts
    assert [(f["attempt"], f["exit"]) for f in attempts["failures"]] == [(attempt - 1, STALLED_STATUS)], attempts
    wait_for(lambda: any(r.get("run_stopped") == 1 and r.get(metric_names.RUN_ACTIVE) == 0
                         and r.get("step") == record["step"] for r in _records(logdir)), 30, "the run's last record")
