"""The mpirun command of a cluster job inside its Slurm allocation: the flags that matter and the EFA
variant, checked against Open MPI's, NCCL's and libfabric's documented behaviour. Pure functions;
tests/launch/test_cluster_slurm.py runs the command across emulated hosts."""
import pytest

from launch.cluster.launch_command import efa_rdma_read, horovod_env, mpirun_in_allocation, train_command


def _mca(cmd: list[str]) -> dict[str, str]:
    return {cmd[i + 1]: cmd[i + 2] for i, a in enumerate(cmd) if a == "-mca"}


def _exported(cmd: list[str]) -> list[str]:
    return [cmd[i + 1] for i, a in enumerate(cmd) if a == "-x"]


def test_two_p4d_nodes_get_one_rank_per_gpu_and_the_flags_that_matter():
    train = train_command(logdir="/efs/logs/run1", data_dir="/efs/data/coco",
                          overrides=["TRAIN.BATCH_SIZE_PER_GPU=4"])
    cmd = mpirun_in_allocation(ranks=16, train=train)
    assert cmd[:2] == ["mpirun", "--allow-run-as-root"] and cmd[cmd.index("-np") + 1] == "16"   # 2 x 8 GPUs
    mca = _mca(cmd)
    # Neither MPI's TCP transport nor its daemons' connections may pick lo or the docker bridge.
    assert set(mca["btl_tcp_if_exclude"].split(",")) == set(mca["oob_tcp_if_exclude"].split(",")) == {"lo", "docker0"}
    assert mca["orte_abort_on_non_zero_status"] == "1"       # one failed rank ends the job
    # A vanished node ends the job within a minute: keepalive after 10 s idle, 3 probes 5 s apart.
    keepalive = (int(mca["oob_tcp_keepalive_time"]) + int(mca["oob_tcp_keepalive_intvl"])
                 * int(mca["oob_tcp_keepalive_probes"]))
    assert keepalive <= 60
    assert "NCCL_SOCKET_IFNAME=^docker0,lo" in _exported(cmd)
    assert {"PATH", "PYTHONPATH", "TF_USE_LEGACY_KERAS"} <= set(_exported(cmd))
    # Training comes last, the user's override after the data directory so that it wins.
    assert cmd[-8:-5] == ["python", "-m", "training.train"] and cmd[-1] == "TRAIN.BATCH_SIZE_PER_GPU=4"
    assert cmd.index("DATA.BASEDIR=/efs/data/coco") < cmd.index("TRAIN.BATCH_SIZE_PER_GPU=4")
    # Inside the allocation Open MPI reads the nodes from Slurm and starts its daemons with srun.
    assert "--hostfile" not in cmd and "plm_rsh_args" not in mca and "-H" not in cmd


def test_efa_adds_libfabric_provider_only_when_asked():
    plain = mpirun_in_allocation(ranks=16, train=["python"])
    efa = mpirun_in_allocation(ranks=16, train=["python"], efa=True,
                               instance_types=["p4d.24xlarge", "p4d.24xlarge"])
    assert "FI_PROVIDER=efa" not in plain
    assert efa[efa.index("FI_PROVIDER=efa") - 1] == "-x"
    assert set(efa) - set(plain) == {"FI_PROVIDER=efa", "FI_EFA_USE_DEVICE_RDMA=1"}


@pytest.mark.parametrize("instance_types", [["g5.48xlarge"], ["p3dn.24xlarge"], ["g6.48xlarge"],
                                            ["p4d.24xlarge", "g5.48xlarge"], []])
def test_rdma_read_is_not_forced_where_the_efa_device_lacks_it(instance_types):
    """libfabric aborts when FI_EFA_USE_DEVICE_RDMA=1 meets an EFA device without RDMA read (p3dn,
    g5, ...); there, and for unknown types, the variable stays unset and libfabric decides."""
    cmd = mpirun_in_allocation(ranks=16, train=["python"], efa=True, instance_types=instance_types)
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


def test_horovod_env_is_shared_with_sagemaker_path():
    env = horovod_env(efa=False)
    assert env["HOROVOD_FUSION_THRESHOLD"] == "67108864"
    assert env["NCCL_SOCKET_IFNAME"] == "^docker0,lo"


def test_a_job_without_ranks_is_rejected():
    with pytest.raises(ValueError, match="at least one rank"):
        mpirun_in_allocation(ranks=0, train=["python"])
