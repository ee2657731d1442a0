"""Checkpoint before EC2 takes this node away, and resume when the capacity returns.

Runs on every cluster node, in the training container where the Slurm commands are:

    python -m launch.cluster.interruption            # polls every 5 s until stopped
    python -m launch.cluster.interruption --once     # one check (exit status below)

It watches for two notices:

- **A Spot interruption.** Two minutes before EC2 stops or terminates a Spot Instance it posts
  ``spot/instance-action`` in the instance metadata, ``{"action": "terminate", "time":
  "2017-09-18T08:22:00Z"}`` (``stop`` or ``hibernate`` for other interruption behaviours); while
  nothing is scheduled the item is absent (HTTP 404). AWS advises checking every 5 seconds.
- **The end of the Capacity Block this node runs in.** EC2 begins terminating a block's instances
  30 minutes before the block's end date (its EventBridge warning comes 40 minutes before). The
  instance metadata does not say which reservation an instance runs in, so the watcher asks EC2:
  DescribeInstances gives the instance's CapacityReservationId, DescribeCapacityReservations the
  reservation's type and EndDate. The end date is read again every few minutes, since a block can
  be extended; the watcher acts ``--block-margin-minutes`` (default 10) before terminations begin.

On a notice it acts once (a marker file in ``--state-dir`` remembers the notice, so neither a loop
nor a timer acts twice):

1. drains this node in Slurm, so that no new attempt of a job lands on it;
2. requeues every job running on it (``scontrol requeue``): Slurm sends the job SIGTERM, training
   saves a checkpoint at its next step and exits within KillWait, and the requeued job starts again
   from that checkpoint once enough nodes are up (the worker group replaces a reclaimed worker);
3. tells the alerts topic (ALERTS_TOPIC_ARN in cluster.env) which node goes, when, and what was
   done or failed.

The metadata service is reached with IMDSv2 session tokens (the launch templates require them), at
AWS_EC2_METADATA_SERVICE_ENDPOINT when that is set. A 404 is never a notice, and a metadata
service that does not answer for a while is tried again at the next poll.

Exit status of ``--once``: 0 nothing to do or every action done, 1 an action failed, 2 bad
arguments or cluster.env, 3 the instance metadata could not be read.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from launch.aws import LaunchError
from launch.cluster.node_env import CLUSTER_ENV, read_cluster_env

IMDS_ENDPOINT_ENV = "AWS_EC2_METADATA_SERVICE_ENDPOINT"
DEFAULT_IMDS_ENDPOINT = "http://169.254.169.254"
TOKEN_PATH = "/latest/api/token"
TOKEN_TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN_HEADER = "X-aws-ec2-metadata-token"
SPOT_ACTION_PATH = "/latest/meta-data/spot/instance-action"
INSTANCE_ID_PATH = "/latest/meta-data/instance-id"
# IMDSv2 tokens live 1 s to 6 h; a new one every 15 minutes costs nothing.
TOKEN_TTL_S = 900
IMDS_TIMEOUT_S = 2.0
SPOT_ACTIONS = ("terminate", "stop", "hibernate")
# AWS: check for the two-minute notice every 5 seconds.
POLL_INTERVAL_S = 5.0
# EC2 begins terminating a Capacity Block's instances this long before the block's end date.
BLOCK_TERMINATION_LEAD = timedelta(minutes=30)
BLOCK_MARGIN_MINUTES = 10
# How often the block's end date is read again (an extension moves it).
BLOCK_REFRESH_S = 300
# /run is emptied at boot: a new instance (or a restarted one) starts with no remembered notice.
STATE_DIR = "/run/maskrcnn/interruption"
BLOCK_CACHE = "capacity-block.json"
COMMAND_TIMEOUT_S = 30
# SNS refuses a subject longer than 100 characters.
SUBJECT_MAX = 100


class ImdsUnavailable(RuntimeError):
    """The instance metadata service did not answer as it does when healthy."""


class ActionFailed(RuntimeError):
    """A step of the response failed; the message names the command and what it said."""


# --- instance metadata (IMDSv2) ------------------------------------------------------------------

class Imds:
    """GETs from the instance metadata with an IMDSv2 session token: PUT /latest/api/token with
    the TTL header returns a token, sent with every GET; a GET with an expired or unknown token
    is answered 401, and the token is fetched again."""

    def __init__(self, endpoint: str | None = None, *, ttl_s: int = TOKEN_TTL_S,
                 timeout_s: float = IMDS_TIMEOUT_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.endpoint = (endpoint or os.environ.get(IMDS_ENDPOINT_ENV)
                         or DEFAULT_IMDS_ENDPOINT).rstrip("/")
        self.ttl_s, self.timeout_s, self._clock = ttl_s, timeout_s, clock
        self._token: str | None = None
        self._renew_at = 0.0
        # The metadata service is link-local: never through an HTTP proxy from the environment.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def _request(self, method: str, path: str, headers: dict[str, str]) -> tuple[int, str]:
        request = urllib.request.Request(self.endpoint + path, method=method, headers=headers)
        try:
            with self._opener.open(request, timeout=self.timeout_s) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode(errors="replace")
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", err)
            raise ImdsUnavailable(f"{method} {self.endpoint}{path}: {reason}") from None

    def token(self) -> str:
        if self._token is None or self._clock() >= self._renew_at:
            status, body = self._request("PUT", TOKEN_PATH, {TOKEN_TTL_HEADER: str(self.ttl_s)})
            if status != 200 or not body:
                raise ImdsUnavailable(f"PUT {self.endpoint}{TOKEN_PATH} answered HTTP {status}")
            self._token = body.strip()
            # Renewed before it runs out (a minute early, or halfway for a short TTL).
            self._renew_at = self._clock() + self.ttl_s - min(60.0, self.ttl_s / 2)
        return self._token

    def get(self, path: str) -> str | None:
        """The item's text, or None when the item is absent (404)."""
        for attempt in (1, 2):
            status, body = self._request("GET", path, {TOKEN_HEADER: self.token()})
            if status == 200:
                return body
            if status == 404:
                return None
            if status == 401 and attempt == 1:
                self._token = None   # expired or no longer known (the service restarted)
                continue
            raise ImdsUnavailable(f"GET {self.endpoint}{path} answered HTTP {status}")
        raise AssertionError("unreachable")


# --- notices -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Notice:
    kind: str          # "spot" or "capacity-block"
    action: str        # what EC2 will do: terminate, stop or hibernate
    time: datetime     # when EC2 does it (UTC)
    detail: str        # one sentence for the log and the alert

    @property
    def key(self) -> str:
        """Names the notice in the state directory: the same notice seen again is the same key."""
        stamp = self.time.strftime("%Y%m%dT%H%M%SZ")
        return re.sub(r"[^A-Za-z0-9_.-]", "_", f"{self.kind}-{self.action}-{stamp}")

    @property
    def when(self) -> str:
        return self.time.strftime("%Y-%m-%dT%H:%M:%SZ")


def _utc(text: str) -> datetime:
    value = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    if value.tzinfo is None:
        raise ValueError(f"{text!r} has no time zone")
    return value.astimezone(timezone.utc)


def parse_instance_action(text: str) -> Notice:
    """The Spot notice in `spot/instance-action`; ValueError for anything else, which the watcher
    logs and never acts on."""
    try:
        item = json.loads(text)
    except ValueError:
        raise ValueError(f"not JSON: {text[:200]!r}") from None
    if not isinstance(item, dict):
        raise ValueError(f"not a JSON object: {text[:200]!r}")
    action = item.get("action")
    if action not in SPOT_ACTIONS:
        raise ValueError(f"action {action!r} is none of {', '.join(SPOT_ACTIONS)}")
    try:
        when = _utc(str(item.get("time", "")))
    except ValueError:
        raise ValueError(f"time {item.get('time')!r} is not an ISO 8601 time") from None
    return Notice(kind="spot", action=action, time=when,
                  detail=f"EC2 will {action} this Spot Instance at {when:%Y-%m-%dT%H:%M:%SZ}")


def block_notice(*, reservation_id: str, end: datetime, now: datetime,
                 margin: timedelta) -> Notice | None:
    """The Capacity Block notice once `now` is `margin` before EC2 begins terminating the block's
    instances (BLOCK_TERMINATION_LEAD before its end date); None before that."""
    terminations = end - BLOCK_TERMINATION_LEAD
    if now < terminations - margin:
        return None
    return Notice(kind="capacity-block", action="terminate", time=terminations,
                  detail=(f"Capacity Block {reservation_id} ends at {end:%Y-%m-%dT%H:%M:%SZ}; EC2 "
                          f"terminates its instances from {terminations:%Y-%m-%dT%H:%M:%SZ}"))


def instance_reservation(ec2, instance_id: str) -> str | None:
    """The capacity reservation the instance runs in (DescribeInstances), or None."""
    reservations = ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]
    for reservation in reservations:
        for instance in reservation["Instances"]:
            if instance["InstanceId"] == instance_id:
                return instance.get("CapacityReservationId")
    return None


def capacity_block_end(ec2, reservation_id: str) -> datetime | None:
    """The end date of reservation `reservation_id` when it is a Capacity Block, else None."""
    found = ec2.describe_capacity_reservations(
        CapacityReservationIds=[reservation_id])["CapacityReservations"]
    for reservation in found:
        if reservation.get("ReservationType") == "capacity-block" and reservation.get("EndDate"):
            return reservation["EndDate"].astimezone(timezone.utc)
    return None


# --- Slurm ---------------------------------------------------------------------------------------

def run_command(argv: list[str], *, timeout_s: float = COMMAND_TIMEOUT_S) -> str:
    """Runs one Slurm command; its stdout, or ActionFailed naming the command and its error."""
    command = shlex.join(argv)
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except FileNotFoundError:
        raise ActionFailed(f"`{command}`: {argv[0]} is not installed here; run the watcher in the "
                           "training container, where the Slurm commands are") from None
    except subprocess.TimeoutExpired:
        raise ActionFailed(f"`{command}` did not finish within {timeout_s:.0f} s (is slurmctld "
                           "reachable?)") from None
    if done.returncode != 0:
        said = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()
        raise ActionFailed(f"`{command}` exited with status {done.returncode}: {' / '.join(said)}")
    return done.stdout


def drain_argv(node: str, reason: str) -> list[str]:
    return ["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"]


def running_jobs_argv(node: str) -> list[str]:
    return ["squeue", "-h", "-w", node, "-t", "RUNNING", "-o", "%i"]


def requeue_argv(job_id: str) -> list[str]:
    return ["scontrol", "requeue", job_id]


def parse_job_ids(stdout: str) -> list[str]:
    """Job ids in squeue's `%i` output, once each, in order (array tasks look like 12_3)."""
    ids: list[str] = []
    for line in stdout.splitlines():
        job = line.strip()
        if job and job not in ids:
            ids.append(job)
    return ids


def drain_reason(notice: Notice) -> str:
    if notice.kind == "spot":
        return f"spot interruption at {notice.when}"
    return f"capacity block ends, terminations from {notice.when}"


@dataclass
class Outcome:
    done: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


def drain_and_requeue(notice: Notice, *, node: str,
                      run: Callable[[list[str]], str] = run_command) -> Outcome:
    """Drains `node` and requeues the jobs running on it; every step is tried, whatever failed
    before it (a requeue still saves the run when the drain was refused)."""
    outcome = Outcome()
    try:
        run(drain_argv(node, drain_reason(notice)))
        outcome.done.append(f"drained Slurm node {node}")
    except ActionFailed as err:
        outcome.failed.append(str(err))
    try:
        jobs = parse_job_ids(run(running_jobs_argv(node)))
    except ActionFailed as err:
        outcome.failed.append(str(err))
        return outcome
    if not jobs:
        outcome.done.append(f"no job was running on {node}")
    for job in jobs:
        try:
            run(requeue_argv(job))
            outcome.done.append(f"requeued job {job} (it checkpoints on SIGTERM)")
        except ActionFailed as err:
            outcome.failed.append(str(err))
    return outcome


def slurm_node_name(env: dict[str, str], instance_id: str) -> str | None:
    """The Slurm node name this instance registered under (its claim on EFS, launch/cluster/
    slurm.py), or None when it holds none."""
    from launch.cluster.slurm import layout

    names = layout(env).names
    try:
        claims = sorted(names.iterdir())
    except OSError:
        return None
    for claim in claims:
        try:
            if (claim / "instance").read_text().strip() == instance_id:
                return claim.name
        except OSError:
            continue
    return None


# --- the alert -----------------------------------------------------------------------------------

def alert(notice: Notice, *, node: str, instance_id: str, stack: str,
          outcome: Outcome) -> tuple[str, str]:
    """(subject, message) for the alerts topic."""
    what = "Spot interruption" if notice.kind == "spot" else "Capacity Block ending"
    subject = f"{stack}: {what} of node {node} at {notice.when}"
    if len(subject) > SUBJECT_MAX:
        subject = subject[:SUBJECT_MAX - 3] + "..."
    lines = [f"{notice.detail}.", f"Node: {node} ({instance_id}), stack {stack}.", ""]
    lines += [f"Done: {step}" for step in outcome.done]
    lines += [f"FAILED: {step}" for step in outcome.failed]
    if notice.kind == "spot":
        lines += ["", "The worker group launches a replacement; the requeued job resumes from its "
                      "checkpoint once enough nodes are up (squeue shows it pending until then)."]
    else:
        lines += ["", "The job resumes from its checkpoint when capacity returns: a new Capacity "
                      "Block set as capacity_reservation and a redeploy, or an extension of this "
                      "one (then resume the node with scontrol update NodeName=<node> "
                      "State=RESUME)."]
    return subject.encode("ascii", "replace").decode(), "\n".join(lines)


def publish_alert(sns, topic_arn: str, subject: str, message: str) -> None:
    sns.publish(TopicArn=topic_arn, Subject=subject, Message=message)


# --- the watcher ---------------------------------------------------------------------------------

def _now() -> datetime:
    return datetime.now(timezone.utc)


class Watcher:
    """One node's checks and its response. `session` (boto3) is made when first needed: a node
    that is neither interrupted nor in a Capacity Block only reads the instance metadata."""

    def __init__(self, *, imds: Imds, env: dict[str, str], state_dir: Path,
                 node: str | None = None, block_margin: timedelta = timedelta(
                     minutes=BLOCK_MARGIN_MINUTES), session=None,
                 run: Callable[[list[str]], str] = run_command,
                 now: Callable[[], datetime] = _now, clock: Callable[[], float] = time.time,
                 log: Callable[[str], None] = print) -> None:
        self.imds, self.env, self.state_dir = imds, env, Path(state_dir)
        self.node, self.block_margin = node, block_margin
        self._session, self.run, self.now, self.clock, self.log = session, run, now, clock, log
        self._instance_id: str | None = None

    @property
    def session(self):
        if self._session is None:
            import boto3
            self._session = boto3.session.Session(region_name=self.env.get("AWS_REGION"))
        return self._session

    def instance_id(self) -> str:
        if self._instance_id is None:
            found = self.imds.get(INSTANCE_ID_PATH)
            if not found:
                raise ImdsUnavailable(f"{INSTANCE_ID_PATH} is absent from the instance metadata")
            self._instance_id = found.strip()
        return self._instance_id

    def node_name(self) -> str:
        if self.node:
            return self.node
        return (slurm_node_name(self.env, self.instance_id())
                or socket.gethostname().split(".")[0])

    # -- the two notices --

    def spot_notice(self) -> Notice | None:
        text = self.imds.get(SPOT_ACTION_PATH)
        if text is None:
            return None
        try:
            return parse_instance_action(text)
        except ValueError as err:
            self.log(f"ignoring {SPOT_ACTION_PATH}: {err}")
            return None

    def capacity_block(self) -> tuple[str, datetime] | None:
        """(reservation id, end date) of the Capacity Block this instance runs in, or None. Kept
        in the state directory for BLOCK_REFRESH_S, so that `--once` from a timer does not call
        EC2 at every poll; when EC2 cannot be asked, the last known end date stands."""
        from botocore.exceptions import BotoCoreError, ClientError

        path = self.state_dir / BLOCK_CACHE
        instance_id = self.instance_id()
        try:
            cached = json.loads(path.read_text())
            if cached.get("instance_id") != instance_id:
                cached = {}
        except (OSError, ValueError):
            cached = {}
        fresh = self.clock() - cached.get("checked_at", 0) < BLOCK_REFRESH_S
        if not fresh:
            try:
                ec2 = self.session.client("ec2")
                if "reservation_id" not in cached:   # an instance never changes reservation
                    cached["reservation_id"] = instance_reservation(ec2, instance_id)
                end = (capacity_block_end(ec2, cached["reservation_id"])
                       if cached["reservation_id"] else None)
                cached.update(instance_id=instance_id, checked_at=self.clock(),
                              end=end.isoformat() if end else None)
                _write_json(path, cached)
            except (BotoCoreError, ClientError) as err:
                self.log(f"cannot read this instance's capacity reservation from EC2 ({err}); "
                         + ("keeping the end date read before" if cached.get("end") else
                            f"asking again in {BLOCK_REFRESH_S} s"))
                # Not at every poll: a missing permission would otherwise flood EC2 and the log.
                cached.update(instance_id=instance_id, checked_at=self.clock())
                _write_json(path, cached)
        if not cached.get("reservation_id") or not cached.get("end"):
            return None
        return cached["reservation_id"], _utc(cached["end"])

    def block_notice(self) -> Notice | None:
        block = self.capacity_block()
        if block is None:
            return None
        reservation_id, end = block
        return block_notice(reservation_id=reservation_id, end=end, now=self.now(),
                            margin=self.block_margin)

    # -- acting once --

    def _claim(self, notice: Notice) -> Path | None:
        """The notice's marker, created now; None when it exists (acted on before)."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        marker = self.state_dir / f"{notice.key}.json"
        try:
            fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return None
        os.close(fd)
        return marker

    def respond(self, notice: Notice) -> Outcome | None:
        """Drain, requeue and alert, once per notice; None when this notice was acted on before."""
        if (self.state_dir / f"{notice.key}.json").exists():
            return None
        # Both before the claim: once claimed, the notice is never acted on again.
        node, instance_id = self.node_name(), self.instance_id()
        marker = self._claim(notice)
        if marker is None:
            return None
        self.log(f"{notice.detail}: draining Slurm node {node} and requeuing its jobs")
        outcome = drain_and_requeue(notice, node=node, run=self.run)
        topic = self.env.get("ALERTS_TOPIC_ARN")
        if not topic:
            outcome.failed.append(f"no ALERTS_TOPIC_ARN in {CLUSTER_ENV}: nobody was told")
        else:
            subject, message = alert(notice, node=node, instance_id=instance_id,
                                     stack=self.env.get("STACK_NAME", "maskrcnn"),
                                     outcome=outcome)
            from botocore.exceptions import BotoCoreError, ClientError
            try:
                publish_alert(self.session.client("sns"), topic, subject, message)
                outcome.done.append("told the alerts topic")
            except (BotoCoreError, ClientError) as err:
                outcome.failed.append(f"sns publish to {topic}: {err}")
        _write_json(marker, {"notice": notice.detail, "node": node, "done": outcome.done,
                             "failed": outcome.failed, "at": self.now().isoformat()})
        for step in outcome.done:
            self.log(f"done: {step}")
        for step in outcome.failed:
            self.log(f"FAILED: {step}")
        return outcome

    def check(self) -> int:
        """One poll: 0 nothing to do or all done, 1 an action failed; ImdsUnavailable when the
        instance metadata does not answer."""
        status = 0
        for notice in (self.spot_notice(), self.block_notice()):
            if notice is None:
                continue
            outcome = self.respond(notice)
            if outcome is not None and outcome.failed:
                status = 1
        return status


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


def watch(watcher: Watcher, *, interval_s: float = POLL_INTERVAL_S,
          stop: threading.Event | None = None) -> None:
    """Checks every `interval_s` until `stop` is set. An unreachable metadata service is logged
    when it starts and when it ends, not at every poll."""
    stop = stop or threading.Event()
    unreachable: str | None = None
    while not stop.is_set():
        try:
            watcher.check()
            if unreachable is not None:
                watcher.log("instance metadata answers again")
                unreachable = None
        except ImdsUnavailable as err:
            if unreachable is None:
                watcher.log(f"instance metadata unreachable ({err}); trying every "
                            f"{interval_s:g} s")
            unreachable = str(err)
        stop.wait(interval_s)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m launch.cluster.interruption",
                                description=__doc__.splitlines()[0])
    p.add_argument("--once", action="store_true", help="check once and exit (for a timer)")
    p.add_argument("--interval", type=float, default=POLL_INTERVAL_S,
                   help="seconds between checks in the loop (AWS advises 5)")
    p.add_argument("--block-margin-minutes", type=float, default=BLOCK_MARGIN_MINUTES,
                   help="act this many minutes before EC2 begins terminating a Capacity Block's "
                        "instances (30 minutes before the block's end)")
    p.add_argument("--node", help="Slurm node name to drain (default: the name this instance "
                                  "registered under, else the short host name)")
    p.add_argument("--state-dir", default=STATE_DIR,
                   help="where the notices acted on are remembered")
    p.add_argument("--cluster-env", default=CLUSTER_ENV)
    a = p.parse_args(argv)
    if a.interval <= 0 or a.block_margin_minutes < 0:
        p.error("--interval must be above 0 and --block-margin-minutes not negative")
    try:
        env = read_cluster_env(a.cluster_env)
    except LaunchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    watcher = Watcher(imds=Imds(), env=env, state_dir=Path(a.state_dir), node=a.node,
                      block_margin=timedelta(minutes=a.block_margin_minutes),
                      log=lambda line: print(line, flush=True))
    if a.once:
        try:
            return watcher.check()
        except ImdsUnavailable as err:
            print(f"error: instance metadata unreachable: {err}", file=sys.stderr)
            return 3
    watch(watcher, interval_s=a.interval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
