"""What the emulated EC2 cluster tests share (tests/emulated_hosts.py gives the hosts): the training
settings of a short multi-node run, the auto-scaling groups in the master's moto server, how a host
gets the address moto gave its instance, and the Slurm cluster of three nodes the Slurm tests run on
(the ``slurm_cluster`` fixture, tests/launch/conftest.py) with the helpers that drive it.

The training run: one CPU rank per node, 2 images each: global batch 6; 24 images an epoch = 4 steps;
3 epochs. The claims need a checkpoint before a node is lost (epoch 1's) and steps after the resume,
not many steps. No evaluation (DATA.VAL=()): the claims are about the cluster, and evaluation across
ranks is tested elsewhere (tests/training/test_startup_devices.py, tests/launch/test_sagemaker_multihost.py).
"""
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

from training.configs import cpu_synthetic

REPO = Path(__file__).resolve().parents[2]
VPC_CIDR = "10.0.0.0/16"
SUBNET_CIDR = "10.0.2.0/24"
MOTO_PORT = 5000
GROUPS = {"master": ("emulated-master-asg", 1), "worker": ("emulated-worker-asg", 2)}
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


def host_env(**extra) -> dict[str, str]:
    """What the image's processes see: its Python first on PATH, Keras 2, fake AWS credentials."""
    return {"PATH": f"{Path(sys.executable).parent}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": "/root", "LANG": "C.UTF-8", "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO),
            "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2",
            "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1",
            "AWS_DEFAULT_REGION": "us-east-1", **extra}


def readdress(host, address: str) -> None:
    """Give ``host`` the private IP moto chose for its instance (the hosts exist before moto runs)."""
    for cmd in (["addr", "flush", "dev", "eth0"], ["addr", "add", f"{address}/24", "dev", "eth0"]):
        subprocess.run(["ip", "-n", host.netns, *cmd], check=True, capture_output=True)
    host.address = address



# --- the Slurm cluster ---------------------------------------------------------------------------

ENTRYPOINT = REPO / "docker" / "entrypoint.sh"
RECORDED = REPO / "tests" / "recorded_machines"
RECORDED_TOOLS = ("nvidia-smi", "fi_info", "dcgmi", "dmesg", "all_reduce_perf")
# Run inside the master against its moto.
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
# The jobs' --stop-grace. This model's checkpoint saves in about a second (the default, 90 s, is for
# COCO-sized ones), but the ranks get half the grace (Open MPI's kill delay) to finish their step and
# save, and on these shared, loaded cores a step takes up to ~3 s: with the command's shortest grace
# (10 s, a 5 s delay) a requeued attempt was killed before its checkpoint. A stopped or requeued attempt
# frees its nodes about this long later.
STOP_GRACE = 30
# The cluster's own Slurm settings (custom.conf, docs/launch.md), for nodes that start a job in seconds.
# A requeued job waits cred_expire + 1 s before it may start again; slurm.conf(5): cred_expire "must be
# sufficiently long enough to load user environment, run prolog ... This also controls how long a
# requeued job must wait before starting again" (120 s by default; Slurm takes no less than 5). These
# nodes' prologs (the health checks) take 2-3 s (slurmctld's allocation to slurmd's "Launching batch
# job" in their logs, on these shared cores). The backfill scheduler, which starts the requeued job
# once that wait is over, runs every bf_interval seconds (30 by default, at least 1).
CRED_EXPIRE_S = 10
BF_INTERVAL_S = 1
CUSTOM_CONF = f"# emulated nodes start jobs in seconds\nAuthInfo=cred_expire={CRED_EXPIRE_S}\n" \
              f"SchedulerParameters=bf_interval={BF_INTERVAL_S}\n"

SLURM_DAEMONS = ("/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd")


def missing_slurm() -> str | None:
    """Which of the daemons the nodes start (Debian's munge, slurmctld and slurmd) are not installed, or None."""
    missing = [daemon for daemon in SLURM_DAEMONS if not Path(daemon).exists()]
    return f"{', '.join(missing)} not installed (scripts/install.sh installs them)" if missing else None


class SlurmCluster(NamedTuple):
    """Three emulated nodes running the cluster's Slurm: node-a is the master (slurmctld and the
    moto server), node-b and node-c the workers."""
    hosts: object            # EmulatedHosts
    efs: Path                # the directory every node mounts at /efs
    env: dict[str, str]      # the environment of a process on a node (moto at the master's address)
    munge_key: bytes
    nodes: dict[str, subprocess.Popen]   # each host's `cluster-node` process

    @property
    def master(self):
        return self.hosts["node-a"]


def node_aws_env(master_address: str, **extra) -> dict[str, str]:
    return host_env(AWS_ENDPOINT_URL=f"http://{master_address}:{MOTO_PORT}", **extra)


def install_node(host, *, role: str, instance_id: str, munge_key: bytes, machine: str | None = None) -> None:
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


def start_node(host, env) -> subprocess.Popen:
    """The image's `cluster-node` on ``host``, as the boot script starts it; its output in the host's /tmp."""
    log = open(host.path("/tmp") / "cluster-node.log", "a")
    # The node's GPU tools, if any, first on PATH: the health checks Slurm runs find them there.
    env = {**env, "PATH": f"/etc/maskrcnn/recorded-bin:{env['PATH']}"}
    return host.popen(["bash", str(ENTRYPOINT), "cluster-node"], env=env, stdout=log, stderr=subprocess.STDOUT)


def replace_instance(master, env, hosts, host, *, munge_key: bytes, machine: str | None = None) -> str:
    """The worker group replaces ``host``'s instance (as it does one that failed its health checks):
    moto launches another at a new IP, and ``host`` boots again as that instance. Its instance id."""
    host.stop()
    others = [h.address for h in hosts if h is not host]
    new = master.run([sys.executable, "-c", REPLACE_INSTANCE, host.address, GROUPS["worker"][0], *others],
                     env=env, timeout=60)
    assert new.returncode == 0, new.stderr
    readdress(host, new.stdout.strip())
    for h in hosts:
        h.path("/etc/hosts").write_text(hosts.etc_hosts())
    instance = master.run([sys.executable, "-c", INSTANCE_ID, host.address], env=env, timeout=60)
    assert instance.returncode == 0, instance.stderr
    instance_id = instance.stdout.strip()
    install_node(host, role="worker", instance_id=instance_id, munge_key=munge_key, machine=machine)
    return instance_id


def wait_for(predicate, timeout: float, what: str, poll: float = 0.2):
    """``predicate()``'s first true value, asked every ``poll`` seconds; fails after ``timeout``. The
    default suits a predicate that reads files; one that runs a Slurm command asks every 0.5 s, one
    that runs Python on a host (boto3 against moto, the `job` command) every second."""
    deadline = time.time() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.time() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(poll)


def job(master, env, *args, timeout=60) -> subprocess.CompletedProcess:
    """The image's `job` command (launch/cluster/jobs.py) on the master."""
    return master.run(["bash", str(ENTRYPOINT), "job", *args], env=env, timeout=timeout, cwd=str(REPO))


def runs(master, env) -> dict[str, dict]:
    """`job list --json`, by run name."""
    listed = job(master, env, "list", "--json")
    assert listed.returncode == 0, listed.stderr
    return {r["run"]: r for r in json.loads(listed.stdout)}


def instance_health(master, env, instance_id: str) -> str:
    """The instance's health status in its auto-scaling group (moto's)."""
    out = master.run([sys.executable, "-c", INSTANCE_HEALTH, instance_id], env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def instance_id(host) -> str:
    return re.search(r"^INSTANCE_ID=(\S+)$", host.path("/etc/maskrcnn/cluster.env").read_text(), re.M).group(1)


def slurm_name(host) -> str:
    """The Slurm node name the host's node claimed last."""
    return re.findall(r"this node is Slurm node (\S+)", host.path("/tmp/cluster-node.log").read_text())[-1]


def sinfo(master, env) -> dict[str, str]:
    """Each Slurm node's compact state (sinfo %t: idle, alloc, drain, ...)."""
    out = master.run(["sinfo", "-h", "-N", "-o", "%N %t"], env=env, timeout=30).stdout
    return dict(line.split() for line in out.splitlines() if line.strip())


def sinfo_reasons(master, env) -> dict[str, str]:
    """The reason of each drained or down node, as Slurm keeps it (sinfo -R %E)."""
    out = master.run(["sinfo", "-h", "-R", "-N", "-o", "%N|%E"], env=env, timeout=30).stdout
    return dict(line.split("|", 1) for line in out.splitlines() if "|" in line)


def node_state(master, env, node: str) -> set[str]:
    """The node's state words as scontrol prints them (State=IDLE+DRAIN+CLOUD: IDLE, DRAIN, CLOUD)."""
    out = master.run(["scontrol", "show", "node", "-o", node], env=env, timeout=30).stdout
    found = re.search(r"\bState=(\S+)", out)
    return set(found.group(1).split("+")) if found else set()


def job_fields(master, env, job_id: str) -> dict[str, str]:
    """`scontrol show job -o`'s Key=Value fields of the job (values without spaces: JobState, Restarts,
    Requeue, NodeList, ...); empty once Slurm has forgotten the job."""
    out = master.run(["scontrol", "show", "job", "-o", job_id], env=env, timeout=30).stdout
    return dict(re.findall(r"(?:^|\s)([A-Za-z:]+)=(\S*)", out))


def start_slurm_cluster(emulated_hosts, tmp_path: Path) -> SlurmCluster:
    """Three hosts with the instances moto's groups launched, each running the image's `cluster-node`,
    until Slurm has all three idle (the ``slurm_cluster`` fixture)."""
    efs = tmp_path / "efs"
    from training.data.synthetic import SyntheticSpec, generate
    generate(efs / "data" / "coco", SyntheticSpec(train=12, val=3, size=96, max_object_size=48, seed=5))
    (efs / "logs").mkdir()
    custom = efs / ".maskrcnn" / "EmulatedCluster" / "slurm" / "custom.conf"
    custom.parent.mkdir(parents=True)
    custom.write_text(CUSTOM_CONF)
    hosts = emulated_hosts({"node-a": "10.0.2.201", "node-b": "10.0.2.202", "node-c": "10.0.2.203"},
                           private=["/etc/maskrcnn", "/etc/slurm"], shared={"/efs": efs})
    master = hosts["node-a"]
    moto = master.popen([sys.executable, "-m", "moto.server", "-H", "0.0.0.0", "-p", str(MOTO_PORT)],
                        env=host_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    local = host_env(AWS_ENDPOINT_URL=f"http://127.0.0.1:{MOTO_PORT}")
    ping = f"import urllib.request; urllib.request.urlopen('http://127.0.0.1:{MOTO_PORT}/moto-api/', timeout=1)"
    wait_for(lambda: moto.poll() is None and master.run([sys.executable, "-c", ping], env=local).returncode == 0,
             60, "moto in the master", poll=0.5)
    made = master.run([sys.executable, "-c", CREATE_GROUPS], env=local, timeout=120)
    assert made.returncode == 0, made.stderr
    ips = json.loads(made.stdout)
    readdress(master, ips["master"][0])
    for host, ip in zip((hosts["node-b"], hosts["node-c"]), ips["worker"]):
        readdress(host, ip)
    for host in hosts:
        host.path("/etc/hosts").write_text(hosts.etc_hosts())
    env = node_aws_env(master.address)
    munge_key = os.urandom(64)
    for host in hosts:
        instance = master.run([sys.executable, "-c", INSTANCE_ID, host.address], env=env, timeout=60)
        assert instance.returncode == 0, instance.stderr
        install_node(host, role="master" if host is master else "worker", instance_id=instance.stdout.strip(),
                     munge_key=munge_key)
    nodes = {host.name: start_node(host, env) for host in hosts}
    wait_for(lambda: sorted(sinfo(master, env).items()) == [("master", "idle"), ("worker-1", "idle"),
                                                            ("worker-2", "idle")], 90, "three idle Slurm nodes", poll=0.5)
    config = master.run(["scontrol", "show", "config"], env=env, timeout=30).stdout
    assert re.search(rf"^AuthInfo\s*=\s*cred_expire={CRED_EXPIRE_S}$", config, re.M), config
    assert re.search(rf"^SchedulerParameters\s*=\s*nohold_on_prolog_fail,bf_interval={BF_INTERVAL_S}$",
                     config, re.M), config
    return SlurmCluster(hosts, efs, env, munge_key, nodes)
