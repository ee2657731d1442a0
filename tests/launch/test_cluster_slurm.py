"""Cluster training runs as Slurm jobs, end to end on emulated hosts (tests/emulated_hosts.py).

Real munged, slurmctld and slurmd (Debian's packages, installed by scripts/install.sh) run in three
emulated nodes, each started by the image's entry `cluster-node` (docker/entrypoint.sh) as the boot
script leaves a node: cluster.env and the munge key in /etc/maskrcnn, EFS at /efs
(one directory shared by the hosts), with a custom.conf of the cluster's own Slurm settings there that the
master merges into slurm.conf (a requeued job starts sooner). A moto server in the master holds the two auto-scaling groups;
the hosts take the private IPs moto gave their instances, and a node claims its Slurm name from them.

On the master, `job submit` (launch/cluster/jobs.py) queues a run; Slurm starts launch/cluster/job.py
in the allocation, which starts the ranks with mpirun inside it (Open MPI starts its daemons with srun:
no SSH) and Horovod trains Mask R-CNN on synthetic data, one CPU rank per node. Then a worker dies
mid-run (its link cut without a TCP reset, as when its machine loses power): mpirun's keepalives
notice within a minute and the job is requeued. The group replaces the instance (moto launches a new
one at another IP; the dead host comes back at that IP as a new node), but the replacement has a GPU
that fell off the bus (its GPU tools replay a recorded Xid 79 machine): the health check Slurm runs
drains it and marks it Unhealthy, and its own replacement, healthy, claims the dead node's Slurm name;
the next attempt resumes from the checkpoint on the same three ranks. `list`, `status`, `logs` and `stop` are the project's wrappers over squeue,
the job-completion log and scancel; a run stopped while it trains keeps its last step: Slurm's SIGTERM
reaches every rank (mpirun's too, which then gives them time), rank 0 saves a checkpoint of the step
all ranks stopped after, and the job's log names it.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from machine import require
from training.run_status import read_heartbeat, read_stop_record

from emulated_cluster import (CREATE_GROUPS, EPOCHS, GROUPS, MAX_STEPS, MOTO_PORT, REPLACE_INSTANCE,
                                   STEPS_PER_EPOCH, TRAINING, VPC_CIDR, _host_env, _readdress)

REPO = Path(__file__).resolve().parents[2]
ENTRYPOINT = REPO / "docker" / "entrypoint.sh"
INSTANCE_ID = """
import boto3, sys
ec2 = boto3.client("ec2")
r = ec2.describe_instances(Filters=[{"Name": "private-ip-address", "Values": [sys.argv[1]]},
                                    {"Name": "instance-state-name", "Values": ["running"]}])
print(r["Reservations"][0]["Instances"][0]["InstanceId"])
"""

INSTANCE_HEALTH = """
import boto3, sys
(instance,) = boto3.client("autoscaling").describe_auto_scaling_instances(InstanceIds=[sys.argv[1]])[
    "AutoScalingInstances"]
print(instance["HealthStatus"])
"""
RECORDED = REPO / "tests" / "recorded_machines"
RECORDED_TOOLS = ("nvidia-smi", "fi_info", "dcgmi", "dmesg", "all_reduce_perf")
# The jobs' --stop-grace: a checkpoint of this model saves in about a second (the default, 90 s, is for
# COCO-sized ones), and a stopped or requeued attempt frees its nodes about this long later.
STOP_GRACE = 30
CRED_EXPIRE_S = 30

SLURM_DAEMONS = ("/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd")


def missing_slurm() -> str | None:
    """Which of the daemons the nodes start (Debian's munge, slurmctld and slurmd) are not installed, or None."""
    missing = [daemon for daemon in SLURM_DAEMONS if not Path(daemon).exists()]
    return f"{', '.join(missing)} not installed (scripts/install.sh installs them)" if missing else None


def _aws(master_address: str, **extra) -> dict[str, str]:
    return _host_env(AWS_ENDPOINT_URL=f"http://{master_address}:{MOTO_PORT}", **extra)


def _install_node(host, *, role: str, instance_id: str, munge_key: bytes, machine: str | None = None) -> None:
    """/etc/maskrcnn as the boot script leaves it (the parts a Slurm node uses). A CPU node
    (c5.xlarge: its health checks look at EFS and the disk), or with ``machine`` a p4d.24xlarge
    whose GPU tools replay that recorded machine (tests/recorded_machines; no EFA interfaces)."""
    etc = host.path("/etc/maskrcnn")
    etc.mkdir(parents=True, exist_ok=True)
    (etc / "cluster.env").write_text(
        f"STACK_NAME=EmulatedCluster\nAWS_REGION=us-east-1\nMASTER_ASG_NAME={GROUPS['master'][0]}\n"
        f"WORKER_ASG_NAME={GROUPS['worker'][0]}\nWORKER_COUNT={GROUPS['worker'][1]}\nEFS_MOUNT=/efs\n"
        f"VPC_CIDR={VPC_CIDR}\nROLE={role}\nSLOTS=1\nNODE_CPUS=2\nEFA_INTERFACES=0\n"
        f"INSTANCE_TYPE={'p4d.24xlarge' if machine else 'c5.xlarge'}\n"
        f"PRIVATE_IP={host.address}\nINSTANCE_ID={instance_id}\n")
    tools = etc / "recorded-bin"
    shutil.rmtree(tools, ignore_errors=True)
    tools.mkdir()
    for name in RECORDED_TOOLS if machine else ():
        (tools / name).write_text(f"#!/bin/sh\nRECORDED_MACHINE={machine} exec {RECORDED / 'bin' / name} \"$@\"\n")
        (tools / name).chmod(0o755)
    (etc / "munge.key").write_bytes(munge_key)
    (etc / "munge.key").chmod(0o400)


def _start_node(host, env) -> subprocess.Popen:
    log = open(host.path("/tmp") / "cluster-node.log", "a")
    # The node's GPU tools, if any, first on PATH: the health checks Slurm runs find them there.
    env = {**env, "PATH": f"/etc/maskrcnn/recorded-bin:{env['PATH']}"}
    return host.popen(["bash", str(ENTRYPOINT), "cluster-node"], env=env, stdout=log, stderr=subprocess.STDOUT)


def _replace(master, env, hosts, host, *, munge_key: bytes, machine: str | None = None) -> str:
    """The worker group replaces ``host``'s instance (as it does one that failed its health checks):
    moto launches another at a new IP, and ``host`` boots again as that instance. Its instance id."""
    host.stop()
    others = [h.address for h in hosts if h is not host]
    new = master.run([sys.executable, "-c", REPLACE_INSTANCE, host.address, GROUPS["worker"][0], *others],
                     env=env, timeout=60)
    assert new.returncode == 0, new.stderr
    _readdress(host, new.stdout.strip())
    for h in hosts:
        h.path("/etc/hosts").write_text(hosts.etc_hosts())
    instance = master.run([sys.executable, "-c", INSTANCE_ID, host.address], env=env, timeout=60)
    assert instance.returncode == 0, instance.stderr
    instance_id = instance.stdout.strip()
    _install_node(host, role="worker", instance_id=instance_id, munge_key=munge_key, machine=machine)
    return instance_id


def _sinfo(master, env) -> dict[str, str]:
    out = master.run(["sinfo", "-h", "-N", "-o", "%N %t"], env=env, timeout=30).stdout
    return dict(line.split() for line in out.splitlines() if line.strip())


def _wait(predicate, timeout: float, what: str, poll: float = 1.0):
    deadline = time.time() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.time() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(poll)


def _job(master, env, *args, timeout=60) -> subprocess.CompletedProcess:
    return master.run(["bash", str(ENTRYPOINT), "job", *args], env=env, timeout=timeout, cwd=str(REPO))


def _instance_health(master, env, instance_id: str) -> str:
    out = master.run([sys.executable, "-c", INSTANCE_HEALTH, instance_id], env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def _sinfo_reasons(master, env) -> dict[str, str]:
    out = master.run(["sinfo", "-h", "-R", "-N", "-o", "%N|%E"], env=env, timeout=30).stdout
    return dict(line.split("|", 1) for line in out.splitlines() if "|" in line)


def _signal_ranks(signal: str, *, logdir: str) -> None:
    """Signals the run's ranks on every host (not mpirun, whose command line holds theirs)."""
    subprocess.run(["pkill", f"-{signal}", "-f", rf"^[^ ]*python[^ ]* -m training[.]train --logdir {logdir} "], check=True)


def _output(logdir: Path) -> str:
    return "".join(out.read_text(errors="replace") for out in sorted(logdir.glob("slurm-*.out")))


def _runs(master, env) -> dict[str, dict]:
    listed = _job(master, env, "list", "--json")
    assert listed.returncode == 0, listed.stderr
    return {r["run"]: r for r in json.loads(listed.stdout)}


@pytest.fixture
def slurm_cluster(emulated_hosts, tmp_path):
    require(missing_slurm())
    efs = tmp_path / "efs"
    from training.data.synthetic import SyntheticSpec, generate
    generate(efs / "data" / "coco", SyntheticSpec(train=12, val=3, size=96, max_object_size=48, seed=5))
    (efs / "logs").mkdir()
    # The cluster's own Slurm settings (docs/launch.md), here to start a requeued job sooner: after 31 s
    # rather than Slurm's 121 (cred_expire, long enough for these nodes' prologs), looked for every 10 s.
    custom = efs / ".maskrcnn" / "EmulatedCluster" / "slurm" / "custom.conf"
    custom.parent.mkdir(parents=True)
    custom.write_text(f"# emulated nodes start jobs in seconds\nAuthInfo=cred_expire={CRED_EXPIRE_S}\n"
                      "SchedulerParameters=bf_interval=10\n")
    hosts = emulated_hosts({"node-a": "10.0.2.201", "node-b": "10.0.2.202", "node-c": "10.0.2.203"},
                           private=["/etc/maskrcnn", "/etc/slurm"], shared={"/efs": efs})
    master = hosts["node-a"]
    moto = master.popen([sys.executable, "-m", "moto.server", "-H", "0.0.0.0", "-p", str(MOTO_PORT)],
                        env=_host_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    local = _host_env(AWS_ENDPOINT_URL=f"http://127.0.0.1:{MOTO_PORT}")
    ping = f"import urllib.request; urllib.request.urlopen('http://127.0.0.1:{MOTO_PORT}/moto-api/', timeout=1)"
    _wait(lambda: moto.poll() is None and master.run([sys.executable, "-c", ping], env=local).returncode == 0,
          60, "moto in the master")
    made = master.run([sys.executable, "-c", CREATE_GROUPS], env=local, timeout=120)
    assert made.returncode == 0, made.stderr
    ips = json.loads(made.stdout)
    _readdress(master, ips["master"][0])
    for host, ip in zip((hosts["node-b"], hosts["node-c"]), ips["worker"]):
        _readdress(host, ip)
    for host in hosts:
        host.path("/etc/hosts").write_text(hosts.etc_hosts())
    env = _aws(master.address)
    munge_key = os.urandom(64)
    for host in hosts:
        instance = master.run([sys.executable, "-c", INSTANCE_ID, host.address], env=env, timeout=60)
        assert instance.returncode == 0, instance.stderr
        _install_node(host, role="master" if host is master else "worker", instance_id=instance.stdout.strip(),
                      munge_key=munge_key)
    nodes = {host.name: _start_node(host, env) for host in hosts}
    _wait(lambda: sorted(_sinfo(master, env).items()) == [("master", "idle"), ("worker-1", "idle"),
                                                         ("worker-2", "idle")], 90, "three idle Slurm nodes")
    config = master.run(["scontrol", "show", "config"], env=env, timeout=30).stdout
    assert re.search(rf"^AuthInfo\s*=\s*cred_expire={CRED_EXPIRE_S}$", config, re.M), config
    assert re.search(r"^SchedulerParameters\s*=\s*nohold_on_prolog_fail,bf_interval=10$", config, re.M), config
    return hosts, efs, env, munge_key, nodes


@pytest.mark.slow
def test_a_run_is_a_slurm_job_that_is_requeued_and_resumes_after_a_worker_dies(slurm_cluster, tmp_path):
    hosts, efs, env, munge_key, nodes = slurm_cluster
    master = hosts["node-a"]
    submitted = _job(master, env, "submit", "--run-name", "emulated", "--max-attempts", "3",
                     "--stall-minutes", "5", "--stop-grace", str(STOP_GRACE), *TRAINING)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    job_id = re.search(r"submitted run emulated as job (\d+)", submitted.stdout).group(1)
    logdir = efs / "logs" / "emulated"
    # A name in use is refused without --resume, before anything is queued.
    again = _job(master, env, "submit", "--run-name", "emulated", *TRAINING)
    assert again.returncode == 2 and "a run named emulated exists" in again.stderr
    # The first epoch's checkpoint is written: a worker is lost while the later epochs train. The
    # ranks are held still meanwhile (SIGSTOP; the hosts share this machine's process table), so
    # that the worker is lost mid-run however fast this machine is at the moment.
    state = logdir / "checkpoint"
    _wait(lambda: state.exists() and f"model-{STEPS_PER_EPOCH}" in state.read_text(), 400,
          "the first epoch's checkpoint", poll=0.2)
    _signal_ranks("STOP", logdir="/efs/logs/emulated")
    assert f"model-{MAX_STEPS}" not in state.read_text()
    status = _job(master, env, "status", "emulated", "--json")
    assert json.loads(status.stdout)[0]["state"] == "RUNNING", status.stdout + status.stderr
    # The worker's link is cut: no TCP reset reaches the others, as when a machine loses power.
    # mpirun's TCP keepalives notice within a minute (Open MPI's defaults would wait ~8 minutes).
    victim = hosts["node-c"]
    victim.disconnect()
    lost = time.time()
    _signal_ranks("CONT", logdir="/efs/logs/emulated")
    _wait(lambda: "ORTE has lost communication with a remote daemon" in _output(logdir), 120,
          "mpirun to notice the lost worker")
    noticed = time.time() - lost
    print(f"mpirun noticed the lost worker {noticed:.0f} s after its link was cut")
    assert noticed < 60, f"mpirun took {noticed:.0f} s to notice the lost worker"
    victim.stop()
    victim.reconnect()
    # The group replaces the instance. The replacement's GPU 7 has fallen off the bus (a recorded
    # Xid 79 machine): its health check, which Slurm runs as its slurmd starts, fails, drains its
    # Slurm node and marks the instance Unhealthy, so that the group replaces it too.
    faulty = _replace(master, env, hosts, victim, munge_key=munge_key, machine="p4d-xid79")
    nodes[victim.name] = _start_node(victim, env)
    _wait(lambda: _instance_health(master, env, faulty).upper() == "UNHEALTHY", 180,
          "the faulty replacement to be marked Unhealthy")
    # Its Slurm node (the lost worker's name) is drained; the reason names the failed check first.
    name = re.findall(r"this node is Slurm node (\S+)", victim.path("/tmp/cluster-node.log").read_text())[-1]
    _wait(lambda: _sinfo_reasons(master, env).get(name, "").startswith(("gpu-count", "xid")), 60,
          f"{name} drained by its health check")
    # Its replacement is healthy, joins under the same Slurm name and the job resumes there.
    _replace(master, env, hosts, victim, munge_key=munge_key)
    nodes[victim.name] = _start_node(victim, env)
    # The next attempt runs to the end, resumed from the first epoch's checkpoint on three ranks.
    _wait(lambda: f"model-{MAX_STEPS}" in state.read_text(), 600, "the run's last checkpoint", poll=1)
    _wait(lambda: _runs(master, env).get("emulated", {}).get("state") == "COMPLETED", 120, "the job to complete")
    logs = _job(master, env, "logs", "emulated").stdout
    assert re.search(r"attempt 1 of job \d+ on 3 node\(s\)", logs), logs[-3000:]
    assert re.search(r"attempt [2-3] of job \d+ on 3 node\(s\)", logs), logs[-3000:]
    resumed = re.search(r"training on (\d+) rank\(s\), (\d+) image\(s\) per rank.*?(\d+) steps = "
                        rf"{EPOCHS} epochs of (\d+); LR ([0-9.e-]+); resuming from \S+ at step (\d+)", logs)
    assert resumed, logs[-5000:]
    assert resumed.groups()[:4] == ("3", "2", str(MAX_STEPS), str(STEPS_PER_EPOCH))
    assert int(resumed.group(6)) >= STEPS_PER_EPOCH
    assert "training finished" in logs
    assert _runs(master, env)["emulated"]["job_id"] == job_id

    # Another run, stopped through the wrapper while it trains: scancel. The ranks finish their step
    # and rank 0 saves it; the job-completion log says CANCELLED. Its schedule is long enough (a step
    # takes about a second here) that the stop lands well before its end.
    second = _job(master, env, "submit", "--stop-grace", str(STOP_GRACE), *TRAINING,
                  f"TRAIN.LR_EPOCH_SCHEDULE=[({EPOCHS - 1}, 0.5), (50, None)]")
    assert second.returncode == 0, second.stderr
    name = re.search(r"submitted run (\S+) as job", second.stdout).group(1)
    assert name.startswith("maskrcnn-") and name != "emulated"
    run = efs / "logs" / name
    _wait(lambda: (read_heartbeat(str(run)) or {}).get("step", 0) >= 1, 400, "the second run's first steps",
          poll=0.5)
    stop_asked = time.time()
    stop = _job(master, env, "stop", name)
    assert stop.returncode == 0, stop.stderr
    record = _wait(lambda: read_stop_record(str(run)), 150, "the stopped run's stopped.json")
    assert record["signal"] == "SIGTERM" and record["step"] >= 1 and record["time"] >= stop_asked
    assert record["checkpoint"] == f"model-{record['step']}", record
    assert (run / f"{record['checkpoint']}.index").exists()
    assert f'model_checkpoint_path: "{record["checkpoint"]}"' in (run / "checkpoint").read_text()
    # mpirun and Open MPI's daemons end after their kill delay (twice job.mpi_kill_delay(STOP_GRACE))
    _wait(lambda: _runs(master, env).get(name, {}).get("state", "").startswith("CANCELLED"), 240,
          "the stopped run to be CANCELLED")
    logs = _job(master, env, "logs", name).stdout
    assert f"training stopped at step {record['step']} with checkpoint {record['checkpoint']}" in logs, logs[-3000:]
    assert (f"the job was cancelled: `maskrcnn job submit --run-name {name} --resume` continues from "
            f"{record['checkpoint']}") in logs, logs[-3000:]
