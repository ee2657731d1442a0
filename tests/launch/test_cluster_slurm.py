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
import re
import subprocess
import time
from pathlib import Path

import pytest

from training.run_status import read_heartbeat, read_stop_record

from emulated_cluster import (EPOCHS, MAX_STEPS, STEPS_PER_EPOCH, STOP_GRACE, TRAINING,
                              instance_health, job, replace_instance, runs, sinfo_reasons, slurm_name,
                              start_node, wait_for)



def _signal_ranks(signal: str, *, logdir: str) -> None:
    """Signals the run's ranks on every host (not mpirun, whose command line holds theirs)."""
    subprocess.run(["pkill", f"-{signal}", "-f", rf"^[^ ]*python[^ ]* -m training[.]train --logdir {logdir} "], check=True)


def _output(logdir: Path) -> str:
    return "".join(out.read_text(errors="replace") for out in sorted(logdir.glob("slurm-*.out")))


@pytest.mark.slow
def test_a_run_is_a_slurm_job_that_is_requeued_and_resumes_after_a_worker_dies(slurm_cluster, tmp_path):
    hosts, efs, env, munge_key, nodes = slurm_cluster
    master = hosts["node-a"]
    submitted = job(master, env, "submit", "--run-name", "emulated", "--max-attempts", "3",
                     "--stall-minutes", "5", "--stop-grace", str(STOP_GRACE), *TRAINING)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    job_id = re.search(r"submitted run emulated as job (\d+)", submitted.stdout).group(1)
    logdir = efs / "logs" / "emulated"
    # A name in use is refused without --resume, before anything is queued.
    again = job(master, env, "submit", "--run-name", "emulated", *TRAINING)
    assert again.returncode == 2 and "a run named emulated exists" in again.stderr
    # The first epoch's checkpoint is written: a worker is lost while the later epochs train. The
    # ranks are held still meanwhile (SIGSTOP; the hosts share this machine's process table), so
    # that the worker is lost mid-run however fast this machine is at the moment.
    state = logdir / "checkpoint"
    wait_for(lambda: state.exists() and f"model-{STEPS_PER_EPOCH}" in state.read_text(), 400,
             "the first epoch's checkpoint")
    _signal_ranks("STOP", logdir="/efs/logs/emulated")
    assert f"model-{MAX_STEPS}" not in state.read_text()
    status = job(master, env, "status", "emulated", "--json")
    assert json.loads(status.stdout)[0]["state"] == "RUNNING", status.stdout + status.stderr
    # The worker's link is cut: no TCP reset reaches the others, as when a machine loses power.
    # mpirun's TCP keepalives notice within a minute (Open MPI's defaults would wait ~8 minutes).
    victim = hosts["node-c"]
    victim.disconnect()
    lost = time.time()
    _signal_ranks("CONT", logdir="/efs/logs/emulated")
    wait_for(lambda: "ORTE has lost communication with a remote daemon" in _output(logdir), 120,
             "mpirun to notice the lost worker")
    noticed = time.time() - lost
    print(f"mpirun noticed the lost worker {noticed:.0f} s after its link was cut")
    assert noticed < 60, f"mpirun took {noticed:.0f} s to notice the lost worker"
    victim.stop()
    victim.reconnect()
    # The group replaces the instance. The replacement's GPU 7 has fallen off the bus (a recorded
    # Xid 79 machine): its health check, which Slurm runs as its slurmd starts, fails, drains its
    # Slurm node and marks the instance Unhealthy, so that the group replaces it too.
    faulty = replace_instance(master, env, hosts, victim, munge_key=munge_key, machine="p4d-xid79")
    nodes[victim.name] = start_node(victim, env)
    wait_for(lambda: instance_health(master, env, faulty).upper() == "UNHEALTHY", 180,
             "the faulty replacement to be marked Unhealthy", poll=1)
    # Its Slurm node (the lost worker's name) is drained; the reason names the failed check first.
    name = slurm_name(victim)
    wait_for(lambda: sinfo_reasons(master, env).get(name, "").startswith(("gpu-count", "xid")), 60,
             f"{name} drained by its health check", poll=0.5)
    # Its replacement is healthy, joins under the same Slurm name and the job resumes there.
    replace_instance(master, env, hosts, victim, munge_key=munge_key)
    nodes[victim.name] = start_node(victim, env)
    # The next attempt runs to the end, resumed from the first epoch's checkpoint on three ranks.
    wait_for(lambda: f"model-{MAX_STEPS}" in state.read_text(), 600, "the run's last checkpoint")
    wait_for(lambda: runs(master, env).get("emulated", {}).get("state") == "COMPLETED", 120, "the job to complete",
             poll=1)
    logs = job(master, env, "logs", "emulated").stdout
    assert re.search(r"attempt 1 of job \d+ on 3 node\(s\)", logs), logs[-3000:]
    assert re.search(r"attempt [2-3] of job \d+ on 3 node\(s\)", logs), logs[-3000:]
    resumed = re.search(r"training on (\d+) rank\(s\), (\d+) image\(s\) per rank.*?(\d+) steps = "
                        rf"{EPOCHS} epochs of (\d+); LR ([0-9.e-]+); resuming from \S+ at step (\d+)", logs)
    assert resumed, logs[-5000:]
    assert resumed.groups()[:4] == ("3", "2", str(MAX_STEPS), str(STEPS_PER_EPOCH))
    assert int(resumed.group(6)) >= STEPS_PER_EPOCH
    assert "training finished" in logs
    assert runs(master, env)["emulated"]["job_id"] == job_id

    # Another run, stopped through the wrapper while it trains: scancel. The ranks finish their step
    # and rank 0 saves it; the job-completion log says CANCELLED. Its schedule is long enough (a step
    # takes about a second here) that the stop lands well before its end. It is stopped past its
    # first epoch, whose steps include TensorFlow's warm-up (half a minute on these shared cores):
    # --stop-grace is the shortest, which a step and a checkpoint of a warmed-up run fit in.
    second = job(master, env, "submit", "--stop-grace", str(STOP_GRACE), *TRAINING,
                 f"TRAIN.LR_EPOCH_SCHEDULE=[({EPOCHS - 1}, 0.5), (50, None)]")
    assert second.returncode == 0, second.stderr
    name = re.search(r"submitted run (\S+) as job", second.stdout).group(1)
    assert name.startswith("maskrcnn-") and name != "emulated"
    run = efs / "logs" / name
    wait_for(lambda: (read_heartbeat(str(run)) or {}).get("step", 0) > STEPS_PER_EPOCH, 400,
             "the second run's first epoch")
    stop_asked = time.time()
    stop = job(master, env, "stop", name)
    assert stop.returncode == 0, stop.stderr
    record = wait_for(lambda: read_stop_record(str(run)), 150, "the stopped run's stopped.json")
    assert record["signal"] == "SIGTERM" and record["step"] > STEPS_PER_EPOCH and record["time"] >= stop_asked
    assert record["checkpoint"] == f"model-{record['step']}", record
    assert (run / f"{record['checkpoint']}.index").exists()
    assert f'model_checkpoint_path: "{record["checkpoint"]}"' in (run / "checkpoint").read_text()
    # mpirun and Open MPI's daemons end after their kill delay (twice job.mpi_kill_delay(STOP_GRACE))
    wait_for(lambda: runs(master, env).get(name, {}).get("state", "").startswith("CANCELLED"), 240,
             "the stopped run to be CANCELLED", poll=1)
    logs = job(master, env, "logs", name).stdout
    assert f"training stopped at step {record['step']} with checkpoint {record['checkpoint']}" in logs, logs[-3000:]
    assert (f"the job was cancelled: `maskrcnn job submit --run-name {name} --resume` continues from "
            f"{record['checkpoint']}") in logs, logs[-3000:]
