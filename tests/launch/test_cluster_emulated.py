"""The EC2 cluster path end to end on emulated hosts (tests/emulated_hosts.py): a master and 2 workers.

Each host is set up as the boot script (infra/userdata/cluster_node.sh) leaves a node: cluster.env and
the cluster key in /etc/maskrcnn, EFS at /efs (here one directory shared by the hosts), and the image's
entry `cluster-node` (docker/entrypoint.sh: sshd on 2222 with the cluster key) running. A moto server
inside the master (its 127.0.0.1) holds the two auto-scaling groups; the hosts get the private IPs moto
gave their instances. On the master, the entry's `cluster-health` and `cluster-train`
(launch.cluster.run) discover the nodes through the groups and health-check them over SSH, and
`cluster-train` runs the real mpirun over them: Horovod (built with MPI) trains Mask R-CNN on
synthetic data, one CPU rank per node.

Then a worker dies mid-run (all its processes killed, as when its machine goes): the run notices,
says it waits for the cluster to be whole, and the auto-scaling group replaces the instance (moto
launches a new one at another IP; the dead host comes back at that IP, set up as a new node). The
run rediscovers the group, finds 3 healthy ranks again and resumes from the checkpoint with the same
ranks, global batch and LR schedule.
"""
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from training.configs import cpu_synthetic

REPO = Path(__file__).resolve().parents[2]
ENTRYPOINT = REPO / "docker" / "entrypoint.sh"
VPC_CIDR = "10.0.0.0/16"
SUBNET_CIDR = "10.0.2.0/24"
MOTO_PORT = 5000
GROUPS = {"master": ("emulated-master-asg", 1), "worker": ("emulated-worker-asg", 2)}
# One CPU rank per node, 2 images each: global batch 6; 24 images an epoch = 4 steps; 3 epochs. The
# claim needs a checkpoint before the kill (epoch 1's) and steps after the resume, not many steps;
# the last 2 epochs (8 steps, ~5 s here) are the window in which the worker dies. No evaluation
# (DATA.VAL=()): the claim is about the cluster, and evaluation across ranks is tested elsewhere
# (tests/training/test_startup_devices.py, tests/launch/test_sagemaker_multihost.py).
EPOCHS, STEPS_PER_EPOCH = 3, 4
MAX_STEPS = EPOCHS * STEPS_PER_EPOCH
TRAINING = [*cpu_synthetic.OVERRIDES, "DATA.VAL=()", f"TRAIN.IMAGES_PER_EPOCH={3 * 2 * STEPS_PER_EPOCH}",
            f"TRAIN.LR_EPOCH_SCHEDULE=[({EPOCHS - 1}, 0.5), ({EPOCHS}, None)]",
            "TRAIN.LOG_PERIOD=1", "TRAIN.WARMUP=2", "PREPROC.TRAIN_SHORT_EDGE_SIZE=[96, 96]",
            "PREPROC.TEST_SHORT_EDGE_SIZE=96", "PREPROC.MAX_SIZE=96", "RPN.TRAIN_PER_LEVEL_NMS_TOPK=100",
            "RPN.TEST_PER_LEVEL_NMS_TOPK=100"]

# Run inside the master against its moto: the stack's two groups (CPU instances: one slot each),
# then the private IP of every InService instance per group.
CREATE_GROUPS = f"""
import json, boto3
ec2, asg = boto3.client("ec2"), boto3.client("autoscaling")
vpc = ec2.create_vpc(CidrBlock="{VPC_CIDR}")["Vpc"]["VpcId"]
subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="{SUBNET_CIDR}")["Subnet"]["SubnetId"]
ec2.create_launch_template(LaunchTemplateName="node", LaunchTemplateData={{"ImageId": "ami-12c6146b",
                                                                         "InstanceType": "c5.xlarge"}})
ips = {{}}
for role, (name, size) in {GROUPS!r}.items():
    asg.create_auto_scaling_group(AutoScalingGroupName=name, LaunchTemplate={{"LaunchTemplateName": "node"}},
                                  MinSize=size, MaxSize=size, DesiredCapacity=size, VPCZoneIdentifier=subnet)
    ids = [i["InstanceId"] for i in asg.describe_auto_scaling_groups(AutoScalingGroupNames=[name])
           ["AutoScalingGroups"][0]["Instances"]]
    ips[role] = sorted(i["PrivateIpAddress"] for r in ec2.describe_instances(InstanceIds=ids)["Reservations"]
                       for i in r["Instances"])
print(json.dumps(ips))
"""
# Run inside the master against its moto: the group replaces the instance at the given IP, as it does
# an instance that failed its health checks; prints the replacement's IP.
REPLACE_INSTANCE = """
import boto3, sys
ec2, asg = boto3.client("ec2"), boto3.client("autoscaling")
dead = ec2.describe_instances(Filters=[{"Name": "private-ip-address", "Values": [sys.argv[1]]}])
dead = dead["Reservations"][0]["Instances"][0]["InstanceId"]
asg.terminate_instance_in_auto_scaling_group(InstanceId=dead, ShouldDecrementDesiredCapacity=False)
group = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[sys.argv[2]])["AutoScalingGroups"][0]
ids = [i["InstanceId"] for i in group["Instances"] if i["LifecycleState"] == "InService"]
ips = [i["PrivateIpAddress"] for r in ec2.describe_instances(InstanceIds=ids)["Reservations"] for i in r["Instances"]]
print([ip for ip in ips if ip != sys.argv[1] and ip not in sys.argv[3:]][0])
"""


def _host_env(**extra) -> dict[str, str]:
    """What the image's processes see: its Python first on PATH, Keras 2, fake AWS credentials."""
    return {"PATH": f"{Path(sys.executable).parent}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": "/root", "LANG": "C.UTF-8", "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO),
            "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2",
            "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1",
            "AWS_DEFAULT_REGION": "us-east-1", **extra}


def _readdress(host, address: str) -> None:
    """Give ``host`` the private IP moto chose for its instance (the hosts exist before moto runs)."""
    for cmd in (["addr", "flush", "dev", "eth0"], ["addr", "add", f"{address}/24", "dev", "eth0"]):
        subprocess.run(["ip", "-n", host.netns, *cmd], check=True, capture_output=True)
    host.address = address


def _install_node(host, *, role: str, key_dir: Path) -> None:
    """/etc/maskrcnn as the boot script leaves it: cluster.env (with the node's PRIVATE_IP, where
    sshd listens), the cluster key, authorized_keys."""
    etc = host.path("/etc/maskrcnn")
    etc.mkdir(parents=True, exist_ok=True)
    (etc / "cluster.env").write_text(
        f"STACK_NAME=EmulatedCluster\nAWS_REGION=us-east-1\nMASTER_ASG_NAME={GROUPS['master'][0]}\n"
        f"WORKER_ASG_NAME={GROUPS['worker'][0]}\nEFS_MOUNT=/efs\nSSH_PORT=2222\nVPC_CIDR={VPC_CIDR}\nROLE={role}\n"
        f"PRIVATE_IP={host.address}\n")
    ssh = etc / "ssh"
    ssh.mkdir(mode=0o700, exist_ok=True)
    private, public = (key_dir / "id_ed25519").read_bytes(), (key_dir / "id_ed25519.pub").read_text().strip()
    (ssh / "id_ed25519").write_bytes(private)
    (ssh / "id_ed25519").chmod(0o600)
    (ssh / "id_ed25519.pub").write_text(public + "\n")
    (ssh / "authorized_keys").write_text(
        f'from="{VPC_CIDR}",no-agent-forwarding,no-port-forwarding,no-X11-forwarding {public}\n')
    (ssh / "authorized_keys").chmod(0o600)


def _start_node(host):
    """The node's container: the image's entry `cluster-node` (sshd on 2222), up once it accepts."""
    proc = host.popen(["bash", str(ENTRYPOINT), "cluster-node"], env=_host_env(),
                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    probe = f"import socket; socket.create_connection(('{host.address}', 2222), timeout=1)"
    deadline = time.time() + 30
    while host.run([sys.executable, "-c", probe]).returncode != 0:
        assert proc.poll() is None, f"cluster-node on {host.name} exited with {proc.returncode}"
        assert time.time() < deadline, f"sshd on {host.name} did not listen on 2222"
        time.sleep(0.2)
    return proc


class Output:
    """A process's merged output, collected line by line while it runs (and kept in a file)."""

    def __init__(self, proc: subprocess.Popen, log: Path):
        self.proc, self.lines, self.log = proc, [], log
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        with open(self.log, "w") as f:
            for line in self.proc.stdout:
                self.lines.append(line)
                f.write(line)
                f.flush()

    def text(self) -> str:
        return "".join(self.lines)

    def wait_for(self, pattern: str, timeout: float) -> None:
        deadline = time.time() + timeout
        while not re.search(pattern, self.text()):
            assert self.proc.poll() is None or self.thread.is_alive(), \
                f"exited ({self.proc.returncode}) before {pattern!r}:\n{self.text()[-5000:]}"
            assert time.time() < deadline, f"no {pattern!r} after {timeout} s:\n{self.text()[-5000:]}"
            time.sleep(0.2)


@pytest.fixture
def cluster(emulated_hosts, tmp_path):
    """Three emulated nodes at the IPs of their moto instances, each running `cluster-node`."""
    efs = tmp_path / "efs"
    from training.data.synthetic import SyntheticSpec, generate
    generate(efs / "data" / "coco", SyntheticSpec(train=12, val=3, size=96, max_object_size=48, seed=5))
    (efs / "logs").mkdir()
    hosts = emulated_hosts({"master": "10.0.2.201", "worker-1": "10.0.2.202", "worker-2": "10.0.2.203"},
                           private=["/etc/maskrcnn"], shared={"/efs": efs})
    master = hosts["master"]
    moto = master.popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(MOTO_PORT)],
                        env=_host_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    aws = _host_env(AWS_ENDPOINT_URL=f"http://127.0.0.1:{MOTO_PORT}")
    ping = f"import urllib.request; urllib.request.urlopen('http://127.0.0.1:{MOTO_PORT}/moto-api/', timeout=1)"
    deadline = time.time() + 60
    while master.run([sys.executable, "-c", ping], env=aws).returncode != 0:
        assert moto.poll() is None and time.time() < deadline, "moto did not start in the master"
        time.sleep(0.3)
    made = master.run([sys.executable, "-c", CREATE_GROUPS], env=aws, timeout=120)
    assert made.returncode == 0, made.stderr
    ips = json.loads(made.stdout)
    _readdress(master, ips["master"][0])
    for host, ip in zip((hosts["worker-1"], hosts["worker-2"]), ips["worker"]):
        _readdress(host, ip)
    for host in hosts:  # each name resolves to its new address, as a node's own name does in the VPC
        host.path("/etc/hosts").write_text(hosts.etc_hosts())

    key_dir = tmp_path / "cluster-key"
    key_dir.mkdir()
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "maskrcnn-EmulatedCluster",
                    "-f", str(key_dir / "id_ed25519")], check=True)
    for host in hosts:
        _install_node(host, role="master" if host is master else "worker", key_dir=key_dir)
        _start_node(host)
    return hosts, efs, aws


@pytest.mark.slow
def test_cluster_checks_trains_and_resumes_after_a_worker_dies(cluster, tmp_path):
    hosts, efs, aws = cluster
    master, worker = hosts["master"], hosts["worker-2"]
    # `cluster-health` on the master: every node discovered through moto, checked over SSH on 2222.
    table = master.run(["bash", str(ENTRYPOINT), "cluster-health"], env=aws, timeout=120)
    assert table.returncode == 0, table.stdout + table.stderr
    rows = {line.split()[0]: line.split() for line in table.stdout.splitlines()[1:-1]}
    assert set(rows) == {h.address for h in hosts}
    assert rows[master.address][1:5] == ["master", "yes", "0/0", "yes"]
    assert all(row[-1] == "ok" for row in rows.values())
    assert table.stdout.splitlines()[-1] == "3 of 3 nodes healthy"

    run = master.popen(["bash", str(ENTRYPOINT), "cluster-train", "--run-name", "emulated", "--restart-wait", "2",
                        "--node-wait", "300", "--max-restarts", "2", *TRAINING],
                       env=aws, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = Output(run, tmp_path / "cluster-train.log")
    logdir = efs / "logs" / "emulated"
    try:
        # Attempt 1 on all three nodes: discovered through the groups, every check passed over SSH.
        out.wait_for(r"3 of 3 nodes healthy", 120)
        out.wait_for(r"attempt 1: 3 node\(s\), 3 rank\(s\)", 30)
        out.wait_for(rf"training on 3 rank\(s\), 2 image\(s\) per rank.*{MAX_STEPS} steps = {EPOCHS} epochs of "
                     rf"{STEPS_PER_EPOCH}", 300)
        # The first epoch's checkpoint is written: kill the worker while the later epochs train.
        deadline = time.time() + 300
        state = logdir / "checkpoint"   # written after the model files: the save is complete
        while not (state.exists() and f"model-{STEPS_PER_EPOCH}" in state.read_text()):
            assert run.poll() is None and time.time() < deadline, out.text()[-5000:]
            time.sleep(0.1)
        assert f"model-{MAX_STEPS}" not in state.read_text()
        worker.stop()
        out.wait_for(r"training failed \(exit \d+\); re-checking nodes", 120)
        out.wait_for(rf"the run trained on 3 ranks, 2 are healthy now: waiting for the cluster to be whole", 120)
        assert re.search(rf"{re.escape(worker.address)}\s+worker\s+NO\s.*unreachable", out.text())
        # The group replaces the instance; the replacement boots as a node (boot script: cluster.env
        # with its PRIVATE_IP, the cluster key; container `cluster-node`).
        others = [h.address for h in hosts if h is not worker]
        new = master.run([sys.executable, "-c", REPLACE_INSTANCE, worker.address, GROUPS["worker"][0], *others],
                         env=aws, timeout=60)
        assert new.returncode == 0, new.stderr
        _readdress(worker, new.stdout.strip())
        for host in hosts:
            host.path("/etc/hosts").write_text(hosts.etc_hosts())
        _install_node(worker, role="worker", key_dir=tmp_path / "cluster-key")
        _start_node(worker)
        assert run.wait(timeout=600) == 0, out.text()[-5000:]
    finally:
        if run.poll() is None:
            run.kill()
        out.thread.join(timeout=10)
    text = out.text()
    assert "attempt 2: 3 node(s), 3 rank(s)" in text
    # Attempt 2 resumed from the first epoch's checkpoint with the same ranks, batch and schedule.
    resumed = re.search(r"training on (\d+) rank\(s\), (\d+) image\(s\) per rank.*?(\d+) steps = "
                        rf"{EPOCHS} epochs of (\d+); LR ([0-9.e-]+); resuming from \S+ at step (\d+)", text)
    first = re.search(r"training on \d+ rank\(s\).*?LR ([0-9.e-]+)", text)
    assert resumed, text[-5000:]
    assert resumed.groups()[:4] == ("3", "2", str(MAX_STEPS), str(STEPS_PER_EPOCH))
    assert resumed.group(5) == first.group(1)
    assert int(resumed.group(6)) == STEPS_PER_EPOCH
    assert re.search(rf"step {MAX_STEPS}/{MAX_STEPS} ", text)
    assert "training finished" in text
    assert (logdir / f"model-{MAX_STEPS}.index").exists() and not (logdir / "eval_results.json").exists()
    assert json.loads((logdir / "config.json").read_text())["TRAIN"]["NUM_GPUS"] == 3
    assert sorted(line.split()[0] for line in (logdir / "hostfile").read_text().splitlines()) == \
        sorted(h.address for h in hosts)
