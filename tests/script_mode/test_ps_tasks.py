"""The ps task runner with stand-in scripts (no TensorFlow): each task gets its own TF_CONFIG,
a server that dies stops the run with its log, a stuck run times out, and a SageMaker instance
starts exactly its own tasks with the job's hyperparameters."""
import json
import textwrap

import pytest

from script_mode import data, local, ps_tasks, sagemaker_ps

# Records its TF_CONFIG and arguments, then behaves as its role is told to by the environment.
STAND_IN = textwrap.dedent("""
    import json, os, sys, time
    task = json.loads(os.environ["TF_CONFIG"])["task"]
    name = f"{task['type']}-{task['index']}"
    with open(os.path.join(os.environ["OUT_DIR"], name + ".json"), "w") as f:
        json.dump({"tf_config": json.loads(os.environ["TF_CONFIG"]), "argv": sys.argv[1:]}, f)
    print(name, "log line", flush=True)
    key = name.replace("-", "_").upper()
    time.sleep(float(os.environ.get("SLEEP_" + key, os.environ.get("SLEEP_" + task["type"].upper(), "0"))))
    sys.exit(int(os.environ.get("EXIT_" + key, "0")))
""")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """A small digits file where the runner looks: the stand-ins never read it, and without one the
    runner generates the default 14,000 digits (seconds) for every run."""
    d = tmp_path_factory.mktemp("digits")
    data.ensure(d / data.DATA_FILE, n_train=20, n_test=10)
    return d


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setenv("OUT_DIR", str(out))
    return script, out


def _plan(tmp_path, script, data_dir, **kw):
    return local.make_plan("ps", workers=2, ps=1, script=script, data_dir=data_dir,
                           run_dir=tmp_path / "run", script_args=["--epochs", "1"], **kw)


def test_every_task_gets_its_own_tf_config(tmp_path, stand_in, data_dir, monkeypatch):
    script, out = stand_in
    monkeypatch.setenv("SLEEP_CHIEF", "1")
    monkeypatch.setenv("SLEEP_WORKER", "4")  # servers outlive the chief, then stop by themselves
    monkeypatch.setenv("SLEEP_PS", "4")
    result = local.run(_plan(tmp_path, script, data_dir))
    assert result.returncode == 0
    seen = {p.stem: json.loads(p.read_text()) for p in out.iterdir()}
    assert sorted(seen) == ["chief-0", "ps-0", "worker-0", "worker-1"]
    clusters = {json.dumps(s["tf_config"]["cluster"], sort_keys=True) for s in seen.values()}
    assert len(clusters) == 1  # one cluster, four different tasks
    assert all(s["argv"] == ["--epochs", "1"] for s in seen.values())
    assert "worker-1 log line" in (tmp_path / "run" / "logs" / "worker-1.log").read_text()


def test_a_server_that_dies_stops_the_run_with_its_log(tmp_path, stand_in, data_dir, monkeypatch):
    script, _ = stand_in
    for role in ("CHIEF", "WORKER", "PS"):
        monkeypatch.setenv(f"SLEEP_{role}", "60")
    monkeypatch.setenv("SLEEP_WORKER_1", "0.5")
    monkeypatch.setenv("EXIT_WORKER_1", "3")
    with pytest.raises(ps_tasks.TaskFailed, match=r"worker-1 exited with code 3(.|\n)*"
                                                  r"worker-1 log line"):
        local.run(_plan(tmp_path, script, data_dir, timeout_s=50))


def test_a_stuck_run_times_out(tmp_path, stand_in, data_dir, monkeypatch, capsys):
    script, _ = stand_in
    monkeypatch.setenv("SLEEP_CHIEF", "60")
    monkeypatch.setenv("SLEEP_WORKER", "60")
    monkeypatch.setenv("SLEEP_PS", "60")
    code = local.main(["--strategy", "ps", "--workers", "2", "--script", str(script),
                       "--data-dir", str(data_dir), "--run-dir", str(tmp_path / "run"),
                       "--timeout", "3"])
    assert code == 1
    assert "took longer than 3 s" in capsys.readouterr().err


def test_a_sagemaker_instance_starts_its_own_tasks(tmp_path, stand_in, monkeypatch):
    script, out = stand_in
    monkeypatch.setattr(sagemaker_ps, "TRAIN_SCRIPT", script)
    environ = {"SM_HOSTS": '["algo-1", "algo-2", "algo-3"]', "SM_CURRENT_HOST": "algo-3",
               "OUT_DIR": str(out), "PATH": "/usr/bin:/bin"}
    assert sagemaker_ps.main(["--strategy", "ps", "--epochs", "6"], environ=environ) == 0
    seen = {p.stem: json.loads(p.read_text()) for p in out.iterdir()}
    assert sorted(seen) == ["ps-2", "worker-1"]  # algo-3: its parameter server and worker 1
    assert seen["worker-1"]["tf_config"]["cluster"]["chief"] == ["algo-1:2222"]
    assert seen["ps-2"]["argv"] == ["--strategy", "ps", "--epochs", "6"]
