"""The mpirun command for a given cluster: exact argv, hostfile, EFA variant."""
import pytest

from launch.cluster.launch_command import Node, hostfile_text, horovod_env, mpirun_command, train_command

TWO_NODES = [Node("10.0.1.4", 8), Node("10.0.1.5", 8)]


def test_exact_command_for_two_p4d_nodes():
    train = train_command(logdir="/efs/logs/run1", data_dir="/efs/data/coco",
                          overrides=["TRAIN.BATCH_SIZE_PER_GPU=4"])
    cmd = mpirun_command(TWO_NODES, hostfile="/efs/logs/run1/hostfile", train=train)
    assert cmd == [
        "mpirun", "--allow-run-as-root", "-np", "16", "--hostfile", "/efs/logs/run1/hostfile",
        "-bind-to", "none", "-map-by", "slot",
        "-mca", "pml", "ob1", "-mca", "btl", "^openib",
        "-mca", "btl_tcp_if_exclude", "lo,docker0", "-mca", "oob_tcp_if_exclude", "lo,docker0",
        "-mca", "plm_rsh_args",
        "-p 2222 -i /etc/maskrcnn/ssh/id_ed25519 -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
        "-o LogLevel=ERROR -o BatchMode=yes",
        "-mca", "orte_abort_on_non_zero_status", "1", "--tag-output",
        "-x", "NCCL_SOCKET_IFNAME=^docker0,lo", "-x", "NCCL_DEBUG=WARN",
        "-x", "HOROVOD_CYCLE_TIME=0.5", "-x", "HOROVOD_FUSION_THRESHOLD=67108864",
        "-x", "HOROVOD_STALL_CHECK_TIME_SECONDS=60", "-x", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=1800",
        "-x", "PATH", "-x", "LD_LIBRARY_PATH", "-x", "PYTHONPATH", "-x", "TF_USE_LEGACY_KERAS",
        "-x", "TF_CPP_MIN_LOG_LEVEL",
        "python", "-m", "training.train", "--logdir", "/efs/logs/run1",
        "--config", "DATA.BASEDIR=/efs/data/coco", "TRAIN.BATCH_SIZE_PER_GPU=4",
    ]


def test_efa_adds_libfabric_provider_only_when_asked():
    plain = mpirun_command(TWO_NODES, hostfile="h", train=["python"])
    efa = mpirun_command(TWO_NODES, hostfile="h", train=["python"], efa=True)
    assert "FI_PROVIDER=efa" not in plain
    assert efa[efa.index("FI_PROVIDER=efa") - 1] == "-x"
    assert set(efa) - set(plain) == {"FI_PROVIDER=efa", "FI_EFA_USE_DEVICE_RDMA=1"}


def test_rank_count_and_hostfile_follow_slots():
    nodes = [Node("10.0.0.10", 4), Node("10.0.0.11", 1)]
    cmd = mpirun_command(nodes, hostfile="h", train=["python"], ssh_port=22)
    assert cmd[cmd.index("-np") + 1] == "5"
    assert cmd[cmd.index("plm_rsh_args") + 1].startswith("-p 22 ")
    assert hostfile_text(nodes) == "10.0.0.10 slots=4\n10.0.0.11 slots=1\n"


def test_horovod_env_is_shared_with_sagemaker_path():
    env = horovod_env(efa=False)
    assert env["HOROVOD_FUSION_THRESHOLD"] == "67108864"
    assert env["NCCL_SOCKET_IFNAME"] == "^docker0,lo"


def test_bad_cluster_is_rejected():
    with pytest.raises(ValueError, match="no nodes"):
        mpirun_command([], hostfile="h", train=["python"])
    with pytest.raises(ValueError, match="at least 1"):
        Node("10.0.0.1", 0)
