"""Node health checks (launch/cluster/node_health.py) run for real: the program as a subprocess, with
the stand-ins of tests/recorded_machines first on PATH (nvidia-smi, fi_info, dcgmi, dmesg and
all_reduce_perf replay p4d.24xlarge outputs reconstructed from published ones, and the unedited
outputs of a real machine with one H200), a compiled stand-in of the NCCL plugin on the
loader path, real mounts (a hung FUSE mount, a full tmpfs), the real scontrol with no controller to
reach, and moto for the auto-scaling group and the alerts topic (read back through an SQS
subscription).

Expected values are AWS's documented numbers and what the captured outputs say, not the code's:
p4d.24xlarge has 8 NVIDIA A100 GPUs and 4 network cards with EFA (AWS's accelerated computing
instance specifications; "Maximize network bandwidth": one EFA interface per card).
"""
import ctypes
import http.server
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import boto3
import pytest

from aws_fakes import free_port, node_groups
from emulated_cluster import wait_for
from launch.cluster import all_reduce, node_checks, node_health
from machine import require

REPO = Path(__file__).resolve().parents[2]
RECORDED = REPO / "tests" / "recorded_machines"
STANDINS = RECORDED / "bin"
PROGRAMS = ("nvidia-smi", "fi_info", "dcgmi", "dmesg", "all_reduce_perf")

P4D = "p4d.24xlarge"
P4D_GPUS = 8
P4D_EFA_DEVICES = 4
# The published 2-node p4d.24xlarge run of all_reduce_perf -b 8 -e 1G -f 2 -g 1 (aws-samples/aws-efa-eks).
P4D_PUBLISHED_AVG_BUSBW = 7.80081
NODE_NAME = "worker-1"
# The real machine: one H200, no EFA (tests/recorded_machines/h200-1gpu/README.md).
H200 = RECORDED / "h200-1gpu"
# An AWS type with H200 GPUs: p5en.48xlarge, 8 H200 and 16 EFA cards (AWS's accelerated computing specs).
H200_TYPE = "p5en.48xlarge"
H200_TYPE_GPUS = 8


# --- fixtures -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def nccl_plugin(tmp_path_factory) -> Path:
    """A directory holding the stand-in libnccl-net.so, compiled from tests/recorded_machines."""
    cc = shutil.which("cc")
    require(None if cc else "no C compiler (cc) to build the stand-in NCCL plugin")
    directory = tmp_path_factory.mktemp("nccl-plugin")
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(directory / "libnccl-net.so"),
                    str(RECORDED / "libnccl-net-stub.c")], check=True)
    return directory


def bin_dir(tmp_path: Path, programs=PROGRAMS) -> Path:
    """A PATH directory with the chosen stand-ins (a program left out is not installed)."""
    directory = tmp_path / "bin"
    directory.mkdir(parents=True, exist_ok=True)
    for name in programs:
        (directory / name).symlink_to(STANDINS / name)
    return directory


class Node:
    """This machine as one p4d.24xlarge cluster node: its cluster.env, its instance in a moto
    auto-scaling group, the alerts topic with a queue subscribed to it."""

    def __init__(self, tmp_path: Path, nccl_plugin: Path):
        self.tmp = tmp_path
        self.session = boto3.session.Session(region_name="us-east-1")
        node_groups(self.session, {"worker-asg": (0, 1, 1)})
        group = self.session.client("autoscaling").describe_auto_scaling_groups()["AutoScalingGroups"][0]
        self.instance_id = group["Instances"][0]["InstanceId"]
        sns, sqs = self.session.client("sns"), self.session.client("sqs")
        self.topic = sns.create_topic(Name="maskrcnn-alerts")["TopicArn"]
        self.queue = sqs.create_queue(QueueName="alerts")["QueueUrl"]
        queue_arn = sqs.get_queue_attributes(QueueUrl=self.queue, AttributeNames=["QueueArn"])
        sns.subscribe(TopicArn=self.topic, Protocol="sqs", Endpoint=queue_arn["Attributes"]["QueueArn"])
        self.efs = tmp_path / "efs"
        self.efs.mkdir()
        self.cluster_env = {
            "AWS_REGION": "us-east-1", "STACK_NAME": "maskrcnn-test", "INSTANCE_TYPE": P4D,
            "INSTANCE_ID": self.instance_id, "PRIVATE_IP": "10.0.1.23", "EFS_MOUNT": str(self.efs),
            "ALERTS_TOPIC_ARN": self.topic,
            # This machine's root file system stands in for the node's; the floor stays below its
            # free space (the low-disk test uses a disk of its own).
            node_health.MIN_FREE_KEY: "1",
            node_health.FS_TIMEOUT_KEY: "20",
        }
        # scontrol with a controller nobody answers: it fails within about a second.
        self.slurm_conf = tmp_path / "slurm.conf"
        self.slurm_conf.write_text(f"ClusterName=test\nSlurmctldHost=localhost(127.0.0.1)\n"
                                   f"SlurmctldPort={free_port()}\nMessageTimeout=2\n"
                                   f"NodeName={NODE_NAME} CPUs=1 State=UNKNOWN\n"
                                   f"PartitionName=train Nodes={NODE_NAME} Default=YES\n")
        self.env = {**os.environ, "LD_LIBRARY_PATH": str(nccl_plugin), "SLURM_CONF": str(self.slurm_conf),
                    "SLURMD_NODENAME": NODE_NAME,
                    # No test may reach the real instance-metadata address.
                    "AWS_EC2_METADATA_DISABLED": "true"}

    def run(self, scenario: str, *args: str, cluster_env: dict | None = None, env: dict | None = None,
            programs=PROGRAMS, timeout: float = 120) -> subprocess.CompletedProcess:
        values = {**self.cluster_env, **(cluster_env or {})}
        env_file = self.tmp / "cluster.env"
        env_file.write_text("".join(f"{k}={v}\n" for k, v in values.items() if v is not None))
        bins = bin_dir(self.tmp / f"bin-{len(list(self.tmp.glob('bin-*')))}", programs)
        path = f"{bins}:{Path(sys.executable).parent}:{os.environ['PATH']}"
        return subprocess.run(
            [sys.executable, "-m", "launch.cluster.node_health", *args, "--cluster-env", str(env_file),
             "--state-file", str(self.tmp / "run" / "node-health-alerted")],
            cwd=REPO, capture_output=True, text=True, timeout=timeout,
            env={**self.env, "PATH": path, "RECORDED_MACHINE": scenario, **(env or {})})

    def health(self) -> str:
        found = self.session.client("autoscaling").describe_auto_scaling_instances(
            InstanceIds=[self.instance_id])["AutoScalingInstances"]
        return found[0]["HealthStatus"]

    def alerts(self) -> list[dict]:
        """The alerts published since the last call (each read once)."""
        sqs = self.session.client("sqs")
        messages = sqs.receive_message(QueueUrl=self.queue, MaxNumberOfMessages=10).get("Messages", [])
        for m in messages:
            sqs.delete_message(QueueUrl=self.queue, ReceiptHandle=m["ReceiptHandle"])
        return [json.loads(m["Body"]) for m in messages]


def reason_line(proc: subprocess.CompletedProcess) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.startswith("unhealthy: ")]
    assert len(lines) == 1, proc.stdout + proc.stderr
    return lines[0]


@pytest.fixture
def node(aws_env, tmp_path, nccl_plugin) -> Node:
    return Node(tmp_path, nccl_plugin)


def _mount_requirements() -> str | None:
    if os.geteuid() != 0:
        return "mounting a file system needs root"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse for a FUSE mount"
    return None


@pytest.fixture
def hung_mount(tmp_path):
    """A FUSE mount whose server never answers: every stat or open on it blocks, as on an NFS mount
    whose server is gone. Unmounted afterwards, also on failure."""
    require(_mount_requirements())
    point = tmp_path / "hung"
    point.mkdir()
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open("/dev/fuse", os.O_RDWR)
    options = f"fd={fd},rootmode=40000,user_id=0,group_id=0".encode()
    if libc.mount(b"hung-test", str(point).encode(), b"fuse", 0, options) != 0:
        os.close(fd)
        require(f"FUSE mount refused here (errno {ctypes.get_errno()})")
    try:
        yield point
    finally:
        os.close(fd)  # aborts the connection: whatever still waits on the mount gets an error
        subprocess.run(["umount", "-l", str(point)], check=False)


@pytest.fixture
def full_disk(tmp_path):
    """A 16 MiB tmpfs with 15 MiB of it used: a local disk that is nearly full."""
    require(None if os.geteuid() == 0 else "mounting a file system needs root")
    point = tmp_path / "nvme"
    point.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(point)], check=True)
    try:
        (point / "dataset").write_bytes(b"\0" * (15 * 2**20))
        yield point
    finally:
        subprocess.run(["umount", "-l", str(point)], check=False)


# --- the program, scenario by scenario ------------------------------------------------------------

def test_healthy_p4d_passes_every_check(node):
    proc = node.run("p4d-healthy", "--prolog", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert [c["name"] for c in report["checks"]] == list(node_health.CHECKS)
    assert {c["name"]: c["status"] for c in report["checks"]} == {name: "ok" for name in node_health.CHECKS}
    details = {c["name"]: c["detail"] for c in report["checks"]}
    assert details["gpu-count"] == f"{P4D_GPUS} of {P4D_GPUS} GPUs visible"
    assert details["efa"].startswith(f"{P4D_EFA_DEVICES} of {P4D_EFA_DEVICES} EFA devices")
    assert "application Xids seen: 31" in details["xid"]  # an application's Xid leaves the node healthy
    assert (report["healthy"], report["actions"]) == (True, [])
    assert node.health() == "Healthy"
    assert node.alerts() == []
    assert list((node.efs / node_checks.MARKER_DIR).iterdir()) == []  # the marker is cleaned up


# scenario, the check that must fail, what its detail must say, a line of the recorded output the
# alert must carry.
FAILURES = [
    ("p4d-missing-gpu", "gpu-count", f"{P4D_GPUS - 1} of {P4D_GPUS} GPUs visible",
     "GPU 6: NVIDIA A100-SXM4-40GB"),
    ("p4d-xid79", "xid", "Xid 79 (GPU has fallen off the bus) on PCI:0000:a0:1d",
     "GPU has fallen off the bus."),
    ("p4d-efa-down", "efa", f"{P4D_EFA_DEVICES - 1} of {P4D_EFA_DEVICES} EFA devices",
     "domain: rdmap144s27-rdm"),
    ("p4d-ecc-uncorrectable", "gpu-health",
     "GPU 2 (00000000:20:1C.0): 1 uncorrectable ECC error since the driver loaded", "00000000:20:1C.0, Yes, No"),
    ("p4d-dcgm-fail", "dcgm", "Inforom: Fail (A corrupt InfoROM has been detected in GPU 5.)",
     "| Inforom                   | Fail"),
]


@pytest.mark.parametrize("scenario,check,detail,recorded", FAILURES, ids=[f[0] for f in FAILURES])
def test_failure_is_named_replaced_and_alerted(node, scenario, check, detail, recorded):
    proc = node.run(scenario, "--prolog")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    line = reason_line(proc)
    assert f"{check}: {detail}" in line
    assert node.health() == "Unhealthy"
    [alert] = node.alerts()
    assert alert["Subject"].startswith(f"maskrcnn-test: node {NODE_NAME} unhealthy (") and check in alert["Subject"]
    message = alert["Message"]
    for expected in (NODE_NAME, node.instance_id, P4D, "10.0.1.23", f"{check}: {detail}",
                     "Slurm drains the node and requeues the job", f"Output of {check}", recorded,
                     f"marked {node.instance_id} Unhealthy"):
        assert expected in message, (expected, message)


def test_missing_mount(node):
    proc = node.run("p4d-healthy", "--prolog", cluster_env={"EFS_MOUNT": str(node.tmp / "no-efs-here")})
    assert proc.returncode == 1
    assert "shared-fs: " in reason_line(proc)
    assert "is not a directory: the file system is not mounted here" in reason_line(proc)
    assert node.health() == "Unhealthy"
    assert "shared-fs" in node.alerts()[0]["Subject"]


def test_hung_mount_is_reported_not_waited_on(node, hung_mount):
    # node.run's time limit is the backstop against a hang; the reason shows the mechanism: the probe
    # of the mount was given up at its 2 s limit, twice (the retry of a stall), not waited on.
    proc = node.run("p4d-healthy", "--prolog",
                    cluster_env={"EFS_MOUNT": str(hung_mount), node_health.FS_TIMEOUT_KEY: "2"})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert (f"shared-fs: {hung_mount}: no answer within 2 s (hung mount); again on a retry: {hung_mount}: no "
            f"answer within 2 s (hung mount)") in reason_line(proc)
    assert node.health() == "Unhealthy"
    assert "shared-fs" in node.alerts()[0]["Subject"]


def test_checks_share_a_time_budget(hung_mount):
    # Slurm kills a HealthCheckProgram after 60 s: a slow mount may not take the drain's time.
    cfg = node_health.NodeConfig(node_name="worker-1", instance_id=None, instance_type="c5.xlarge",
                                 expected_gpus=0, expected_efa=0, efs_mount=str(hung_mount),
                                 fs_timeout=100, min_free_gib=0)
    started = time.monotonic()
    results = {r.name: r for r in node_health.run_checks(cfg, budget_s=2)}
    assert time.monotonic() - started < 120   # a backstop against a hang only: the limits below are the check
    # The stall is tried once more, with what is left of the budget, before the check fails. Each
    # try's limit is its share of the 2 s budget (at least 1 s), never the mount's own 100 s.
    detail = results["shared-fs"].detail
    limits = [float(s) for s in re.findall(rf"{re.escape(str(hung_mount))}: no answer within (\d+) s", detail)]
    assert len(limits) == 2 and "; again on a retry: " in detail, detail
    assert all(1 <= limit <= 2 for limit in limits), detail


def test_low_disk(node, full_disk):
    proc = node.run("p4d-healthy", "--prolog",
                    cluster_env={"LOCAL_NVME": str(full_disk), node_health.MIN_FREE_KEY: "0.01"})
    assert proc.returncode == 1
    line = reason_line(proc)
    assert f"disk: {full_disk}: " in line and "below the floor of 0.01 GiB" in line
    assert "/: " not in line.split("disk: ", 1)[1]  # the root file system has room
    assert node.health() == "Unhealthy"
    assert "disk" in node.alerts()[0]["Subject"]


def _all_reduce_output(node: Node, scenario: str) -> Path:
    """Runs the stand-in all_reduce_perf with the sweep all_reduce_argv gives it; saves its output."""
    argv = all_reduce.all_reduce_argv(str(STANDINS / "all_reduce_perf"), nodes=2, gpus_per_node=P4D_GPUS,
                                      instance_type=P4D, efa=True)
    test = argv[argv.index(str(STANDINS / "all_reduce_perf")):]
    run = subprocess.run(test, capture_output=True, text=True, check=True,
                         env={**os.environ, "RECORDED_MACHINE": scenario})
    out = node.tmp / f"{scenario}-all-reduce.txt"
    out.write_text(run.stdout)
    return out


def test_low_bus_bandwidth(node):
    out = _all_reduce_output(node, "p4d-low-busbw")
    proc = node.run("p4d-low-busbw", "all-reduce", "--output", str(out), "--instance-type", P4D,
                    "--health-check")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    line = reason_line(proc)
    assert line.startswith("unhealthy: all-reduce: avg bus bandwidth 1.46685 GB/s is below the floor")
    assert "NCCL used TCP sockets, not EFA" in line
    # No controller answers here: whether a job holds the node is unknown, so it stays.
    assert node.health() == "Healthy"
    [alert] = node.alerts()
    assert "all-reduce" in alert["Subject"] and "not replaced while it may hold a job" in alert["Message"]
    assert "Using network Socket" in alert["Message"] and "# Avg bus bandwidth    : 1.46685" in alert["Message"]


def test_healthy_bus_bandwidth(node):
    out = _all_reduce_output(node, "p4d-healthy")
    proc = node.run("p4d-healthy", "all-reduce", "--output", str(out), "--instance-type", P4D,
                    "--health-check", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [check] = json.loads(proc.stdout)["checks"]
    assert check["status"] == "ok" and check["detail"].startswith("avg bus bandwidth 7.80083 GB/s")
    assert node.health() == "Healthy"
    assert node.alerts() == []


def test_sockets_bus_bandwidth_on_a_cluster_deployed_without_efa(node):
    """A p4d cluster deployed with efa=false (EFA_INTERFACES=0 in cluster.env) runs NCCL over TCP
    sockets by design: the sockets run is judged on finishing with correct values, not against
    the EFA floor, and the node stays in service."""
    out = _all_reduce_output(node, "p4d-low-busbw")
    proc = node.run("p4d-low-busbw", "all-reduce", "--output", str(out), "--health-check", "--json",
                    cluster_env={"EFA_INTERFACES": "0"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [check] = json.loads(proc.stdout)["checks"]
    assert (check["status"], check["detail"]) == (
        "ok", "avg bus bandwidth 1.46685 GB/s (no floor over TCP sockets)")
    assert node.health() == "Healthy"
    assert node.alerts() == []


@pytest.mark.parametrize("efa_interfaces", [None, "0"], ids=["efa", "sockets"])
def test_a_single_rank_all_reduce_is_not_blamed_on_the_fabric(node, efa_interfaces):
    """The real single-GPU run (h200-1gpu): nccl-tests prints `# Avg bus bandwidth    : 0 ` for one
    rank, whose bus bandwidth is 0 by definition (busbw = algbw x 2(n-1)/n), and NCCL, with no
    network plugin there, names the Socket transport although nothing crossed a network. Neither
    says anything about a fabric: the output is refused as input, with no drain, replacement or alert."""
    out = _all_reduce_output(node, "h200-1gpu")
    assert out.read_bytes() == (H200 / "all_reduce_perf.txt").read_bytes()
    proc = node.run("h200-1gpu", "all-reduce", "--output", str(out), "--instance-type", H200_TYPE,
                    "--health-check", cluster_env={node_health.EFA_INTERFACES_KEY: efa_interfaces})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "1 rank" in proc.stderr and "0 by definition" in proc.stderr, proc.stderr
    assert "below the floor" not in proc.stderr + proc.stdout
    assert "TCP sockets" not in proc.stderr + proc.stdout
    assert node.health() == "Healthy"
    assert node.alerts() == []


def test_health_check_mode_keeps_a_node_whose_slurm_state_is_unknown(node):
    require(None if shutil.which("scontrol") else "scontrol not installed (Debian package slurm-client)")
    proc = node.run("p4d-xid79", "--health-check")
    assert proc.returncode == 1
    # No controller answers here: the drain is attempted and its failure reported; whether a job
    # runs on the node cannot be read, so the node is not taken from a job that may be running.
    assert f"FAILED  could not drain {NODE_NAME} in Slurm: " in proc.stdout
    assert "Unable to contact slurm controller" in proc.stdout
    assert f"could not read {NODE_NAME}'s state in Slurm" in proc.stdout
    assert node.health() == "Healthy"
    message = node.alerts()[0]["Message"]
    assert f"could not drain {NODE_NAME} in Slurm" in message and "not replaced while it may hold a job" in message


@pytest.mark.parametrize("how", ["cluster.env", "flag"])
def test_replacement_can_be_turned_off(node, how):
    if how == "cluster.env":
        proc = node.run("p4d-xid79", "--prolog", cluster_env={node_health.REPLACE_KEY: "false"})
    else:
        proc = node.run("p4d-xid79", "--prolog", "--no-replace")
    assert proc.returncode == 1
    assert node.health() == "Healthy"
    assert "not replaced: replacement is off" in node.alerts()[0]["Message"]


def test_a_persisting_failure_is_alerted_once(node):
    first = node.run("p4d-efa-down", "--prolog", "--no-replace")
    again = node.run("p4d-efa-down", "--prolog", "--no-replace")
    assert (first.returncode, again.returncode) == (1, 1)
    assert "no new alert: one was sent for efa already" in again.stdout
    assert len(node.alerts()) == 1
    assert node.run("p4d-healthy", "--prolog").returncode == 0  # healthy again: the next failure alerts
    node.run("p4d-efa-down", "--prolog", "--no-replace")
    assert len(node.alerts()) == 1


def test_without_a_mode_nothing_is_done(node):
    proc = node.run("p4d-xid79")
    assert proc.returncode == 1
    assert "xid: Xid 79" in reason_line(proc)
    assert node.health() == "Healthy"
    assert node.alerts() == []


def test_cpu_instance_type_needs_no_gpu_tools(node):
    proc = node.run("p4d-healthy", "--prolog", "--json", programs=(),
                    cluster_env={"INSTANCE_TYPE": "c5.xlarge"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    status = {c["name"]: (c["status"], c["detail"]) for c in json.loads(proc.stdout)["checks"]}
    assert status["gpu-count"] == ("ok", "0 GPUs expected (CPU instance type): nvidia-smi not run")
    assert {status[n][0] for n in ("gpu-health", "xid", "dcgm", "efa", "nccl-plugin")} == {"skip"}


def test_efa_interfaces_of_the_deployment_win_over_the_type(node):
    # A stack deployed with efa=false launches p4d without EFA interfaces: nothing to count then.
    proc = node.run("p4d-efa-down", "--json", cluster_env={node_health.EFA_INTERFACES_KEY: "0"})
    checks = {c["name"]: c["status"] for c in json.loads(proc.stdout)["checks"]}
    assert (proc.returncode, checks["efa"], checks["nccl-plugin"]) == (0, "skip", "skip")


@pytest.fixture
def imds(node):
    """An IMDSv2 stand-in on 127.0.0.1 answering this node's instance id and type, token required."""
    token = "test-token"
    values = {"instance-id": node.instance_id, "instance-type": P4D}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_PUT(self):
            ok = self.path == "/latest/api/token" and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
            self._answer(200 if ok else 400, token if ok else "")

        def do_GET(self):
            key = self.path.removeprefix("/latest/meta-data/")
            if self.headers.get("X-aws-ec2-metadata-token") != token:
                self._answer(401, "")
            else:
                self._answer(200, values[key]) if key in values else self._answer(404, "")

        def _answer(self, status, body):
            self.send_response(status)
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_instance_from_metadata_when_cluster_env_lacks_it(node, imds):
    proc = node.run("p4d-xid79", "--prolog", "--json",
                    cluster_env={"INSTANCE_ID": None, "INSTANCE_TYPE": None},
                    env={"AWS_EC2_METADATA_DISABLED": "false", "AWS_EC2_METADATA_SERVICE_ENDPOINT": imds})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert (report["instance_type"], report["instance_id"]) == (P4D, node.instance_id)
    assert node.health() == "Unhealthy"


@pytest.mark.parametrize("args,cluster_env,says", [
    ((), {"INSTANCE_TYPE": "p9.huge"}, "p9.huge is not in infra/instance_types.py"),
    ((), {node_health.REPLACE_KEY: "maybe"}, "NODE_HEALTH_REPLACE=maybe in cluster.env: use true or false"),
    ((), {node_health.MIN_FREE_KEY: "lots"}, "NODE_HEALTH_MIN_FREE_GIB=lots in cluster.env"),
    (("all-reduce", "--output", "/nonexistent/out.txt", "--instance-type", P4D), {}, "cannot read --output"),
])
def test_bad_input_is_named(node, args, cluster_env, says):
    proc = node.run("p4d-healthy", *args, cluster_env=cluster_env)
    assert proc.returncode == 2
    assert says in proc.stderr


def test_all_reduce_without_a_floor_asks_for_one(node):
    out = _all_reduce_output(node, "p4d-healthy")
    proc = node.run("p4d-healthy", "all-reduce", "--output", str(out), "--instance-type", "g5.12xlarge")
    assert proc.returncode == 2 and "pass --min-busbw" in proc.stderr
    proc = node.run("p4d-healthy", "all-reduce", "--output", str(out), "--instance-type", "g5.12xlarge",
                    "--min-busbw", "5")
    assert proc.returncode == 0, proc.stderr


def test_missing_cluster_env_is_named(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "launch.cluster.node_health", "--cluster-env",
                           str(tmp_path / "cluster.env")], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 2 and "cluster.env not found" in proc.stderr


# --- failure actions and names --------------------------------------------------------------------

def test_drain_argv():
    argv = node_health.drain_argv("worker-3", "xid: Xid 79 (GPU has fallen off the bus) on PCI:0000:a0:1d")
    assert Path(argv[0]).name == "scontrol"
    assert argv[1:] == ["update", "NodeName=worker-3", "State=DRAIN",
                        "Reason=xid: Xid 79 (GPU has fallen off the bus) on PCI:0000:a0:1d"]
    long = node_health.drain_argv("worker-3", "disk: " + "x" * 500)[-1]
    assert len(long.removeprefix("Reason=")) == 200 and long.startswith("Reason=disk: ")


def test_slurm_node_name(monkeypatch):
    monkeypatch.setenv("SLURMD_NODENAME", "worker-7")
    assert node_health.slurm_node_name("master") == "master"
    assert node_health.slurm_node_name() == "worker-7"
    monkeypatch.delenv("SLURMD_NODENAME")
    assert node_health.slurm_node_name() == socket.gethostname().split(".")[0]


# --- the checks and parsers on their own ----------------------------------------------------------

def test_parse_all_reduce_perf():
    healthy = (RECORDED / "p4d-healthy" / "all_reduce_perf.txt").read_text()
    assert all_reduce.parse_all_reduce_perf(healthy) == 7.80083
    # mpirun --tag-output prefixes each line; the published run's last lines:
    tagged = "[1,0]<stdout>:# Out of bounds values : 0 OK\n[1,0]<stdout>:# Avg bus bandwidth    : 7.80081 \n"
    assert all_reduce.parse_all_reduce_perf(tagged) == P4D_PUBLISHED_AVG_BUSBW
    assert all_reduce.parse_out_of_bounds(tagged) == 0
    with pytest.raises(all_reduce.AllReduceOutputError, match="did not finish"):
        all_reduce.parse_all_reduce_perf(healthy.split("# Out of bounds")[0])


def test_a_single_rank_output_is_judged_as_one_rank():
    text = (H200 / "all_reduce_perf.txt").read_text()
    # What the capture says: one rank under "# Using devices", "# Avg bus bandwidth    : 0 ", no wrong
    # values, "Using network Socket".
    assert all_reduce.parse_ranks(text) == 1
    assert all_reduce.parse_all_reduce_perf(text) == 0.0
    assert all_reduce.parse_out_of_bounds(text) == 0
    assert all_reduce.parse_networks(text) == {"Socket"}
    assert all_reduce.parse_ranks((RECORDED / "p4d-healthy" / "all_reduce_perf.txt").read_text()) == 16
    # Older nccl-tests list ranks without a group (a published 2-rank broadcast_perf, NVIDIA/nccl-tests
    # issue 82).
    assert all_reduce.parse_ranks("#   Rank  0 Pid  14926 on v100-gpu-1 device  0 [0x00] Tesla V100-PCIE-16GB\n"
                                  "#   Rank  1 Pid   9210 on v100-gpu-5 device  0 [0x00] Tesla V100-PCIE-16GB\n") == 2
    for floor, efa in ((all_reduce.BUSBW_FLOORS[H200_TYPE].gbps, True), (None, False)):
        verdict = all_reduce.judge_all_reduce(text, floor_gbps=floor, efa=efa)
        assert (verdict.ok, verdict.fabric_judged) == (False, False)
        [problem] = verdict.problems
        assert problem.startswith("1 rank: ") and "0 by definition" in problem


def test_wrong_values_fail_the_all_reduce_whatever_the_bandwidth():
    text = "# Out of bounds values : 3 FAILED\n# Avg bus bandwidth    : 40.5 \n"
    verdict = all_reduce.judge_all_reduce(text, floor_gbps=5.8, efa=True)
    assert not verdict.ok and verdict.problems == ("3 wrong values (# Out of bounds values)",)


def test_p4d_floor_is_conservative():
    floor = all_reduce.BUSBW_FLOORS[P4D].gbps
    assert 0.5 * P4D_PUBLISHED_AVG_BUSBW <= floor <= 0.8 * P4D_PUBLISHED_AVG_BUSBW


def test_all_reduce_argv():
    sweep = ["/opt/nccl-tests/build/all_reduce_perf", "-b", "8", "-e", "1G", "-f", "2", "-g", "1"]
    mpirun = all_reduce.all_reduce_argv(sweep[0], nodes=2, gpus_per_node=8, instance_type=P4D, efa=True)
    assert mpirun[0] == "mpirun" and mpirun[-len(sweep):] == sweep
    assert mpirun[mpirun.index("-np") + 1] == "16"
    assert "FI_PROVIDER=efa" in mpirun and "NCCL_DEBUG=INFO" in mpirun and "NCCL_DEBUG=WARN" not in mpirun
    srun = all_reduce.all_reduce_argv(sweep[0], nodes=2, gpus_per_node=8, instance_type=P4D, efa=True,
                                      launcher="srun")
    assert srun[:6] == ["srun", "--nodes=2", "--ntasks=16", "--ntasks-per-node=8", "--mpi=pmix", "env"]
    assert "NCCL_SOCKET_IFNAME=^docker0,lo" in srun and srun[-len(sweep):] == sweep
    with pytest.raises(ValueError, match="use 'mpirun' or 'srun'"):
        all_reduce.all_reduce_argv(sweep[0], nodes=2, gpus_per_node=8, instance_type=P4D, efa=True,
                                   launcher="ssh")


def test_parse_fi_info_counts_devices_once():
    # libfabric 2 lists each device under the efa-direct and efa fabrics, plus its datagram endpoint
    # (a published fi_info -p efa of a one-device instance).
    text = ("provider: efa\n    fabric: efa-direct\n    domain: rdmap47s0-rdm\n    version: 201.0\n"
            "    type: FI_EP_RDM\n    protocol: FI_PROTO_EFA\n"
            "provider: efa\n    fabric: efa\n    domain: rdmap47s0-rdm\n    version: 201.0\n"
            "    type: FI_EP_RDM\n    protocol: FI_PROTO_EFA\n"
            "provider: efa\n    fabric: efa\n    domain: rdmap47s0-dgrm\n    version: 201.0\n"
            "    type: FI_EP_DGRAM\n    protocol: FI_PROTO_EFA\n")
    assert node_checks.parse_fi_info(text) == ["rdmap47s0"]


def test_gpu_problems_read_numeric_flags():
    # Some drivers print the remapping flags as 1/0 instead of Yes/No.
    gpus = node_checks.parse_query_csv("0, 00000000:10:1C.0, 0, [N/A]\n", node_checks.GPU_QUERY)
    remaps = node_checks.parse_query_csv("00000000:10:1C.0, 0, 1\n", node_checks.REMAP_QUERY)
    assert node_checks.gpu_problems(gpus, remaps) == ["GPU 0 (00000000:10:1C.0): row remapping failed"]
    v100 = node_checks.parse_query_csv("3, 00000000:1A:00.0, 0, Yes\n", node_checks.GPU_QUERY)
    assert node_checks.gpu_problems(v100, []) == [
        "GPU 3 (00000000:1A:00.0): pages pending retirement (needs a reboot)"]


def test_parse_xids_of_both_driver_formats():
    log = ("[  269.517039] NVRM: Xid (0000:01:00): 3, C 00000005 SC 00000007 M 00001ffc Data ffffffff\n"
           "NVRM: Xid (PCI:0000:c6:00): 79, pid=1101234, name=nvc:[driver], GPU has fallen off the bus.\n")
    assert node_checks.parse_xids(log) == [
        node_checks.XidEvent(3, "0000:01:00", "C 00000005 SC 00000007 M 00001ffc Data ffffffff"),
        node_checks.XidEvent(79, "0000:c6:00", "pid=1101234, name=nvc:[driver], GPU has fallen off the bus.")]


def test_parse_xids_of_the_published_xid_79_forms():
    # Published kernel logs: drivers 525.125.06 and 550.90.07 name the process (unknown here); 580 and
    # 595 leave it out (NVIDIA/open-gpu-kernel-modules issue 1151).
    log = ("[ 4254.197860] NVRM: Xid (PCI:0000:5d:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off "
           "the bus.\n"
           "NVRM: Xid (PCI:0000:06:00): 79, GPU has fallen off the bus.\n")
    assert [(e.xid, e.pci) for e in node_checks.parse_xids(log)] == [(79, "0000:5d:00"), (79, "0000:06:00")]


def test_parse_dcgm_diag_with_wrapped_rows():
    # dcgmi diag -r 2 on a node with a bad GPU 0 (stas00/ml-engineering, debug.md).
    text = """\
| GPU Memory                | Pass - GPUs: 1, 2, 3, 4, 5, 6, 7               |
|                           | Fail - GPU: 0                                  |
| Warning                   | GPU 0 Thermal violations totaling 13.3 second  |
|                           | s started at 9.7 seconds into the test for GP  |
|                           | U 0                                            |
| PCIe                      | Pass - All                                     |
"""
    tests = node_checks.parse_dcgm_diag(text)
    assert [(t.name, t.result) for t in tests] == [("GPU Memory", "fail"), ("PCIe", "pass")]
    assert tests[0].notes == ["GPU 0 Thermal violations totaling 13.3 seconds started at 9.7 seconds "
                              "into the test for GPU 0"]


def _only_standins(monkeypatch, tmp_path, programs, scenario="p4d-healthy"):
    """PATH with just the chosen stand-ins and Python (no journalctl, dcgmi or scontrol of this machine)."""
    monkeypatch.setenv("PATH", f"{bin_dir(tmp_path, programs)}:{Path(sys.executable).parent}")
    monkeypatch.setenv("RECORDED_MACHINE", scenario)


def test_unreadable_kernel_log_skips_the_xid_check_and_says_why(monkeypatch, tmp_path):
    _only_standins(monkeypatch, tmp_path, ["dmesg"], scenario="p4d-no-syslog")
    outcome = node_checks.check_xid(expected_gpus=P4D_GPUS, timeout=30)
    assert outcome.skipped and outcome.ok
    assert "dmesg: read kernel buffer failed: Operation not permitted" in outcome.detail
    assert "--cap-add SYSLOG" in outcome.detail


def test_the_h200_capture_passes_the_checks_of_a_one_gpu_node(monkeypatch, tmp_path):
    """The real H200 machine's outputs, replayed for the commands the checks run: `nvidia-smi -L`
    lists one GPU; its uncorrectable ECC count is 0 and retired pages `[N/A]` (Hopper remaps rows
    instead), remapping pending and failure `No, No`; the kernel log's NVRM lines hold no Xid. The
    machine has no EFA, and neither dcgmi nor fi_info was captured there: those checks do not run."""
    _only_standins(monkeypatch, tmp_path, ["nvidia-smi", "dmesg"], scenario="h200-1gpu")
    cfg = node_health.NodeConfig(node_name="vm", instance_id=None, instance_type="one H200, no EFA",
                                 expected_gpus=1, expected_efa=0, efs_mount=str(tmp_path), min_free_gib=0)
    results = {r.name: r for r in node_health.run_checks(cfg, budget_s=120)}
    assert {name: r.status for name, r in results.items()} == {
        "gpu-count": "ok", "gpu-health": "ok", "xid": "ok", "dcgm": "skip", "efa": "skip",
        "nccl-plugin": "skip", "shared-fs": "ok", "disk": "ok"}, {n: r.detail for n, r in results.items()}
    assert results["gpu-count"].detail == "1 of 1 GPUs visible"
    assert results["xid"].detail == "no fatal Xid since boot"
    assert results["dcgm"].detail == "dcgmi not installed"
    # The checks ran the captures' own commands and read what the machine printed.
    query = (H200 / "commands").read_text().split("query-gpu.txt: ", 1)[1].splitlines()[0]
    assert f"$ {query}\n0, 00000000:00:06.0, 0, [N/A]\n" in results["gpu-health"].raw
    assert "00000000:00:06.0, No, No" in results["gpu-health"].raw
    gpus = node_checks.parse_query_csv((H200 / "query-gpu.txt").read_text(), node_checks.GPU_QUERY)
    assert gpus == [{"index": 0, "pci.bus_id": "00000000:00:06.0", "ecc.errors.uncorrected.volatile.total": 0,
                     "retired_pages.pending": None}]
    # The same machine taken for an 8-GPU H200 type is seven GPUs short.
    short = node_checks.check_gpu_count(expected=H200_TYPE_GPUS, timeout=30)
    assert (short.ok, short.detail) == (False, f"1 of {H200_TYPE_GPUS} GPUs visible")


def test_a_captured_machine_answers_only_its_captured_commands(monkeypatch, tmp_path):
    _only_standins(monkeypatch, tmp_path, ["nvidia-smi", "fi_info"], scenario="h200-1gpu")
    for argv in (["nvidia-smi", "--query-gpu=index,name", "--format=csv"], ["fi_info", "-p", "efa", "-t", "FI_EP_RDM"]):
        proc = subprocess.run(argv, capture_output=True, text=True)
        assert proc.returncode == 2 and "no capture of: " + " ".join(argv) in proc.stderr


def test_the_efa_check_runs_the_command_its_recording_answers(monkeypatch, tmp_path):
    # `fi_info -p efa -t FI_EP_RDM`: the command of the published p4de.24xlarge output p4d-healthy follows.
    _only_standins(monkeypatch, tmp_path, ["fi_info"])
    outcome = node_checks.check_efa(expected=P4D_EFA_DEVICES, timeout=30)
    assert outcome.raw.splitlines()[0].endswith("/fi_info -p efa -t FI_EP_RDM"), outcome.raw
    assert outcome.ok and outcome.detail == (f"{P4D_EFA_DEVICES} of {P4D_EFA_DEVICES} EFA devices: "
                                             f"rdmap16s27, rdmap32s27, rdmap144s27, rdmap160s27")


def test_dcgm_is_skipped_where_it_is_not_installed(monkeypatch, tmp_path):
    _only_standins(monkeypatch, tmp_path, ["nvidia-smi"])
    assert node_checks.check_dcgm(expected_gpus=P4D_GPUS, timeout=30) == node_checks.skipped("dcgmi not installed")


def test_nccl_plugin_off_the_loader_path(monkeypatch, nccl_plugin, tmp_path):
    monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)
    outcome = node_checks.check_nccl_plugin(expected_efa=P4D_EFA_DEVICES, timeout=30,
                                            search_dirs=(str(tmp_path), str(nccl_plugin)))
    assert not outcome.ok
    assert outcome.detail.startswith(f"{nccl_plugin}/libnccl-net.so loads but is not on the loader path")
    missing = node_checks.check_nccl_plugin(expected_efa=P4D_EFA_DEVICES, timeout=30, search_dirs=(str(tmp_path),))
    assert not missing.ok and missing.detail.startswith("libnccl-net.so not found on the loader path")


def test_a_library_that_is_not_an_nccl_plugin(monkeypatch, tmp_path):
    cc = shutil.which("cc")
    require(None if cc else "no C compiler (cc)")
    source = tmp_path / "other.c"
    source.write_text("int unrelated_symbol = 1;\n")
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(tmp_path / "libnccl-net.so"), str(source)], check=True)
    monkeypatch.setenv("LD_LIBRARY_PATH", str(tmp_path))
    outcome = node_checks.check_nccl_plugin(expected_efa=P4D_EFA_DEVICES, timeout=30, search_dirs=())
    assert not outcome.ok and "exports no ncclNetPlugin_v<N> symbol" in outcome.detail


def test_disk_below_the_floor(tmp_path):
    free = shutil.disk_usage(tmp_path).free / 2**30
    outcome = node_checks.check_disk(paths=[str(tmp_path)], min_free_gib=free * 10 + 1)
    assert not outcome.ok and "below the floor" in outcome.detail
    assert node_checks.check_disk(paths=[str(tmp_path)], min_free_gib=0).ok


def test_run_bounded_does_not_wait_past_its_limit(tmp_path):
    # A command that starts a child and hangs: at the limit the whole process group is killed, so
    # nothing of it is left running (or holding the pipes open) when run_bounded returns.
    pids = tmp_path / "pids"
    started = time.monotonic()
    result = node_checks.run_bounded(["sh", "-c", f"sleep 300 & echo $! > {pids}; echo $$ >> {pids}; wait"],
                                     timeout=0.5)
    assert time.monotonic() - started < 60   # a backstop against a hang only
    assert result.timed_out and result.returncode is None
    left = [pid for pid in map(int, pids.read_text().split()) if _running(pid)]
    assert left == [], f"still running after the time limit: {left}"
    assert node_checks.run_bounded(["no-such-program-here"], timeout=5).missing


def _running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie (killed, not yet reaped by its parent)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


# --- a failing node under a real Slurm: drain, requeue, replace only once idle ----------------------
#
# slurmctld and slurmd (Slurm 22.05, the Debian packages) run here for real, with one node named
# worker-1 and a job on it. Expected states are Slurm's documented ones: "DRAINING: The node is
# currently executing a job, but will not be allocated additional jobs" and "DRAINED: The node is
# unavailable for use per system administrator request" (sinfo(1), NODE STATE CODES); scontrol show
# node prints them as ALLOCATED+DRAIN and IDLE+DRAIN. ParallelCluster replaces only nodes that are
# "drained(sinfo) ... equivalent to IDLE+DRAIN(scontrol) or DOWN+DRAIN(scontrol)" (its
# slurm_plugin/slurm_resources.py, SlurmNode.is_drained).

@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory):
    """A real slurmctld and slurmd on this machine: the path of their slurm.conf."""
    require(None if os.geteuid() == 0 else "slurmd runs jobs as root here")
    missing = [p for p in ("slurmctld", "slurmd", "sbatch", "squeue", "scontrol") if not shutil.which(p)]
    require(f"{', '.join(missing)} not installed (Debian packages slurmctld, slurmd, slurm-client)"
            if missing else None)
    base = tmp_path_factory.mktemp("slurm")
    for sub in ("state", "spool"):
        (base / sub).mkdir()
    conf = base / "slurm.conf"
    conf.write_text("\n".join([
        "ClusterName=health", "SlurmctldHost=localhost(127.0.0.1)", f"SlurmctldPort={free_port()}",
        f"SlurmdPort={free_port()}", "AuthType=auth/none", "CredType=cred/none", "SlurmUser=root",
        f"StateSaveLocation={base}/state", f"SlurmdSpoolDir={base}/spool",
        f"SlurmctldPidFile={base}/slurmctld.pid", f"SlurmdPidFile={base}/slurmd.pid",
        f"SlurmctldLogFile={base}/slurmctld.log", f"SlurmdLogFile={base}/slurmd.log",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "JobAcctGatherType=jobacct_gather/none",
        "MpiDefault=none", "SelectType=select/linear", "ReturnToService=2", "JobRequeue=1", "KillWait=30",
        f"NodeName={NODE_NAME} NodeAddr=127.0.0.1 NodeHostname=localhost CPUs=1 State=UNKNOWN",
        f"PartitionName=train Nodes={NODE_NAME} Default=YES", ""]))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    daemons = [subprocess.Popen(["slurmctld", "-D", "-i", "-f", str(conf)], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        _wait_for_controller(conf)
        daemons.append(subprocess.Popen(["slurmd", "-D", "-N", NODE_NAME, "-f", str(conf)], env=env,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        _wait_for_state(conf, {"IDLE"})
        yield conf
    finally:
        for daemon in reversed(daemons):
            daemon.terminate()
            daemon.wait(timeout=30)


def _wait_for_controller(conf: Path, timeout: float = 60) -> None:
    """Until slurmctld answers (``scontrol ping``: "Slurmctld(primary) at localhost is UP")."""
    wait_for(lambda: " is UP" in subprocess.run(["scontrol", "ping"], env={**os.environ, "SLURM_CONF": str(conf)},
                                                capture_output=True, text=True, timeout=30).stdout,
             timeout, "slurmctld to answer `scontrol ping`")


def _slurm(conf: Path, *argv: str) -> str:
    return subprocess.run(argv, env={**os.environ, "SLURM_CONF": str(conf)}, capture_output=True, text=True,
                          check=True, timeout=30).stdout


def _state(conf: Path) -> set[str]:
    """The node's state words as scontrol prints them (State=ALLOCATED+DRAIN: ALLOCATED, DRAIN)."""
    line = _slurm(conf, "scontrol", "show", "node", "-o", NODE_NAME)
    return set(line.split(" State=", 1)[1].split()[0].split("+"))


def _wait_for_state(conf: Path, wanted: set[str], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if _state(conf) == wanted:
                return
        except (subprocess.CalledProcessError, IndexError):  # not registered yet
            pass
        time.sleep(0.5)
    raise AssertionError(f"{NODE_NAME} did not reach {'+'.join(sorted(wanted))} in {timeout:.0f} s")


@pytest.fixture
def slurm(slurm_cluster, node, tmp_path):
    """The cluster for one test: the node idle and in service before, no job left after."""
    yield slurm_cluster
    _slurm(slurm_cluster, "scancel", "--partition=train")
    _slurm(slurm_cluster, "scontrol", "update", f"NodeName={NODE_NAME}", "State=RESUME")
    _wait_for_state(slurm_cluster, {"IDLE"})


def _start_job(conf: Path, tmp_path: Path) -> tuple[str, Path]:
    """A job on worker-1 that records the signals it gets, as the training job's script does: on
    SIGTERM it saves (a short sleep) and exits 75."""
    signals = tmp_path / "signals"
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/bash\ntrap 'echo TERM >> {signals}; sleep 1; exit 75' TERM\n"
                      f"echo started >> {signals}\nwhile true; do sleep 1; done\n")
    script.chmod(0o755)
    job = _slurm(conf, "sbatch", "--parsable", "--requeue", f"--nodelist={NODE_NAME}",
                 f"--output={tmp_path}/job-%j.out", str(script)).strip()
    deadline = time.monotonic() + 60
    while not (signals.exists() and "started" in signals.read_text()):
        assert time.monotonic() < deadline, "the job did not start"
        time.sleep(0.5)
    return job, signals


def _job_field(conf: Path, job: str, field: str) -> str:
    text = _slurm(conf, "scontrol", "show", "job", "-o", job)
    return text.split(f" {field}=", 1)[1].split()[0]


def test_a_busy_node_that_fails_is_drained_its_job_requeued_and_kept_until_idle(node, slurm, tmp_path):
    job, signals = _start_job(slurm, tmp_path)
    assert _state(slurm) == {"ALLOCATED"}
    proc = node.run("p4d-xid79", "--health-check", env={"SLURM_CONF": str(slurm)})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    # The job got Slurm's SIGTERM (its graceful stop), was requeued, and the instance stays.
    assert signals.read_text().splitlines()[:2] == ["started", "TERM"]
    assert _job_field(slurm, job, "Restarts") == "1"
    assert node.health() == "Healthy"
    [first] = node.alerts()
    assert f"requeued job {job}" in first["Message"] and "not replaced yet" in first["Message"]
    reason = _slurm(slurm, "scontrol", "show", "node", "-o", NODE_NAME).split(" Reason=", 1)[1]
    assert "xid: Xid 79 (GPU has fallen off the bus)" in reason
    # The job has left: the node is drained and idle, and the next health check replaces it.
    _wait_for_state(slurm, {"IDLE", "DRAIN"})
    again = node.run("p4d-xid79", "--health-check", env={"SLURM_CONF": str(slurm)})
    assert again.returncode == 1, again.stdout + again.stderr
    assert node.health() == "Unhealthy"
    [second] = node.alerts()
    assert f"marked {node.instance_id} Unhealthy" in second["Message"]


def test_an_idle_node_that_fails_is_drained_and_replaced(node, slurm):
    proc = node.run("p4d-efa-down", "--health-check", env={"SLURM_CONF": str(slurm)})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert _state(slurm) == {"IDLE", "DRAIN"}
    assert node.health() == "Unhealthy"
    message = node.alerts()[0]["Message"]
    # Judged on Slurm's state after the drain: drained and idle, as scontrol prints it.
    assert f"{NODE_NAME} is IDLE+DRAIN in Slurm: drained and idle" in message
    assert f"marked {node.instance_id} Unhealthy" in message


def test_the_master_running_slurmctld_is_never_replaced_by_its_own_check(node, slurm, tmp_path):
    # slurm_cluster's slurmctld runs on this machine, as the master's does on the master.
    job, signals = _start_job(slurm, tmp_path)
    for scenario in ("p4d-xid79", "p4d-xid79"):  # busy, then drained and idle: kept both times
        proc = node.run(scenario, "--health-check", cluster_env={"ROLE": "master"},
                        env={"SLURM_CONF": str(slurm)})
        assert proc.returncode == 1, proc.stdout + proc.stderr
        _wait_for_state(slurm, {"IDLE", "DRAIN"})
    assert node.health() == "Healthy"
    assert "TERM" in signals.read_text()
    [alert] = node.alerts()
    assert "not replaced: slurmctld runs on this node" in alert["Message"]
    assert f"requeued job {job}" in alert["Message"]
    # A failed Prolog on the master keeps it too.
    node.run("p4d-xid79", "--prolog", cluster_env={"ROLE": "master"}, env={"SLURM_CONF": str(slurm)})
    assert node.health() == "Healthy"


# --- time limits: a stall is retried, a slow command starves nobody ---------------------------------

def _wrapped(tmp_path: Path, name: str, body: str) -> Path:
    """A PATH directory where ``name`` runs ``body`` (shell) before the recorded stand-in answers."""
    directory = tmp_path / f"slow-{name}"
    directory.mkdir()
    wrapper = directory / name
    wrapper.write_text(f"#!/bin/sh\n{body}\nexec {STANDINS / name} \"$@\"\n")
    wrapper.chmod(0o755)
    return directory


def test_a_check_that_times_out_once_and_then_answers_leaves_the_node_healthy(node, tmp_path):
    # fi_info stalls on its first call (a driver busy for a minute), answers on the next.
    marker = tmp_path / "stalled-once"
    slow = _wrapped(tmp_path, "fi_info", f"[ -e {marker} ] || {{ touch {marker}; sleep 120; }}")
    proc = node.run("p4d-healthy", "--health-check", "--json",
                    env={"PATH": f"{slow}:{bin_dir(tmp_path / 'standins')}:{Path(sys.executable).parent}:"
                                 f"{os.environ['PATH']}"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    efa = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}["efa"]
    assert efa["status"] == "ok" and "on a retry" in efa["detail"]
    assert node.health() == "Healthy"
    assert node.alerts() == []


def test_a_slow_first_check_does_not_starve_the_next(monkeypatch, tmp_path):
    # nvidia-smi -L hangs; nvidia-smi --query-gpu answers after 1.5 s (a driver without persistence
    # mode initialises every GPU first). The hang may cost gpu-count its share, not gpu-health's.
    slow = _wrapped(tmp_path, "nvidia-smi", 'case "$1" in -L) sleep 120;; --query-gpu=*) sleep 1.5;; esac')
    monkeypatch.setenv("PATH", f"{slow}:{bin_dir(tmp_path)}:{Path(sys.executable).parent}:{os.environ['PATH']}")
    monkeypatch.setenv("RECORDED_MACHINE", "p4d-healthy")
    cfg = node_health.NodeConfig(node_name=NODE_NAME, instance_id=None, instance_type=P4D,
                                 expected_gpus=P4D_GPUS, expected_efa=0, efs_mount=str(tmp_path),
                                 min_free_gib=0)
    started = time.monotonic()
    results = {r.name: r for r in node_health.run_checks(cfg, budget_s=28)}
    assert time.monotonic() - started < 120   # a backstop against a hang only: the results below are the check
    assert results["gpu-health"].status == "ok", results["gpu-health"].detail
    assert results["gpu-count"].failed and "again on a retry" in results["gpu-count"].detail
