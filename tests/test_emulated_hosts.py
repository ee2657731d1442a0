"""The emulated-host harness itself (tests/emulated_hosts.py): what the multi-host tests rely on."""
import subprocess
import sys
from pathlib import Path

import pytest

from emulated_hosts import EmulatedHosts, clean_leftovers, missing_requirements
from machine import require

TWO = {"algo-1": "10.77.9.11", "algo-2": "10.77.9.12"}
CONNECT = "import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2)"


def _namespaces() -> set[str]:
    return {line.split()[0] for line in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                                       text=True).stdout.splitlines() if line.strip()}


def test_hosts_have_own_names_files_processes_and_share_what_is_shared(emulated_hosts, tmp_path):
    efs = tmp_path / "efs"
    efs.mkdir()
    hosts = emulated_hosts(TWO, private=["/opt/ml"], shared={"/mnt/emulated-efs": efs})
    one, two = hosts["algo-1"], hosts["algo-2"]
    one.path("/opt/ml/input").mkdir()
    assert one.run(["hostname"]).stdout.strip() == "algo-1"
    assert two.run(["hostname"]).stdout.strip() == "algo-2"
    assert one.run(["ls", "/opt/ml"]).stdout.split() == ["input"]
    assert two.run(["ls", "/opt/ml"]).stdout.split() == []
    two.run(["sh", "-c", "echo from-two > /mnt/emulated-efs/f; echo private > /tmp/p"], check=True)
    assert (efs / "f").read_text() == "from-two\n"
    assert one.run(["cat", "/mnt/emulated-efs/f"]).stdout == "from-two\n"
    assert two.path("/tmp/p").read_text() == "private\n" and not one.path("/tmp/p").exists()
    # Each host sees only its own processes (PID 1 is its init), as in a container.
    sleeper = one.popen(["sleep", "60"])
    try:
        assert "sleep 60" not in two.run(["ps", "-eo", "args"]).stdout
        assert "sleep 60" in one.run(["ps", "-eo", "args"]).stdout
    finally:
        sleeper.kill()


def test_hosts_reach_each_other_by_name_and_nothing_else(emulated_hosts):
    hosts = emulated_hosts(TWO)
    one, two = hosts["algo-1"], hosts["algo-2"]
    server = one.popen([sys.executable, "-c",
                        "import socket; s = socket.create_server(('0.0.0.0', 7777)); print('up', flush=True);"
                        " s.accept()"], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().strip() == "up"
        assert two.run([sys.executable, "-c", CONNECT, "algo-1", "7777"]).returncode == 0
        # A host's loopback is its own; the machine's network has no leg in the hosts' subnet.
        assert two.run([sys.executable, "-c", CONNECT, "127.0.0.1", "7777"]).returncode != 0
        assert "10.77.9." not in subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout
        assert not [line for line in two.run(["ip", "-o", "link"]).stdout.splitlines()
                    if ": lo:" not in line and ": eth0@" not in line]
    finally:
        server.kill()


def test_stop_and_disconnect(emulated_hosts):
    hosts = emulated_hosts(TWO)
    one, two = hosts["algo-1"], hosts["algo-2"]
    job = one.popen(["sleep", "60"])
    main = two.popen(["sh", "-c", "sleep 60 & exit 3"], stop_host_on_exit=True)
    assert main.wait(timeout=10) == 3
    assert "sleep 60" not in two.run(["ps", "-eo", "args"]).stdout   # died with the main process
    one.stop()
    assert job.wait(timeout=10) != 0
    assert one.run(["true"]).returncode == 0                          # the host itself is still there
    two.disconnect()
    # Nothing listens on algo-2:22, yet no "connection refused" comes back: the packets vanish.
    timed_out = one.run([sys.executable, "-c", CONNECT, "algo-2", "22"])
    assert "timed out" in timed_out.stderr
    two.reconnect()
    # Back on the bridge, algo-2 answers again (once ARP resolves anew: allow a few tries).
    answers = [one.run([sys.executable, "-c", CONNECT, "algo-2", "22"]).stderr for _ in range(5)]
    assert any("Connection refused" in a for a in answers), answers


def test_teardown_on_failure_and_leftovers(tmp_path):
    require(missing_requirements())
    probe = Path("/opt/emulated-hosts-probe")
    # A run of this test beside another harness leaves the probe in place (see below); this run
    # can only be asked to remove what it made.
    made_here = not probe.exists()
    hosts = EmulatedHosts(TWO, workdir=tmp_path / "h", private=[str(probe / "ml")])
    with pytest.raises(RuntimeError, match="the test failed"):
        with hosts:
            names = {h.netns for h in hosts} | {hosts.bridge_netns}
            assert names <= _namespaces()
            assert (probe / "ml").is_dir()        # its mount point, made on the machine
            others_running = any(n.startswith("emh") for n in _namespaces() - names)
            hosts["algo-1"].popen(["sleep", "60"])
            raise RuntimeError("the test failed")
    assert not names & _namespaces()
    if made_here and not others_running:   # another harness run (a parallel session) may still use it
        assert not probe.exists()
    # A crashed run's namespaces (its pid is gone) are removed when the next harness starts.
    subprocess.run(["ip", "netns", "add", "emh999999999x1-0"], check=True)
    assert "emh999999999x1-0" in clean_leftovers()
    assert "emh999999999x1-0" not in _namespaces()
    with pytest.raises(ValueError, match="not in one /24 subnet"):
        EmulatedHosts({"a": "10.77.9.1", "b": "10.78.9.1"}, workdir=tmp_path)


def test_hosts_see_the_repository_and_python_even_from_a_checkout_under_tmp(emulated_hosts, tmp_path):
    """A CI clone may live under /tmp, which every host has its own copy of: the repository and the
    interpreter must stay visible there (they were hidden once, and every host command failed)."""
    repo = Path(__file__).resolve().parent.parent
    hosts = emulated_hosts({"algo-1": "10.77.9.21"})
    probe = hosts["algo-1"].run([sys.executable, "-c", "import sys; print(sys.prefix)"], cwd=str(repo))
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip() == sys.prefix
    assert hosts["algo-1"].run(["test", "-f", str(repo / "tests" / "emulated_hosts.py")]).returncode == 0
    # A throwaway "checkout" under /tmp, named as kept, is seen through the host's private /tmp.
    outside = Path("/tmp") / f"emh-keep-{tmp_path.name}"
    outside.mkdir(exist_ok=True)
    (outside / "marker").write_text("seen\n")
    try:
        host = emulated_hosts({"algo-2": "10.77.9.22"}, keep=[str(outside)])["algo-2"]
        assert host.run(["cat", str(outside / "marker")]).stdout == "seen\n"
        host.run(["sh", "-c", "echo private > /tmp/elsewhere"], check=True)
        assert not Path("/tmp/elsewhere").exists()
    finally:
        import shutil
        shutil.rmtree(outside, ignore_errors=True)
