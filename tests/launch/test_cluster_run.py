"""The master's one command: nodes from moto's auto-scaling groups, health checks run for real on
this machine (LocalRunner), and a stand-in `mpirun` on PATH that fails once (a node failure) and
then succeeds, to check the hostfile, the command and the resume attempt."""
import contextlib
import json
from pathlib import Path

from launch.cluster import health, run
from launch.cluster.hostfile import ClusterNode
from launch.cluster.launch_command import format_command


@contextlib.contextmanager
def _marker_nobody_sees(efs_mount):
    yield "/nonexistent/marker"  # as if no node had the master's EFS mounted


def _fake_mpirun(bin_dir: Path, log: Path, fail_times: int):
    script = bin_dir / "mpirun"
    script.write_text(f"#!/bin/sh\necho \"$*\" >> {log}\n"
                      f"[ $(wc -l < {log}) -gt {fail_times} ] || {{ echo 'rank 3 died' >&2; exit 1; }}\n")
    script.chmod(0o755)


def test_dry_run_prints_the_command_for_healthy_nodes(cpu_cluster, capsys):
    env_file, efs, _ = cpu_cluster
    assert run.main(["--cluster-env", str(env_file), "--dry-run", "TRAIN.BATCH_SIZE_PER_GPU=4"],
                    runner=health.LocalRunner()) == 0
    out = capsys.readouterr().out
    assert "2 of 2 nodes healthy" in out
    assert "attempt 1: 2 node(s), 2 rank(s)" in out
    assert f"--hostfile {efs}/logs/maskrcnn/hostfile" in out
    assert f"--logdir {efs}/logs/maskrcnn --config DATA.BASEDIR={efs}/data/coco TRAIN.BATCH_SIZE_PER_GPU=4" in out
    assert not (efs / "logs").exists()  # a dry run writes nothing


def test_failed_training_is_resumed_on_the_healthy_nodes(cpu_cluster, tmp_path, capsys):
    env_file, efs, bin_dir = cpu_cluster
    log = tmp_path / "mpirun.log"
    _fake_mpirun(bin_dir, log, fail_times=1)
    rc = run.main(["--cluster-env", str(env_file), "--restart-wait", "0", "--run-name", "r1"],
                  runner=health.LocalRunner())
    assert rc == 0
    calls = log.read_text().splitlines()
    assert len(calls) == 2 and calls[0] == calls[1]  # same logdir: training.train resumes from it
    assert f"--logdir {efs}/logs/r1" in calls[1]
    hostfile = (efs / "logs" / "r1" / "hostfile").read_text().splitlines()
    assert [line.split()[1] for line in hostfile] == ["slots=1", "slots=1"]
    assert "resuming from the latest checkpoint" in capsys.readouterr().err


def test_gives_up_after_max_restarts_with_the_exit_status(cpu_cluster, tmp_path, capsys):
    env_file, _, bin_dir = cpu_cluster
    _fake_mpirun(bin_dir, tmp_path / "mpirun.log", fail_times=99)
    rc = run.main(["--cluster-env", str(env_file), "--restart-wait", "0", "--max-restarts", "1"],
                  runner=health.LocalRunner())
    assert rc == 1
    assert "after 2 attempt(s); rerun the same command to resume" in capsys.readouterr().err


def test_unhealthy_master_stops_before_launch(cpu_cluster, monkeypatch, capsys):
    env_file, _, _ = cpu_cluster
    monkeypatch.setattr(health, "efs_marker", _marker_nobody_sees)
    assert run.main(["--cluster-env", str(env_file), "--dry-run"], runner=health.LocalRunner()) == 2
    assert "the master node failed its health check" in capsys.readouterr().err


def test_efa_only_when_every_node_has_it():
    nodes = [ClusterNode("i-1", "10.0.0.1", "p4d.24xlarge", "master", 8, True),
             ClusterNode("i-2", "10.0.0.2", "p4d.24xlarge", "worker", 8, False)]
    _, cmd = run.build_command(nodes, logdir="/efs/logs/x", data_dir="/efs/data/coco", overrides=[], ssh_port=2222)
    assert "FI_PROVIDER=efa" not in cmd
    hosts, cmd = run.build_command([n.__class__(**{**n.__dict__, "efa": True}) for n in nodes],
                                   logdir="/efs/logs/x", data_dir="/efs/data/coco", overrides=[], ssh_port=2222)
    assert "FI_PROVIDER=efa" in cmd and cmd[cmd.index("-np") + 1] == "16"
    assert hosts == "10.0.0.1 slots=8\n10.0.0.2 slots=8\n"
    assert format_command(cmd).startswith("mpirun --allow-run-as-root -np 16 --hostfile /efs/logs/x/hostfile")


def test_configuration_errors_are_not_retried(cpu_cluster, tmp_path, capsys):
    env_file, _, bin_dir = cpu_cluster
    log = tmp_path / "mpirun.log"
    (bin_dir / "mpirun").write_text(f"#!/bin/sh\necho \"$*\" >> {log}\nexit 2\n")
    (bin_dir / "mpirun").chmod(0o755)
    assert run.main(["--cluster-env", str(env_file), "--restart-wait", "0"], runner=health.LocalRunner()) == 2
    assert len(log.read_text().splitlines()) == 1
    assert "restarting would not help" in capsys.readouterr().err


def test_missing_dataset_is_named_before_anything_starts(cpu_cluster, capsys):
    env_file, efs, _ = cpu_cluster
    assert run.main(["--cluster-env", str(env_file), "--data-dir", str(efs / "nope")],
                    runner=health.LocalRunner()) == 2
    assert f"no COCO dataset at {efs / 'nope'}" in capsys.readouterr().err


def _record_ranks(efs: Path, run_name: str, ranks: int):
    """What training.train's rank 0 leaves in the log directory: the finalized config."""
    logdir = efs / "logs" / run_name
    logdir.mkdir(parents=True)
    (logdir / "config.json").write_text(json.dumps({"TRAIN": {"NUM_GPUS": ranks, "BATCH_SIZE_PER_GPU": 2}}))


def test_resume_on_fewer_ranks_waits_then_names_the_flag(cpu_cluster, tmp_path, capsys):
    env_file, efs, bin_dir = cpu_cluster
    _record_ranks(efs, "r3", 3)  # the run trained on 3 ranks; the cluster has 2 nodes now
    _fake_mpirun(bin_dir, tmp_path / "mpirun.log", fail_times=0)
    rc = run.main(["--cluster-env", str(env_file), "--run-name", "r3", "--restart-wait", "0.1", "--node-wait", "0.3"],
                  runner=health.LocalRunner())
    err = capsys.readouterr().err
    assert rc == 2
    assert not (tmp_path / "mpirun.log").exists()  # nothing started on the wrong rank count
    assert "the run trained on 3 ranks, 2 are healthy now: waiting for the cluster to be whole" in err
    assert "pass --allow-fewer-ranks to continue anyway" in err


def test_allow_fewer_ranks_continues_and_says_what_changes(cpu_cluster, tmp_path, capsys):
    env_file, efs, bin_dir = cpu_cluster
    _record_ranks(efs, "r3", 3)
    _fake_mpirun(bin_dir, tmp_path / "mpirun.log", fail_times=0)
    assert run.main(["--cluster-env", str(env_file), "--run-name", "r3", "--allow-fewer-ranks"],
                    runner=health.LocalRunner()) == 0
    assert "continuing on 2 of the run's 3 ranks (--allow-fewer-ranks)" in capsys.readouterr().err
    assert " -np 2 " in (tmp_path / "mpirun.log").read_text()


def test_resume_keeps_the_recorded_rank_count_on_a_bigger_cluster(cpu_cluster, tmp_path, capsys):
    env_file, efs, bin_dir = cpu_cluster
    _record_ranks(efs, "r1", 1)  # trained on the master alone; a worker has joined since
    _fake_mpirun(bin_dir, tmp_path / "mpirun.log", fail_times=0)
    assert run.main(["--cluster-env", str(env_file), "--run-name", "r1"], runner=health.LocalRunner()) == 0
    assert " -np 1 " in (tmp_path / "mpirun.log").read_text()
    assert len((efs / "logs" / "r1" / "hostfile").read_text().splitlines()) == 1


def test_waits_until_the_cluster_is_whole_again():
    master = ClusterNode("i-1", "10.0.0.1", "c5.xlarge", "master", 0)
    worker = ClusterNode("i-2", "10.0.0.2", "c5.xlarge", "worker", 0)
    healthy = iter([[master], [master], [master, worker]])  # the worker comes back at the third check
    slept = []
    ok = run.wait_for_ranks(lambda: [master, worker], lambda nodes: (next(healthy), "table"), wanted=2,
                            allow_fewer=False, wait_s=100, poll_s=5, clock=lambda: 5 * len(slept),
                            sleep=slept.append)
    assert ok == [master, worker] and slept == [5, 5]


# --- where training reads the dataset: /fsx, else a copy on each node's NVMe, else EFS ----------

class _NodesWithOwnNvme(health.LocalRunner):
    """Each node has its own NVMe: this machine stands in for every node, so a node's copy goes to
    <nvme>/<host> (what the node sees at <nvme>). Everything else runs unchanged."""

    def __init__(self, nvme: Path):
        self.nvme = str(nvme)

    def run(self, host, argv, timeout):
        own = str(Path(self.nvme, host))
        return super().run(host, [a.replace(self.nvme, own, 1) if a.startswith(self.nvme) else a
                                  for a in argv], timeout)


def _coco(root: Path) -> Path:
    (root / "annotations").mkdir(parents=True, exist_ok=True)
    (root / "annotations" / "instances_train2017.json").write_text('{"images": []}')
    (root / "train2017").mkdir(exist_ok=True)
    for i in range(40):
        (root / "train2017" / f"{i:012d}.jpg").write_bytes(bytes([i]) * (1000 + i))
    (root / "empty").mkdir(exist_ok=True)
    return root


def test_data_is_read_from_fsx_first_then_nvme_then_efs(tmp_path):
    efs, fsx, nvme = tmp_path / "efs", tmp_path / "fsx", tmp_path / "nvme"
    _coco(efs / "data" / "coco")
    env = {"EFS_MOUNT": str(efs), "FSX_MOUNT": str(fsx), "LOCAL_NVME": str(nvme)}
    staged = str(nvme / "maskrcnn-data" / str(efs / "data" / "coco").lstrip("/"))
    # A Lustre file system without the dataset (nothing under s3://bucket/data/coco yet): EFS's
    # copy, staged to the NVMe.
    assert run.choose_data(env, data_dir=None, stage_to_nvme=True) == run.DataPlan(
        train_dir=staged, stage_from=str(efs / "data" / "coco"))
    _coco(fsx / "coco")
    assert run.choose_data(env, data_dir=None, stage_to_nvme=True) == run.DataPlan(str(fsx / "coco"))
    no_fsx = {k: v for k, v in env.items() if k != "FSX_MOUNT"}
    assert run.choose_data(no_fsx, data_dir=None, stage_to_nvme=False) == run.DataPlan(
        str(efs / "data" / "coco"))
    assert run.choose_data({**no_fsx, "LOCAL_NVME": ""}, data_dir=None, stage_to_nvme=True) == run.DataPlan(
        str(efs / "data" / "coco"))
    # An explicit --data-dir is copied as well, unless it is on Lustre or already on the NVMe.
    assert run.choose_data(env, data_dir=str(fsx / "coco"), stage_to_nvme=True).stage_from is None
    assert run.choose_data(env, data_dir=str(nvme / "mine"), stage_to_nvme=True).stage_from is None


def test_dataset_is_copied_to_each_nodes_nvme_once_and_read_there(cpu_cluster, tmp_path, capsys):
    env_file, efs, bin_dir = cpu_cluster
    coco = _coco(efs / "data" / "coco")
    nvme = tmp_path / "nvme"
    env_file.write_text(env_file.read_text() + f"LOCAL_NVME={nvme}\n")
    log = tmp_path / "mpirun.log"
    _fake_mpirun(bin_dir, log, fail_times=0)
    runner = _NodesWithOwnNvme(nvme)
    staged = nvme / "maskrcnn-data" / str(coco).lstrip("/")

    assert run.main(["--cluster-env", str(env_file), "--run-name", "r1"], runner=runner) == 0
    out = capsys.readouterr().out
    assert log.read_text().endswith(f"--config DATA.BASEDIR={staged}\n")
    hosts = sorted(p.name for p in nvme.iterdir())
    assert len(hosts) == 2                       # one copy per node
    for host in hosts:
        copy = Path(str(staged).replace(str(nvme), str(nvme / host), 1))
        files = sorted(p.relative_to(copy).as_posix() for p in copy.rglob("*") if p.is_file())
        assert files == sorted([".maskrcnn-staged", "annotations/instances_train2017.json",
                                *(f"train2017/{i:012d}.jpg" for i in range(40))])
        assert (copy / "train2017" / "000000000039.jpg").read_bytes() == bytes([39]) * 1039
        assert (copy / "empty").is_dir() and not Path(f"{copy}.partial").exists()
    assert out.count(": staged") == 2

    # The next run finds both copies complete and current: nothing is copied again.
    assert run.main(["--cluster-env", str(env_file), "--run-name", "r2"], runner=runner) == 0
    assert capsys.readouterr().out.count(": already staged") == 2

    # A file added on EFS makes the copies stale: they are brought up to date.
    (coco / "train2017" / "000000000099.jpg").write_bytes(b"new")
    assert run.main(["--cluster-env", str(env_file), "--run-name", "r3"], runner=runner) == 0
    assert capsys.readouterr().out.count(": staged") == 2
    for host in hosts:
        copy = Path(str(staged).replace(str(nvme), str(nvme / host), 1))
        assert (copy / "train2017" / "000000000099.jpg").read_bytes() == b"new"

    # --no-stage-to-nvme reads EFS.
    assert run.main(["--cluster-env", str(env_file), "--run-name", "r4", "--no-stage-to-nvme"],
                    runner=runner) == 0
    assert log.read_text().endswith(f"--config DATA.BASEDIR={coco}\n")


def test_a_failed_copy_names_the_node_and_starts_nothing(cpu_cluster, tmp_path, capsys):
    env_file, efs, bin_dir = cpu_cluster
    _coco(efs / "data" / "coco")
    nvme = tmp_path / "nvme"
    nvme.write_text("not a directory")            # the copy cannot create its target
    env_file.write_text(env_file.read_text() + f"LOCAL_NVME={nvme}\n")
    _fake_mpirun(bin_dir, tmp_path / "mpirun.log", fail_times=0)
    assert run.main(["--cluster-env", str(env_file)], runner=health.LocalRunner()) == 2
    err = capsys.readouterr().err
    assert "copying the dataset to local NVMe failed on " in err and "--no-stage-to-nvme" in err
    assert not (tmp_path / "mpirun.log").exists()


def test_lustre_directory_matches_where_staging_uploads():
    """/fsx shows s3://bucket/<LUSTRE_IMPORT_PREFIX>/; staging uploads COCO to data/coco."""
    from infra import outputs
    from launch.staging.__main__ import DEFAULT_PREFIX
    assert f"{outputs.LUSTRE_IMPORT_PREFIX}/{outputs.LUSTRE_COCO_DIR}" == DEFAULT_PREFIX
