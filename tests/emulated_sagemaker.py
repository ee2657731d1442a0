"""SageMaker instances on emulated hosts (tests/emulated_hosts.py), for the multi-host tests and
bench/multihost_startup.py: what SageMaker puts on each instance, and the image's `train` started on each.

Per host: hostname algo-N, its own /opt/ml with SageMaker's files (resourceconfig.json,
hyperparameters.json with string values, inputdataconfig.json), the train and log channels on one
shared "EFS" directory (SageMaker mounts file-system channels at /opt/ml/input/data/<channel>; here
a link into the shared mount), eth0 on the hosts' private network. `train` is docker/entrypoint.sh
train -> launch.sagemaker.entry with the image's environment: the real sagemaker-training toolkit,
sshd, mpirun and Horovod.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EFS = "/mnt/emulated-efs"            # where every host sees the shared directory
INSTANCE_TYPE = "ml.c5.xlarge"       # a CPU type: no EFA, no GPUs
PROCESSES_PER_HOST_PARAM = "sagemaker_mpi_num_of_processes_per_host"


def addresses(count: int, subnet: str = "10.77.1") -> dict[str, str]:
    """``algo-1``... as SageMaker names the hosts, with addresses on the emulated network."""
    return {f"algo-{i}": f"{subnet}.{10 + i}" for i in range(1, count + 1)}


def cpu_hyperparameters(*, images_per_epoch: int, processes_per_host: int) -> dict[str, str]:
    """The CPU preset (training/configs/cpu_synthetic.py) as SageMaker passes it: every value a string;
    one epoch of ``images_per_epoch``, a progress line every step."""
    from training.configs import cpu_synthetic

    hps = {"config:" + o.split("=", 1)[0]: o.split("=", 1)[1] for o in cpu_synthetic.OVERRIDES}
    del hps["config:MODE_MASK"]  # given by its SageMaker hyperparameter name below
    hps.update({"config:TRAIN.IMAGES_PER_EPOCH": str(images_per_epoch), "config:TRAIN.LR_EPOCH_SCHEDULE":
                "[(1, None)]", "config:TRAIN.WARMUP": "1", "config:TRAIN.LOG_PERIOD": "1",
                "config:DATA.NUM_WORKERS": "1", "mode_mask": "True",
                PROCESSES_PER_HOST_PARAM: str(processes_per_host)})
    return hps


def write_sagemaker_files(host, *, hosts: list[str], hyperparameters: dict[str, str], train_channel: str,
                          log_channel: str = f"{EFS}/logs") -> None:
    """What SageMaker writes on an instance before it starts the container."""
    config = host.path("/opt/ml/input/config")
    config.mkdir(parents=True)
    hosts = sorted(hosts)
    (config / "resourceconfig.json").write_text(json.dumps({
        "current_host": host.name, "current_instance_type": INSTANCE_TYPE,
        "current_group_name": "homogeneousCluster", "hosts": hosts, "network_interface_name": "eth0",
        "instance_groups": [{"instance_group_name": "homogeneousCluster", "instance_type": INSTANCE_TYPE,
                             "hosts": hosts}]}))
    (config / "hyperparameters.json").write_text(json.dumps(hyperparameters))
    (config / "inputdataconfig.json").write_text(json.dumps({
        name: {"TrainingInputMode": "File", "S3DistributionType": "FullyReplicated", "RecordWrapperType": "None"}
        for name in ("train", "log")}))
    data = host.path("/opt/ml/input/data")
    data.mkdir(parents=True)
    (data / "train").symlink_to(train_channel)
    (data / "log").symlink_to(log_channel)
    for d in ("model", "output", "code"):
        host.path(f"/opt/ml/{d}").mkdir()


def container_env(job_name: str) -> dict[str, str]:
    """The image's environment (docker/Dockerfile ENV; its Python is the venv's here) plus SageMaker's."""
    return {"PATH": f"{Path(sys.executable).parent}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": "/root", "LANG": "C.UTF-8", "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO),
            "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2", "TRAINING_JOB_NAME": job_name,
            "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}


class Job:
    """Every host's `train` started at once, as SageMaker starts the containers; each host's output
    goes to ``logs/<host>.log`` (files, so no pipe can block a host). When a host's `train` exits, the
    host's other processes die (its sshd too), as when a container ends."""

    def __init__(self, hosts, *, job_name: str, logs: Path):
        self.logs = logs
        logs.mkdir(parents=True, exist_ok=True)
        self.started = time.time()
        self.procs: dict[str, subprocess.Popen] = {}
        for host in hosts:
            with open(logs / f"{host.name}.log", "w") as out:
                self.procs[host.name] = host.popen(["bash", str(REPO / "docker" / "entrypoint.sh"), "train"],
                                                   env=container_env(job_name), stop_host_on_exit=True,
                                                   stdout=out, stderr=subprocess.STDOUT)

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")

    def wait(self, name: str, *, deadline: float) -> int | None:
        """The host's exit status, or None if it still runs at ``deadline`` (time.time())."""
        try:
            return self.procs[name].wait(timeout=max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            return None

    def wait_for_output(self, name: str, pattern: str, *, deadline: float) -> float | None:
        """When ``pattern`` first appeared in the host's output (polled), or None if it ended or timed out first."""
        while not re.search(pattern, self.log(name), re.MULTILINE):
            if self.procs[name].poll() is not None or time.time() > deadline:
                return None
            time.sleep(0.2)
        return time.time()

    def outputs(self, tail: int = 3000) -> str:
        return "\n".join(f"--- {name}\n{self.log(name)[-tail:]}" for name in self.procs)


def _main(argv: list[str]) -> int:
    """One emulated SageMaker job by hand (root): ``sudo .venv/bin/python tests/emulated_sagemaker.py``."""
    import argparse
    import signal

    from emulated_hosts import EmulatedHosts
    from training.data import synthetic

    p = argparse.ArgumentParser(description=_main.__doc__)
    p.add_argument("--hosts", type=int, default=2)
    p.add_argument("--processes-per-host", type=int, default=2)
    p.add_argument("--images", type=int, default=8, help="training images in the one epoch (2 per rank and step)")
    p.add_argument("--workdir", default="/tmp/emulated-sagemaker", help="EFS, hosts' files and logs go here")
    p.add_argument("--keep", action="store_true", help="keep the hosts up after the job, until Ctrl-C")
    a = p.parse_args(argv)
    work = Path(a.workdir).resolve()
    efs = work / "efs"
    if not (efs / "data" / "coco" / "annotations").is_dir():
        synthetic.main(["--output", str(efs / "data" / "coco"), "--train", "8", "--val", "2", "--size", "128"])
    (efs / "logs").mkdir(parents=True, exist_ok=True)
    names = addresses(a.hosts)
    hps = cpu_hyperparameters(images_per_epoch=a.images, processes_per_host=a.processes_per_host)
    run = time.strftime("%Y%m%d-%H%M%S")
    with EmulatedHosts(names, workdir=work / f"hosts-{run}", private=["/opt/ml"], shared={EFS: efs}) as hosts:
        for host in hosts:
            write_sagemaker_files(host, hosts=list(names), hyperparameters=hps, train_channel=f"{EFS}/data/coco")
            print(f"{host.name} {host.address}: /opt/ml is {host.path('/opt/ml')}; "
                  f"log {work}/logs-{run}/{host.name}.log; enter: nsenter -t {host.init_pid} -m -u -n -p -- bash",
                  flush=True)
        job = Job(hosts, job_name=f"emulated-{run}", logs=work / f"logs-{run}")
        codes = {name: job.wait(name, deadline=time.time() + 3600) for name in names}
        print(f"exit status per host: {codes}; checkpoints in {efs}/logs/emulated-{run}", flush=True)
        if a.keep:
            print("hosts stay up (their processes ended with the job); Ctrl-C tears them down", flush=True)
            try:
                signal.pause()
            except KeyboardInterrupt:
                pass
    return 0 if not any(codes.values()) else 1


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
