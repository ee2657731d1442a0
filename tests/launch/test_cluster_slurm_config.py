"""The cluster's Slurm configuration and node names, as pure functions (the real daemons run with them in
tests/launch/test_cluster_slurm.py). Expected values come from the behaviour the cluster promises: a
vanished node noticed within a minute, SIGTERM to a stopped job with time to checkpoint before SIGKILL
(SageMaker's 120 s is the bar), one fixed node list that a replacement instance rejoins."""
import re
from pathlib import Path

import pytest

from launch.aws import LaunchError
from launch.cluster import slurm


def _conf(**kwargs) -> dict[str, list[str]]:
    text = slurm.slurm_conf(**{"cluster": "Team-A_Cluster", "controller_host": "ip-10-0-2-4",
                               "controller_address": "10.0.2.4", "worker_count": 3, "cpus": 96,
                               "state_dir": Path("/efs/s"), "job_log": Path("/efs/j"), "log_dir": Path("/efs/l"),
                               **kwargs})
    parsed: dict[str, list[str]] = {}
    for line in text.splitlines():
        key, value = line.split("=", 1)
        parsed.setdefault(key, []).append(value)
    return parsed


def test_the_configuration_promises_what_the_runbook_says():
    conf = _conf()
    assert conf["SlurmctldHost"] == ["ip-10-0-2-4(10.0.2.4)"]
    assert conf["ClusterName"] == ["teamacluster"]                   # Slurm wants lower case, no punctuation
    assert int(conf["SlurmdTimeout"][0]) <= 60                       # a vanished node: DOWN within a minute
    assert 60 <= int(conf["KillWait"][0]) < 120                      # time to checkpoint after SIGTERM
    assert conf["JobRequeue"] == ["1"] and conf["ReturnToService"] == ["2"]
    assert "cloud_reg_addrs" in conf["SlurmctldParameters"][0] and "enable_configless" in conf["SlurmctldParameters"][0]
    assert conf["HealthCheckProgram"] == [str(slurm.HEALTH_CHECK_PROGRAM)] and conf["Prolog"] == [str(slurm.PROLOG_PROGRAM)]
    # The master and 3 workers, fixed names a replacement instance takes over.
    assert conf["NodeName"] == ["master CPUs=96 State=CLOUD Weight=1", "worker-[1-3] CPUs=96 State=CLOUD Weight=2"]
    assert conf["PartitionName"][0].startswith("train Nodes=master,worker-1,worker-2,worker-3 Default=YES")
    assert "HealthCheckProgram" not in _conf(health_checks=False)


def test_cgroup_conf_only_where_slurm_reads_those_keys():
    assert slurm.cgroup_conf((21, 8)) is None          # Ubuntu 22.04's Slurm: no cgroup plugin needed, keys unknown
    text = slurm.cgroup_conf((22, 5))
    assert text.startswith("CgroupPlugin=cgroup/v") and "CgroupAutomount=no" in text


def test_names_are_claimed_once_and_taken_over_from_instances_that_left(tmp_path):
    live = {"i-m", "i-1", "i-2"}
    alive = live.__contains__
    names = tmp_path / "nodes"
    assert slurm.claim_name(names, role="master", instance_id="i-m", worker_count=2, alive=alive) == slurm.Claim("master")
    assert slurm.claim_name(names, role="worker", instance_id="i-1", worker_count=2, alive=alive).name == "worker-1"
    assert slurm.claim_name(names, role="worker", instance_id="i-2", worker_count=2, alive=alive).name == "worker-2"
    # A restarted container keeps its name.
    assert slurm.claim_name(names, role="worker", instance_id="i-2", worker_count=2, alive=alive) == slurm.Claim("worker-2")
    # A third worker while both are alive: the group is larger than the cluster's worker_count.
    with pytest.raises(LaunchError, match="no free Slurm node name"):
        slurm.claim_name(names, role="worker", instance_id="i-3", worker_count=2, alive=alive)
    # i-1 left its group; its replacement takes over worker-1 and knows whom it replaces.
    live.discard("i-1")
    live.add("i-9")
    assert slurm.claim_name(names, role="worker", instance_id="i-9", worker_count=2, alive=alive) == \
        slurm.Claim("worker-1", replaces="i-1")
    assert (names / "worker-1" / "instance").read_text().strip() == "i-9"
    # A replaced master takes over the master's name whatever the old one's state.
    assert slurm.claim_name(names, role="master", instance_id="i-m2", worker_count=2, alive=alive) == \
        slurm.Claim("master", replaces="i-m")


def _sleepers(n: int) -> list:
    import subprocess
    return [subprocess.Popen(["sleep", "600"]) for _ in range(n)]


def test_a_worker_restarts_its_daemons_when_the_master_is_replaced(tmp_path, capsys):
    """A replaced master has a new private address: a worker's slurmd keeps sending to the one it
    started with, so the worker stops its daemons (the container restarts and registers anew)."""
    import threading
    lay = slurm.Layout(efs=str(tmp_path), stack="EmulatedCluster")
    lay.root.mkdir(parents=True)
    lay.controller.write_text("ip-10-0-2-4 10.0.2.4\n")
    moved = slurm.controller_moved(lay, "10.0.2.4")
    assert moved() is None
    lay.controller.write_text("garbled")            # half-written or unreadable: not a move
    assert moved() is None
    lay.controller.write_text("ip-10-0-2-4 10.0.2.4\n")

    procs = _sleepers(2)
    # The master comes back at another address while the worker's daemons run.
    timer = threading.Timer(0.3, lambda: lay.controller.write_text("ip-10-0-3-9 10.0.3.9\n"))
    timer.start()
    assert slurm.supervise(procs, moved, poll_s=0.05, moved_every=2) == 1
    assert all(p.poll() is not None for p in procs)
    assert "now at 10.0.3.9 (a replaced master)" in capsys.readouterr().out


def test_a_daemon_that_exits_ends_the_node_and_an_unmoved_master_does_not(tmp_path):
    import subprocess
    lay = slurm.Layout(efs=str(tmp_path), stack="EmulatedCluster")
    lay.root.mkdir(parents=True)
    lay.controller.write_text("ip-10-0-2-4 10.0.2.4\n")
    procs = [subprocess.Popen(["sh", "-c", "sleep 0.5; exit 7"]), *_sleepers(1)]
    assert slurm.supervise(procs, slurm.controller_moved(lay, "10.0.2.4"), poll_s=0.05, moved_every=1) == 7
    assert all(p.poll() is not None for p in procs)


def test_custom_settings_replace_ours_in_place_and_add_options_to_the_lists_we_set():
    ours = slurm.slurm_conf(cluster="c", controller_host="h", controller_address="10.0.2.4", worker_count=1,
                            cpus=4, state_dir=Path("/efs/s"), job_log=Path("/efs/j"), log_dir=Path("/efs/l"))
    custom = ("# longer steps on this cluster\n"
              "MessageTimeout=60   # ours is 30\n"
              "\n"
              "schedulerparameters=bf_interval=10,nohold_on_prolog_fail\n"
              "SlurmctldParameters=idle_on_node_suspend\n"
              "AuthInfo=cred_expire=300\n"
              "X11Parameters=home_xauthority\n")
    merged = slurm.merge_custom(ours, custom, source="custom.conf").splitlines()
    # one line per key, as Slurm would otherwise log an error for each repeated key
    keys = [line.split("=", 1)[0].lower() for line in merged if not line.startswith(("NodeName", "PartitionName"))]
    assert len(keys) == len(set(keys))
    assert "MessageTimeout=60" in merged and "MessageTimeout=30" not in merged
    assert merged.index("MessageTimeout=60") == ours.splitlines().index("MessageTimeout=30")
    assert "SchedulerParameters=nohold_on_prolog_fail,bf_interval=10" in merged
    assert "SlurmctldParameters=enable_configless,cloud_reg_addrs,idle_on_node_suspend" in merged
    assert merged[-2:] == ["AuthInfo=cred_expire=300", "X11Parameters=home_xauthority"]
    # the node and partition lines stay as they were
    assert [l for l in merged if l.startswith(("NodeName", "PartitionName"))] == \
        [l for l in ours.splitlines() if l.startswith(("NodeName", "PartitionName"))]


@pytest.mark.parametrize("line, says", [
    ("KillWait=300", "line 2: KillWait is set by the cluster and may not be changed"),
    ("NodeName=gpu-[1-4] CPUs=96", "line 2: 'NodeName=gpu-[1-4] CPUs=96' is not one Key=Value setting"),
    ("partitionname=debug", "line 2: PartitionName is set by the cluster"),
    ("JobCompLoc=/tmp/jobs", "line 2: JobCompLoc is set by the cluster and may not be changed (`maskrcnn job "
                             "list/status` read the job-completion log)"),
    ("Include /efs/more.conf", "line 2: 'Include /efs/more.conf' is not one Key=Value setting"),
    ("MessageTimeout", "line 2: 'MessageTimeout' is not one Key=Value setting"),
])
def test_custom_settings_the_cluster_depends_on_are_refused_naming_the_line(line, says):
    ours = "MessageTimeout=30\nKillWait=110\n"
    with pytest.raises(LaunchError, match=re.escape(f"custom.conf {says}")):
        slurm.merge_custom(ours, f"MessageTimeout=60\n{line}\n", source="custom.conf")


def test_the_master_leaves_a_refused_custom_file_out_and_says_so(tmp_path, monkeypatch, capsys):
    env = {"STACK_NAME": "Team", "EFS_MOUNT": str(tmp_path), "WORKER_COUNT": "1", "NODE_CPUS": "4"}
    lay = slurm.layout(env)
    lay.root.mkdir(parents=True)
    monkeypatch.setattr(slurm, "SLURM_ETC", tmp_path / "etc")
    monkeypatch.setattr(slurm, "slurm_version", lambda: (21, 8))
    lay.custom_conf.write_text("MessageTimeout=45\n")
    assert "MessageTimeout=45" in slurm.write_config(env, address="10.0.2.4", health_checks=True).read_text()
    lay.custom_conf.write_text("MessageTimeout=45\nKillWait=5\n")
    written = slurm.write_config(env, address="10.0.2.4", health_checks=True).read_text()
    assert "MessageTimeout=30" in written and "KillWait=110" in written
    out = capsys.readouterr().out
    assert f"custom Slurm settings left out: {lay.custom_conf} line 2: KillWait is set by the cluster" in out
    # and the check a team runs after editing the file names the same line
    cluster_env = tmp_path / "cluster.env"
    cluster_env.write_text("".join(f"{k}={v}\n" for k, v in env.items()))
    assert slurm.main(["conf", "--cluster-env", str(cluster_env)]) == 2
    assert "line 2: KillWait is set by the cluster" in capsys.readouterr().err
