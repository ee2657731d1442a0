"""The mpirun command for a given cluster: exact argv, hostfile, EFA variant."""
import pytest

from launch.cluster.launch_command import (Node, efa_rdma_read, hostfile_text, horovod_env, mpirun_command,
                                           train_command)

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
        "-mca", "orte_abort_on_non_zero_status", "1", "-mca", "mpi_yield_when_idle", "1", "--tag-output",
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
    efa = mpirun_command(TWO_NODES, hostfile="h", train=["python"], efa=True,
                         instance_types=["p4d.24xlarge", "p4d.24xlarge"])
    assert "FI_PROVIDER=efa" not in plain
    assert efa[efa.index("FI_PROVIDER=efa") - 1] == "-x"
    assert set(efa) - set(plain) == {"FI_PROVIDER=efa", "FI_EFA_USE_DEVICE_RDMA=1"}


@pytest.mark.parametrize("instance_types", [["g5.48xlarge"], ["p3dn.24xlarge"], ["g6.48xlarge"],
                                            ["p4d.24xlarge", "g5.48xlarge"], []])
def test_rdma_read_is_not_forced_where_the_efa_device_lacks_it(instance_types):
    """libfabric aborts when FI_EFA_USE_DEVICE_RDMA=1 meets an EFA device without RDMA read (p3dn,
    g5, ...); there, and for unknown types, the variable stays unset and libfabric decides."""
    cmd = mpirun_command(TWO_NODES, hostfile="h", train=["python"], efa=True, instance_types=instance_types)
    assert "FI_PROVIDER=efa" in cmd
    assert not any(a.startswith("FI_EFA_USE_DEVICE_RDMA") for a in cmd)


@pytest.mark.parametrize("instance_type", ["p4d.24xlarge", "p4de.24xlarge", "p5.48xlarge", "p5e.48xlarge",
                                           "p5en.48xlarge", "ml.p4d.24xlarge", "ml.p5.48xlarge"])
def test_rdma_read_is_used_where_every_node_has_it(instance_type):
    env = horovod_env(efa=True, instance_types=[instance_type])
    assert env["FI_EFA_USE_DEVICE_RDMA"] == "1" and env["FI_PROVIDER"] == "efa"
    assert "FI_EFA_USE_DEVICE_RDMA" not in horovod_env(efa=False, instance_types=[instance_type])


def test_rdma_table_agrees_with_sagemakers_runner_and_the_clusters_types():
    """SageMaker's MPI runner sets the variable from its own list: both tables must say the same for
    every GPU type either knows; every EFA type the cluster accepts is classified as AWS documents."""
    from sagemaker_training import SM_EFA_NCCL_INSTANCES, SM_EFA_RDMA_INSTANCES

    from infra.instance_types import EFA_INSTANCE_TYPES

    gpu = [t for t in SM_EFA_NCCL_INSTANCES if not t.startswith("ml.trn")]
    assert {t for t in gpu if efa_rdma_read(t)} == {t for t in gpu if t in SM_EFA_RDMA_INSTANCES}
    assert {t for t in EFA_INSTANCE_TYPES if efa_rdma_read(t)} == \
        {t for t in EFA_INSTANCE_TYPES if t.split(".")[0] in ("p4d", "p4de", "p5", "p5e", "p5en", "p6-b200")}
    assert not efa_rdma_read("g5.48xlarge") and not efa_rdma_read("p3dn.24xlarge")


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


@pytest.mark.parametrize("instance_type, rdma", [("p4d.24xlarge", True), ("g5.48xlarge", False),
                                                 ("p3dn.24xlarge", False)])
def test_the_cluster_run_passes_its_nodes_types(instance_type, rdma):
    from launch.cluster import run
    from launch.cluster.hostfile import ClusterNode

    nodes = [ClusterNode("i-1", "10.0.0.1", instance_type, "master", 8, True),
             ClusterNode("i-2", "10.0.0.2", instance_type, "worker", 8, True)]
    _, cmd = run.build_command(nodes, logdir="/efs/logs/x", data_dir="/efs/data/coco", overrides=[], ssh_port=2222)
    assert "FI_PROVIDER=efa" in cmd
    assert ("FI_EFA_USE_DEVICE_RDMA=1" in cmd) is rdma
