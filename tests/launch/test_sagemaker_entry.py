"""The SageMaker container entry, run as SageMaker runs it, on a fabricated /opt/ml tree.

One host, CPU, synthetic data (one process, or two under horovodrun); $SAGEMAKER_BASE_DIR points
sagemaker-training at the temp tree.
"""
import dataclasses
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from training.configs import cpu_synthetic
from training.data import synthetic

REPO = Path(__file__).resolve().parents[2]


def fabricate(base: Path, *, hyperparameters: dict, channels: dict[str, Path | None],
              hosts=("algo-1",), current_host="algo-1") -> Path:
    """An /opt/ml tree: config files plus channel directories (None: create an empty one)."""
    config = base / "input" / "config"
    config.mkdir(parents=True)
    (config / "hyperparameters.json").write_text(json.dumps(hyperparameters))
    (config / "resourceconfig.json").write_text(json.dumps(
        {"current_host": current_host, "hosts": list(hosts), "network_interface_name": "eth0",
         "current_instance_type": "ml.m5.xlarge"}))
    (config / "inputdataconfig.json").write_text(json.dumps(
        {name: {"TrainingInputMode": "File"} for name in channels}))
    for name, source in channels.items():
        target = base / "input" / "data" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source is None:
            target.mkdir()
        else:
            target.symlink_to(source, target_is_directory=True)
    for d in ("model", "output"):
        (base / d).mkdir()
    return base


def run_entry(base: Path, job_name: str = "entry-test-job", timeout: int = 900) -> subprocess.CompletedProcess:
    env = {**os.environ, "SAGEMAKER_BASE_DIR": str(base), "TRAINING_JOB_NAME": job_name,
           "PYTHONPATH": str(REPO), "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}
    return subprocess.run([sys.executable, "-m", "launch.sagemaker.entry", "train"], cwd=base, env=env,
                          capture_output=True, text=True, timeout=timeout)


def tiny_hyperparameters() -> dict[str, str]:
    """The CPU preset as config: hyperparameters, cut to 2 steps of 2 images and a final evaluation."""
    hps = {"config:" + o.split("=", 1)[0]: o.split("=", 1)[1] for o in cpu_synthetic.OVERRIDES}
    del hps["config:MODE_MASK"]  # set by its SageMaker hyperparameter name below
    hps.update({"config:TRAIN.IMAGES_PER_EPOCH": "4", "config:TRAIN.LR_EPOCH_SCHEDULE": "[(1, None)]",
                "config:TRAIN.WARMUP": "1", "config:TRAIN.LOG_PERIOD": "1", "mode_mask": "True"})
    return hps


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    out = tmp_path_factory.mktemp("coco")
    synthetic.main(["--output", str(out), "--train", "4", "--val", "2", "--size", "128"])
    return out


def test_missing_train_channel_fails_with_reason(tmp_path):
    base = fabricate(tmp_path / "ml", hyperparameters={}, channels={"log": None})
    result = run_entry(base)
    assert result.returncode != 0
    failure = (base / "output" / "failure").read_text()
    assert failure.startswith("no 'train' channel (channels: ['log'])")
    assert not (base / "output" / "success").exists()


def test_bad_hyperparameter_fails_before_training(tmp_path, dataset):
    base = fabricate(tmp_path / "ml", hyperparameters={"batch_norm": "BatchNorm"}, channels={"train": dataset})
    result = run_entry(base)
    assert result.returncode != 0
    failure = (base / "output" / "failure").read_text()
    assert failure.startswith("bad hyperparameters: hyperparameter batch_norm='BatchNorm'")
    assert "[entry] FAILED" in result.stderr


def test_multi_host_job_needs_the_shared_log_channel(tmp_path, dataset):
    base = fabricate(tmp_path / "ml", hyperparameters={}, channels={"train": dataset},
                     hosts=("algo-2", "algo-1"), current_host="algo-2")
    result = run_entry(base)
    assert result.returncode != 0
    assert "host algo-2 of ['algo-1', 'algo-2']" in result.stdout
    assert (base / "output" / "failure").read_text().startswith("a multi-host job needs the 'log' channel")


def test_plan_picks_leader_logdir_and_processes(tmp_path, dataset, monkeypatch):
    from launch.sagemaker import entry

    class Env:  # the attributes entry.plan reads from sagemaker_training's Environment
        channel_input_dirs = {"train": str(dataset), "log": str(tmp_path)}
        hyperparameters = {"backbone_weights": "weights/R50.npz", "batch_size_per_gpu": 4}
        additional_framework_parameters = {}
        model_dir, num_gpus, network_interface_name = "/opt/ml/model", 8, "eth0"
        hosts, current_host, current_instance_type = ["algo-2", "algo-1"], "algo-1", "ml.p4d.24xlarge"

    monkeypatch.setenv("TRAINING_JOB_NAME", "job-7")
    job = entry.plan(Env())
    assert (job.leader, job.is_leader, job.processes_per_host) == ("algo-1", True, 8)
    assert job.logdir == str(tmp_path / "job-7")
    assert f"BACKBONE.WEIGHTS='{dataset}/weights/R50.npz'" in job.overrides
    assert "TRAIN.BATCH_SIZE_PER_GPU=4" in job.overrides
    monkeypatch.setenv(entry.RUN_NAME_ENV, "resume-me")
    Env.additional_framework_parameters = {entry.PROCESSES_PER_HOST_PARAM: 2}
    job = entry.plan(Env())
    assert (job.logdir, job.processes_per_host) == (str(tmp_path / "resume-me"), 2)


@pytest.mark.slow
def test_failing_training_gives_nonzero_exit_and_its_error(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    base = fabricate(tmp_path / "ml", hyperparameters={}, channels={"train": empty, "log": None})
    result = run_entry(base)
    assert result.returncode != 0
    failure = (base / "output" / "failure").read_text()
    assert failure.startswith("training exited with status 2: error:"), failure[:300]


@pytest.mark.slow
def test_trains_to_a_model_and_resumes(tmp_path, dataset):
    # Two processes on this one CPU host (as on a GPU host with 2 GPUs): horovodrun with Gloo here.
    hyperparameters = {**tiny_hyperparameters(), "sagemaker_mpi_num_of_processes_per_host": "2"}
    base = fabricate(tmp_path / "ml", hyperparameters=hyperparameters, channels={"train": dataset, "log": None})
    result = run_entry(base)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    logdir = base / "input" / "data" / "log" / "entry-test-job"
    assert (logdir / "checkpoint").exists()
    model = sorted(p.name for p in (base / "model").iterdir())
    assert "checkpoint" in model and "config.json" in model
    assert any(n.endswith(".index") for n in model) and any(".data-" in n for n in model)
    assert (base / "output" / "success").exists() and not (base / "output" / "failure").exists()
    assert "2 process(es) per host" in result.stdout
    assert "training on 2 rank(s)" in result.stdout
    assert "mAP(bbox)/IoU=0.5:0.95:" in result.stdout  # the metric lines SageMaker scrapes
    # The same job started again (a spot restart) finds its checkpoint and does not train from scratch.
    (base / "output" / "success").unlink()
    again = run_entry(base)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "nothing to train" in again.stdout


def test_nccl_keeps_sagemakers_network_interface_and_ranks_get_the_mpi_settings(monkeypatch):
    """The toolkit's mpirun exports NCCL_SOCKET_IFNAME=<SageMaker's interface>; the entry's own
    rank variables come later on that command line and must not replace it (they once said ^docker0,lo)."""
    from sagemaker_training import mpi

    from launch.sagemaker import entry

    job = entry.Job(train_dir="/opt/ml/input/data/train", logdir="/opt/ml/input/data/log/job", overrides=[],
                    model_dir="/opt/ml/model", hosts=["algo-2", "algo-1"], current_host="algo-1",
                    processes_per_host=8, network_interface="ens6", instance_type="ml.p4d.24xlarge")
    env_vars = entry.rank_env(job)
    monkeypatch.setattr(mpi, "_modelparallel_environment_command", lambda instance_type: [])
    command = mpi.MasterRunner(entry.RANK_SCRIPT, entry.train_args(job), env_vars, job.processes_per_host,
                               job.leader, sorted(job.hosts), "", job.network_interface,
                               instance_type=job.instance_type)._create_command()
    # `-x NAME=VALUE` exports VALUE; `-x NAME` exports the launching environment's value, which the
    # entry sets from env_vars. Whichever occurrence mpirun honours, each must name the interface.
    launching_env = {**os.environ, **env_vars}
    exported = [arg.partition("=")[2] if "=" in arg else launching_env.get(arg)
                for flag, arg in zip(command, command[1:])
                if flag == "-x" and arg.partition("=")[0] == "NCCL_SOCKET_IFNAME"]
    assert len(exported) >= 1 and set(exported) == {"ens6"}, exported
    # every rank, on every host, waits in MPI without busy-polling a core (launch_command.MPI_MCA)
    assert "OMPI_MCA_mpi_yield_when_idle" in [arg.partition("=")[0] for flag, arg in zip(command, command[1:])
                                              if flag == "-x"], command
    assert launching_env["OMPI_MCA_mpi_yield_when_idle"] == "1"


def _worker_job(logdir: Path):
    from launch.sagemaker import entry

    return entry.Job(train_dir="/d", logdir=str(logdir), overrides=[], model_dir="/m", hosts=["algo-1", "algo-2"],
                     current_host="algo-2", processes_per_host=1, network_interface="eth0",
                     instance_type="ml.c5.xlarge")


def test_a_worker_exits_with_the_leaders_outcome_of_this_attempt(tmp_path, monkeypatch, capsys):
    from launch.sagemaker import entry

    monkeypatch.setattr(entry, "POLL_SECONDS", 0.05)
    monkeypatch.setattr(entry, "LEADER_LOST_SECONDS", 0.3)
    outcome = tmp_path / "outcome.json"
    job = _worker_job(tmp_path / "input" / "data" / "log" / "run")
    # A previous attempt's outcome (a spot restart under the same job name) does not count; with the
    # leader unreachable (a port held but not listening) the worker gives up, with that reason.
    outcome.write_text(json.dumps({"ok": True, "reason": "", "written_at": 100.0}))
    monkeypatch.setattr(job, "hosts", ["127.0.0.2", "algo-2"])
    closed = socket.socket()
    closed.bind(("127.0.0.2", 0))
    monkeypatch.setattr(entry, "SSH_PORT", closed.getsockname()[1])
    with pytest.raises(entry.JobError, match=r"lost the leader 127.0.0.2: unreachable"):
        entry._wait_for_leader(job, outcome, since=200.0)
    outcome.write_text(json.dumps({"ok": False, "reason": "training failed on the cluster: boom", "written_at": 300.0}))
    with pytest.raises(entry.JobError, match=r"^the job failed \(reported by the leader 127.0.0.2\): training failed"):
        entry._wait_for_leader(job, outcome, since=200.0)
    assert "reports the job succeeded" not in capsys.readouterr().out
    outcome.write_text(json.dumps({"ok": True, "reason": "", "written_at": 300.0}))
    entry._wait_for_leader(job, outcome, since=200.0)
    assert "[entry] the leader 127.0.0.2 reports the job succeeded" in capsys.readouterr().out
    closed.close()


def test_the_leader_reports_the_outcome_on_the_log_channel(tmp_path, monkeypatch, capsys):
    from launch.sagemaker import entry

    monkeypatch.setenv("TRAINING_JOB_NAME", "job-9")
    logdir = tmp_path / "input" / "data" / "log" / "run"
    leader = dataclasses.replace(_worker_job(logdir), current_host="algo-1")
    entry.report_outcome(leader, ok=False, reason="x" * 10000)
    target = logdir.parent / ".jobs" / "job-9" / "outcome.json"
    written = json.loads(target.read_text())
    assert written["ok"] is False and len(written["reason"]) == 4000
    said = capsys.readouterr().out
    assert said == f"[entry] the job's outcome (failed) is in {target}: the other hosts exit with it\n"
    entry.report_outcome(_worker_job(logdir), ok=True)   # a worker never writes it
    assert json.loads((logdir.parent / ".jobs" / "job-9" / "outcome.json").read_text())["ok"] is False
