"""Emulated hosts: N "machines" on this one, for end-to-end multi-host tests (docs/launch.md, "Emulated hosts").

A host is a set of Linux namespaces the harness creates itself (root only):
- its own network namespace with one interface ``eth0`` at the address the caller chose, plugged into a
  bridge that lives in a namespace of its own, so no test traffic and no interface touches the root
  namespace's network; ``lo`` is up;
- its own UTS namespace (``hostname`` is the host's name) and PID namespace (``ps``/psutil see only
  the host's processes, as in a container: sagemaker-training's worker looks for ``orted`` that way);
- its own mount namespace where these paths are the host's own, backed by a directory on this machine
  (``Host.path(p)`` gives it, so a test writes inputs before and reads results after):
  ``/etc/hosts`` (every host's name and address), ``/etc/hostname``, ``/etc/environment``,
  ``/etc/ssh`` (the machine's sshd config without host keys), ``/root/.ssh``, ``/tmp``, ``/run``,
  plus the caller's ``private`` paths (``/opt/ml`` for SageMaker, ``/etc/maskrcnn`` for EC2 nodes);
  ``/dev/shm`` is a fresh tmpfs;
- the caller's ``shared`` directories (what AWS shares, e.g. EFS) bind-mounted at the same path on
  every host.
Everything else is this machine's filesystem, seen by all hosts as one image's files would be (the
repository and the venv; note that, unlike containers, writes there are seen by every host).

API::

    with EmulatedHosts({"algo-1": "10.77.0.11", "algo-2": "10.77.0.12"}, workdir=tmp_path / "hosts",
                       private=["/opt/ml"], shared={"/mnt/efs": efs_dir}) as hosts:
        hosts["algo-1"].path("/opt/ml/input/config").mkdir(parents=True)     # write the host's files
        proc = hosts["algo-1"].popen(["python", "-m", "x"], env=env, stop_host_on_exit=True)
        out = hosts["algo-2"].run(["hostname"])                                # CompletedProcess, text
        hosts["algo-2"].stop()          # its processes die (a crashed container); the host stays up
        hosts["algo-2"].disconnect()    # its link drops silently (a machine that vanished)

In tests use the ``emulated_hosts`` fixture (tests/conftest.py): it skips unless run as root with
``ip``/``unshare``/``nsenter``, and tears the hosts down after the test, also when it fails.
``close()`` kills every process in every namespace it made and deletes the namespaces; namespaces
left by a run that crashed (its pid gone) are deleted when the next harness starts.
By hand: ``python tests/emulated_hosts.py algo-1=10.77.0.11 algo-2=10.77.0.12 --private /opt/ml``
starts hosts, prints how to enter them, and tears them down on Ctrl-C.
"""
from __future__ import annotations

import ipaddress
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Mapping, Sequence

# Namespace names: PREFIX<pid of the creating process>x<serial>-<index>, so leftovers of a dead run
# are recognisable and a live run's (another pytest session on the machine) are left alone.
NS_PREFIX = "emh"
_NS_PATTERN = re.compile(rf"^{NS_PREFIX}(\d+)x\d+-\w+$")
# Paths every host has its own copy of (directories; the files below separately).
BASE_PRIVATE_DIRS = ("/etc/ssh", "/root/.ssh")
BASE_PRIVATE_FILES = ("/etc/hosts", "/etc/hostname", "/etc/environment")
# Mounted last: binding them first would hide sources that live under them (pytest's tmp_path).
LAST_PRIVATE_DIRS = ("/run", "/tmp")
REQUIRED_TOOLS = ("ip", "unshare", "nsenter")
_serial = 0

# PID 1 of a host: reaps orphans (sshd's and mpirun's children end up here) so psutil never sees
# zombie ``orted`` processes, and otherwise waits to be killed.
_INIT = ("import os, time\n"
         "while True:\n"
         "    try:\n"
         "        os.wait()\n"
         "    except ChildProcessError:\n"
         "        time.sleep(0.5)\n")


class HarnessError(RuntimeError):
    """The emulated hosts could not be set up; the message says which step failed."""


def machine_paths_to_keep(extra: Sequence[str] = ()) -> list[str]:
    """What every host must see as on the machine although it lies under a private /tmp or /run:
    the repository, the Python installation (a CI checkout may well live under /tmp) and ``extra``."""
    wanted = {Path(__file__).resolve().parent.parent, Path(sys.prefix).resolve(),
              Path(sys.base_prefix).resolve(), Path(sys.executable).resolve().parent.parent,
              *(Path(p).resolve() for p in extra)}
    under = sorted(str(p) for p in wanted
                   if any(str(p) == d or str(p).startswith(d + "/") for d in LAST_PRIVATE_DIRS))
    if any(p in LAST_PRIVATE_DIRS for p in under):
        raise HarnessError(f"{under}: the repository or Python must not be /tmp or /run itself")
    # the outermost of nested paths is enough
    return [p for p in under if not any(p != q and p.startswith(q + "/") for q in under)]


def missing_requirements() -> str | None:
    """Why emulated hosts cannot run here (for a skip reason), or None."""
    if os.geteuid() != 0:
        return "emulated hosts need root (network, mount, UTS and PID namespaces)"
    missing = [t for t in REQUIRED_TOOLS if shutil.which(t) is None]
    if missing:
        return f"emulated hosts need {', '.join(missing)} (Debian: iproute2, util-linux; scripts/install.sh)"
    return None


def _sh(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(args), capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise HarnessError(f"{shlex.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def _netns_pids(ns: str) -> list[int]:
    proc = _sh("ip", "netns", "pids", ns, check=False)
    return [int(p) for p in proc.stdout.split()] if proc.returncode == 0 else []


def _kill_netns(ns: str, keep: Sequence[int] = ()) -> None:
    """SIGKILL every process whose network namespace is ``ns`` (except ``keep``), until none is left."""
    deadline = time.time() + 10
    while True:
        pids = [p for p in _netns_pids(ns) if p not in keep]
        if not pids or time.time() > deadline:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)


def _delete_netns(ns: str) -> None:
    _kill_netns(ns)
    _sh("ip", "netns", "delete", ns, check=False)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def clean_leftovers() -> list[str]:
    """Delete namespaces this harness made in runs whose process is gone; returns their names."""
    removed = []
    for line in _sh("ip", "netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        m = _NS_PATTERN.match(name)
        if m and not _pid_alive(int(m.group(1))):
            _delete_netns(name)
            removed.append(name)
    return removed


class Host:
    """One emulated host; made by :class:`EmulatedHosts`."""

    def __init__(self, *, name: str, address: str, netns: str, bridge_port: str, bridge_netns: str, root: Path):
        self.name = name
        self.address = address
        self.netns = netns
        self.root = root            # this host's private files on the machine: root/<path inside the host>
        self._bridge_port = bridge_port
        self._bridge_netns = bridge_netns
        self._holder: subprocess.Popen | None = None   # `unshare` (in the root PID namespace)
        self.init_pid: int | None = None                # the host's PID 1, as this machine sees it

    def path(self, inside: str) -> Path:
        """Where a private path of this host (``/opt/ml/...``, ``/root/.ssh``, ``/tmp/...``) lives on the machine."""
        if not inside.startswith("/"):
            raise ValueError(f"{inside!r}: give an absolute path inside the host")
        return self.root / inside.lstrip("/")

    def command(self, cmd: Sequence[str], *, cwd: str = "/") -> list[str]:
        """``cmd`` wrapped to run inside this host (its namespaces, working directory ``cwd`` there)."""
        if self.init_pid is None:
            raise HarnessError(f"host {self.name} is not running")
        return ["nsenter", "-t", str(self.init_pid), "-m", "-u", "-n", "-p", "--",
                "/bin/sh", "-c", 'cd "$0" && exec "$@"', cwd, *cmd]

    def popen(self, cmd: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str = "/",
              stop_host_on_exit: bool = False, **popen_kwargs) -> subprocess.Popen:
        """Start ``cmd`` in this host (``env``: its whole environment; default this process's).

        ``stop_host_on_exit``: when ``cmd`` ends, every other process of the host is killed, as when a
        container's main process exits (sshd and the like die with it); its exit status is kept.
        """
        if stop_host_on_exit:
            cmd = ["/bin/sh", "-c", '"$@"; rc=$?; kill -9 -1 2>/dev/null; exit $rc', "sh", *cmd]
        return subprocess.Popen(self.command(cmd, cwd=cwd), env=dict(os.environ if env is None else env),
                                **popen_kwargs)

    def run(self, cmd: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str = "/",
            timeout: float = 60, check: bool = False) -> subprocess.CompletedProcess:
        """Run ``cmd`` in this host to completion; output captured as text."""
        return subprocess.run(self.command(cmd, cwd=cwd), env=dict(os.environ if env is None else env),
                              capture_output=True, text=True, timeout=timeout, check=check)

    def stop(self) -> None:
        """Kill every process of the host but its PID 1 (the host stays, its network too)."""
        keep = [p for p in (self.init_pid, self._holder.pid if self._holder else None) if p]
        _kill_netns(self.netns, keep=keep)

    def disconnect(self) -> None:
        """Drop the host's link at the bridge: its peers' packets vanish without a reset, as when a
        machine dies; its processes keep running."""
        _sh("ip", "-n", self._bridge_netns, "link", "set", self._bridge_port, "down")

    def reconnect(self) -> None:
        _sh("ip", "-n", self._bridge_netns, "link", "set", self._bridge_port, "up")


class EmulatedHosts:
    """Hosts named and addressed by ``hosts`` (name -> IPv4, all in one ``prefix_len`` subnet).

    ``private``: absolute paths (directories) each host has its own copy of, empty at start (or
    seeded by the test through ``Host.path`` after ``start()``, before commands use them); missing
    mount points are created on this machine as empty directories and removed by ``close()``.
    ``shared``: path inside every host -> directory on this machine.
    ``workdir``: where the hosts' private files live (``workdir/<name>/...``).
    ``keep``: machine paths under /tmp or /run that hosts see as they are (the repository and Python
    always are).
    """

    def __init__(self, hosts: Mapping[str, str], *, workdir: Path, private: Sequence[str] = (),
                 shared: Mapping[str, os.PathLike | str] | None = None, prefix_len: int = 24,
                 keep: Sequence[str] = ()):
        global _serial
        if not hosts:
            raise ValueError("give at least one host: {name: address}")
        nets = {ipaddress.ip_interface(f"{a}/{prefix_len}").network for a in hosts.values()}
        if len(nets) != 1:
            raise ValueError(f"host addresses {sorted(hosts.values())} are not in one /{prefix_len} subnet")
        if len(set(hosts.values())) != len(hosts):
            raise ValueError(f"two hosts share an address: {dict(hosts)}")
        self.shared = {target: Path(src).resolve() for target, src in (shared or {}).items()}
        self.private = tuple(private)
        self.keep = tuple(keep)
        for target in (*self.private, *self.shared):
            if not target.startswith("/") or any(
                    target == d or target.startswith(d + "/") for d in LAST_PRIVATE_DIRS + ("/dev", "/proc")):
                raise ValueError(f"{target!r}: mount points must be absolute and outside /tmp, /run, /dev, /proc")
        for target, src in self.shared.items():
            if not src.is_dir():
                raise ValueError(f"shared directory {src} (for {target}) does not exist")
        self.workdir = Path(workdir).resolve()
        self.prefix_len = prefix_len
        _serial += 1
        self._tag = f"{NS_PREFIX}{os.getpid()}x{_serial}"
        self.bridge_netns = f"{self._tag}-br"
        self.hosts = {
            name: Host(name=name, address=address, netns=f"{self._tag}-{i}", bridge_port=f"p{i}",
                       bridge_netns=self.bridge_netns, root=self.workdir / name)
            for i, (name, address) in enumerate(hosts.items())}
        self._namespaces: list[str] = []
        self._made_dirs: list[Path] = []     # mount points this run created on the machine

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def __iter__(self):
        return iter(self.hosts.values())

    def __enter__(self) -> EmulatedHosts:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def etc_hosts(self) -> str:
        lines = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback"]
        lines += [f"{h.address} {h.name}" for h in self.hosts.values()]
        return "\n".join(lines) + "\n"

    def start(self) -> EmulatedHosts:
        reason = missing_requirements()
        if reason:
            raise HarnessError(reason)
        clean_leftovers()
        try:
            self._add_netns(self.bridge_netns)
            _sh("ip", "-n", self.bridge_netns, "link", "add", "br0", "type", "bridge")
            _sh("ip", "-n", self.bridge_netns, "link", "set", "br0", "up")
            for host in self.hosts.values():
                self._start_host(host)
        except BaseException:
            self.close()
            raise
        return self

    def _add_netns(self, ns: str) -> None:
        _sh("ip", "netns", "add", ns)
        self._namespaces.append(ns)
        _sh("ip", "-n", ns, "link", "set", "lo", "up")

    def _seed_private(self, host: Host) -> list[tuple[Path, str]]:
        """Create the host's private files on the machine; returns (source, target) bind mounts in order."""
        binds = []
        for target in (*BASE_PRIVATE_DIRS, *self.private, *LAST_PRIVATE_DIRS):
            src = host.path(target)
            src.mkdir(parents=True, exist_ok=True)
            binds.append((src, target))
        host.path("/root/.ssh").chmod(0o700)
        # sshd's configuration as installed, but no host keys: each host makes its own (ssh-keygen -A).
        if Path("/etc/ssh").is_dir():
            shutil.copytree("/etc/ssh", host.path("/etc/ssh"), dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("ssh_host_*"))
        for target in BASE_PRIVATE_FILES:
            host.path(target).parent.mkdir(parents=True, exist_ok=True)
        host.path("/etc/hosts").write_text(self.etc_hosts())
        host.path("/etc/hostname").write_text(host.name + "\n")
        host.path("/etc/environment").write_text("")
        # Files first (their sources are under workdir, maybe under /tmp), then the directories.
        return [(host.path(t), t) for t in BASE_PRIVATE_FILES] + binds

    def _start_host(self, host: Host) -> None:
        self._add_netns(host.netns)
        _sh("ip", "-n", self.bridge_netns, "link", "add", host._bridge_port, "type", "veth",
            "peer", "name", "eth0", "netns", host.netns)
        _sh("ip", "-n", self.bridge_netns, "link", "set", host._bridge_port, "master", "br0", "up")
        _sh("ip", "-n", host.netns, "addr", "add", f"{host.address}/{self.prefix_len}", "dev", "eth0")
        _sh("ip", "-n", host.netns, "link", "set", "eth0", "up")

        binds = self._seed_private(host)
        for target in (*BASE_PRIVATE_DIRS, *self.private, *self.shared):
            self._make_mount_point(Path(target))
        steps = [f"hostname {shlex.quote(host.name)}"]
        # The repository and Python, where they lie under /tmp or /run: bound into the host's own
        # copy first, so the private /tmp or /run (bound recursively) carries them along.
        for keep in machine_paths_to_keep(self.keep):
            host.path(keep).mkdir(parents=True, exist_ok=True)
            steps.append(f"mount --bind {shlex.quote(keep)} {shlex.quote(str(host.path(keep)))}")
        steps += [f"mount --bind {shlex.quote(str(src))} {shlex.quote(t)}" for t, src in self.shared.items()]
        steps += [f"mount {'--rbind' if t in LAST_PRIVATE_DIRS else '--bind'} {shlex.quote(str(src))} "
                  f"{shlex.quote(t)}" for src, t in binds]
        steps += ["mount -t tmpfs -o mode=1777,size=1g tmpfs /dev/shm", "echo ready",
                  f"exec {shlex.quote(sys.executable)} -c {shlex.quote(_INIT)}"]
        holder = subprocess.Popen(
            ["ip", "netns", "exec", host.netns, "unshare", "--uts", "--mount", "--pid", "--fork", "--mount-proc",
             "--propagation", "private", "--", "/bin/sh", "-ec", "\n".join(steps)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        host._holder = holder
        line = holder.stdout.readline().strip()
        if line != "ready":
            holder.kill()
            raise HarnessError(f"host {host.name} did not start: {holder.stderr.read().strip() or line}")
        deadline = time.time() + 10
        while host.init_pid is None:
            children = Path(f"/proc/{holder.pid}/task/{holder.pid}/children").read_text().split()
            if children:
                host.init_pid = int(children[0])
            elif time.time() > deadline:
                raise HarnessError(f"host {host.name}: no init process under unshare {holder.pid}")
            else:
                time.sleep(0.05)

    def _make_mount_point(self, target: Path) -> None:
        missing = [d for d in (target, *target.parents) if not d.exists()]
        target.mkdir(parents=True, exist_ok=True)
        self._made_dirs += [d for d in missing if d not in self._made_dirs]   # deepest first

    def _remove_mount_points(self) -> None:
        """Remove the empty mount points this run made (/opt/ml on a machine without one would make
        sagemaker-training outside the hosts use it), unless another run's hosts may still use them."""
        live = [name for name in _sh("ip", "netns", "list", check=False).stdout.split()
                if _NS_PATTERN.match(name) and not name.startswith(self._tag + "-")
                and _pid_alive(int(_NS_PATTERN.match(name).group(1)))]
        if live:
            return
        for d in self._made_dirs:
            try:
                d.rmdir()
            except OSError:
                pass        # something was written into it on the machine: leave it
        self._made_dirs.clear()

    def close(self) -> None:
        """Kill every process in the hosts and delete their namespaces (safe to call twice)."""
        for ns in reversed(self._namespaces):
            _delete_netns(ns)
        for host in self.hosts.values():
            if host._holder is not None:
                try:
                    host._holder.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    host._holder.kill()
                for stream in (host._holder.stdout, host._holder.stderr):
                    stream.close()
                host._holder = None
            host.init_pid = None
        self._namespaces.clear()
        self._remove_mount_points()


def _main(argv: list[str]) -> int:
    import argparse
    import tempfile

    p = argparse.ArgumentParser(description="Start emulated hosts until Ctrl-C (see the module docstring).")
    p.add_argument("hosts", nargs="+", metavar="NAME=ADDRESS")
    p.add_argument("--private", action="append", default=[], help="a path each host has its own copy of")
    p.add_argument("--shared", action="append", default=[], metavar="INSIDE=DIR", help="a directory all hosts share")
    p.add_argument("--workdir", help="where the hosts' private files go (default: a new temp directory)")
    a = p.parse_args(argv)
    hosts = dict(h.split("=", 1) for h in a.hosts)
    shared = dict(s.split("=", 1) for s in a.shared)
    workdir = Path(a.workdir or tempfile.mkdtemp(prefix="emulated-hosts-"))
    with EmulatedHosts(hosts, workdir=workdir, private=a.private, shared=shared) as eh:
        for h in eh:
            print(f"{h.name} {h.address}: files in {h.root}; enter with: "
                  f"nsenter -t {h.init_pid} -m -u -n -p -- bash", flush=True)
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
