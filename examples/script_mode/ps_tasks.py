"""Start the parameter-server tasks of one machine as processes and wait for them.

Used twice: ``script_mode.local`` runs every task of the cluster on this machine, and
``script_mode.sagemaker_ps`` runs on each SageMaker instance the tasks that instance owns.
Servers (ps, workers) start before the chief, which connects to all of them. A server that dies
while the chief trains would leave the chief waiting for it forever (TF2's coordinator retries
lost workers), so that ends the run with the server's log.
"""
from __future__ import annotations

import subprocess
import time
from pathlib import Path

from script_mode import cluster as cl

# Workers and ps stop by themselves a few seconds after the chief's port closes.
SERVER_GRACE_S = 20


class TaskFailed(RuntimeError):
    """A task process failed or the run timed out; the message carries the log to read."""


def _tail(path: Path | None, lines: int = 30) -> str:
    if path is None:
        return "(its output is above)"
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def stop(procs) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def run_tasks(command: list[str], cluster: dict[str, list[str]], tasks: list[cl.Task],
              env: dict[str, str], log_dir: Path | None, timeout_s: float) -> int:
    """Run ``tasks`` of ``cluster``, each as ``command`` with its own TF_CONFIG; return the exit
    code of the chief if it is among them, else the worst exit code of the servers.

    With ``log_dir`` each server writes ``<type>-<index>.log`` there (the chief always prints to
    this process's output); without it every task prints here (SageMaker sends it to CloudWatch).
    """
    servers: dict[str, subprocess.Popen] = {}
    logs: dict[str, Path | None] = {}
    chief = None
    try:
        for task in sorted((t for t in tasks if t.type != cl.CHIEF), key=lambda t: t.type != cl.PS):
            name = f"{task.type}-{task.index}"
            logs[name] = log_dir / f"{name}.log" if log_dir else None
            out = open(logs[name], "w") if logs[name] else None
            try:
                servers[name] = subprocess.Popen(
                    command, env={**env, "TF_CONFIG": cl.tf_config(cluster, task)},
                    stdout=out, stderr=subprocess.STDOUT if out else None)
            finally:
                if out:
                    out.close()
        if any(t.type == cl.CHIEF for t in tasks):
            chief = subprocess.Popen(
                command, env={**env, "TF_CONFIG": cl.tf_config(cluster, cl.Task(cl.CHIEF, 0))})
        deadline = time.monotonic() + timeout_s
        while (chief.poll() is None) if chief else any(p.poll() is None for p in servers.values()):
            for name, p in servers.items():
                code = p.poll()
                if code not in (None, 0) or (chief and code is not None):
                    raise TaskFailed(f"{name} exited with code {code} before the chief finished; "
                                     f"its log ({logs[name] or 'above'}):\n{_tail(logs[name])}")
            if time.monotonic() > deadline:
                raise TaskFailed(f"the ps tasks took longer than {timeout_s:.0f} s"
                                 + (f"; logs in {log_dir}" if log_dir else ""))
            time.sleep(0.5)
        if chief:
            end = time.monotonic() + SERVER_GRACE_S
            while any(p.poll() is None for p in servers.values()) and time.monotonic() < end:
                time.sleep(0.5)
            return chief.returncode
        return max((p.returncode for p in servers.values()), key=abs, default=0)
    finally:
        stop([p for p in [chief, *servers.values()] if p is not None])
