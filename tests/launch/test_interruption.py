"""The interruption watcher (launch/cluster/interruption.py): a Spot notice or a Capacity Block's
end drains the node, requeues its jobs and tells the alerts topic, once.

What stands in for what cannot run here:
- the instance metadata service: a real HTTP server on 127.0.0.1 (ImdsStandIn) that behaves as AWS
  documents IMDSv2 ("Use the Instance Metadata Service to access instance metadata", EC2 User
  Guide): PUT /latest/api/token needs X-aws-ec2-metadata-token-ttl-seconds between 1 and 21600
  (400 otherwise) and returns a token; a GET without a token that is valid and unexpired gets 401;
  and as "Spot Instance interruption notices" documents spot/instance-action: absent (404) until
  EC2 schedules the interruption, then {"action": "terminate", "time": "2017-09-18T08:22:00Z"};
- slurmctld: none runs here. Where a test needs Slurm to answer, a recorder takes the argv lists
  and answers squeue with job ids (what they show: the drain comes first, each running job is
  requeued once, the watcher acts once per notice); the failure tests run the real scontrol and
  squeue against a slurm.conf whose controller port has nothing listening. What Slurm makes of the
  commands is asserted against real slurmctld and slurmd in tests/launch/test_cluster_faults.py,
  where the watcher's command runs on an emulated node: the node DRAIN with the notice as its
  reason, the job requeued (scontrol show job: Restarts up by one, JobState);
- EC2's DescribeCapacityReservations, which moto lacks: responses written from the API reference in
  tests/launch/recorded_aws/; DescribeInstances of an instance in a Capacity Block (moto never sets
  CapacityReservationId): INSTANCE_IN_BLOCK below, in the API reference's element names;
- SNS: moto, with an SQS queue subscribed to the alerts topic to read the alert back.
"""
from __future__ import annotations

import http.server
import json
import secrets
import threading
import time
import urllib.error
import urllib.request
from datetime import datetime, timedelta, timezone
from pathlib import Path

import boto3
import pytest
from botocore.awsrequest import AWSResponse
from botocore.exceptions import ClientError

from launch.cluster import interruption
from launch.cluster.interruption import (ActionFailed, Imds, ImdsUnavailable, Notice, Watcher,
                                         block_notice, capacity_block_end, drain_and_requeue,
                                         parse_instance_action, run_command)
from recorded_aws import Replay

from aws_fakes import free_port

# AWS's documented example of the item.
DOCUMENTED_NOTICE = '{"action": "terminate", "time": "2017-09-18T08:22:00Z"}'
NOTICE_TIME = "2026-12-04T10:58:00Z"
STACK = "team-a-EfsClusterStack"
BLOCK = "cr-0f60718293a4b5c63"   # recorded: Capacity Block, active, ends 2026-12-04T11:30:00Z
ODCR = "cr-0a1b2c3d4e5f60718"    # recorded: an On-Demand Capacity Reservation, no end date
BLOCK_INSTANCE = "i-0a1b2c3d4e5f60789"


# --- the metadata service stand-in ---------------------------------------------------------------

class ImdsStandIn:
    """IMDSv2 as documented (see the module's docstring), on a port of 127.0.0.1."""

    MAX_TTL_S = 21600

    def __init__(self, instance_id: str) -> None:
        self.instance_id = instance_id
        self.spot_action: str | None = None     # the instance-action item; None: absent
        self.tokens: dict[str, float] = {}      # token -> expiry (time.monotonic)
        self.served: list[tuple[str, str, int]] = []
        self.port = free_port()
        self._server: http.server.ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def expire_tokens(self) -> None:
        """Every token issued so far runs out now."""
        self.tokens = {token: 0.0 for token in self.tokens}

    def start(self) -> "ImdsStandIn":
        stand_in = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self, status: int, body: str = "", headers: dict | None = None) -> None:
                stand_in.served.append((self.command, self.path, status))
                payload = body.encode()
                self.send_response(status)
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def do_PUT(self):
                if self.path != "/latest/api/token":
                    return self._answer(404)
                ttl = self.headers.get("X-aws-ec2-metadata-token-ttl-seconds", "")
                if not ttl.isdigit() or not 1 <= int(ttl) <= stand_in.MAX_TTL_S:
                    return self._answer(400, "Missing or Invalid Parameters")
                token = secrets.token_urlsafe(40)
                stand_in.tokens[token] = time.monotonic() + int(ttl)
                self._answer(200, token, {"X-aws-ec2-metadata-token-ttl-seconds": ttl})

            def do_GET(self):
                token = self.headers.get("X-aws-ec2-metadata-token")
                if token is None or stand_in.tokens.get(token, 0.0) <= time.monotonic():
                    return self._answer(401, "Unauthorized")
                if self.path == "/latest/meta-data/instance-id":
                    return self._answer(200, stand_in.instance_id)
                if self.path == "/latest/meta-data/spot/instance-action" and stand_in.spot_action:
                    return self._answer(200, stand_in.spot_action)
                self._answer(404, "Not Found")

            def log_message(self, *args):
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


@pytest.fixture
def imds():
    stand_in = ImdsStandIn("i-0123456789abcdef0").start()
    yield stand_in
    stand_in.stop()


def test_the_stand_in_refuses_what_imdsv2_refuses(imds):
    def status(method, path, headers):
        request = urllib.request.Request(imds.url + path, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return response.status
        except urllib.error.HTTPError as err:
            return err.code

    assert status("GET", "/latest/meta-data/instance-id", {}) == 401
    assert status("PUT", "/latest/api/token", {}) == 400
    too_long = {"X-aws-ec2-metadata-token-ttl-seconds": "21601"}
    assert status("PUT", "/latest/api/token", too_long) == 400
    assert status("GET", "/latest/meta-data/instance-id",
                  {"X-aws-ec2-metadata-token": "not-a-token"}) == 401


# --- the client ----------------------------------------------------------------------------------

def test_a_renewed_token_before_it_runs_out(imds):
    client = Imds(imds.url, ttl_s=1)
    assert client.get("/latest/meta-data/instance-id") == "i-0123456789abcdef0"
    time.sleep(1.2)   # the 1-second token has run out; the client renews it at half its life
    assert client.get("/latest/meta-data/instance-id") == "i-0123456789abcdef0"
    assert [s for s in imds.served if s[0] == "PUT"] == [("PUT", "/latest/api/token", 200)] * 2
    assert all(status != 401 for _, _, status in imds.served)


def test_a_401_for_an_expired_token_fetches_a_new_one(imds):
    client = Imds(imds.url, ttl_s=21600)
    assert client.get("/latest/meta-data/spot/instance-action") is None   # 404: nothing scheduled
    imds.expire_tokens()
    imds.spot_action = DOCUMENTED_NOTICE
    assert client.get("/latest/meta-data/spot/instance-action") == DOCUMENTED_NOTICE
    assert [status for _, _, status in imds.served] == [200, 404, 401, 200, 200]


def test_the_endpoint_comes_from_the_environment_as_the_boot_script_reads_it(imds, monkeypatch):
    monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", imds.url + "/")
    assert Imds().endpoint == imds.url
    monkeypatch.delenv("AWS_EC2_METADATA_SERVICE_ENDPOINT")
    assert Imds().endpoint == "http://169.254.169.254"


def test_an_unreachable_service_is_reported_as_such(imds):
    imds.stop()
    with pytest.raises(ImdsUnavailable, match=f"127.0.0.1:{imds.port}/latest/api/token"):
        Imds(imds.url, timeout_s=1).get("/latest/meta-data/instance-id")


# --- the notices ---------------------------------------------------------------------------------

@pytest.mark.parametrize("action", ["terminate", "stop", "hibernate"])
def test_the_documented_instance_action_is_a_notice(action):
    notice = parse_instance_action(DOCUMENTED_NOTICE.replace("terminate", action))
    assert (notice.kind, notice.action) == ("spot", action)
    assert notice.time == datetime(2017, 9, 18, 8, 22, tzinfo=timezone.utc)
    assert notice.when == "2017-09-18T08:22:00Z"
    assert notice.key == f"spot-{action}-20170918T082200Z"


@pytest.mark.parametrize("text, words", [
    ("2017-09-18T08:22:00Z", "not JSON"),      # the older spot/termination-time item's format
    ('["terminate"]', "not a JSON object"),
    ('{"action": "reboot", "time": "2017-09-18T08:22:00Z"}', "'reboot' is none of"),
    ('{"action": "terminate", "time": "soon"}', "'soon' is not an ISO 8601 time"),
    ('{"action": "terminate", "time": "2017-09-18T08:22:00"}', "not an ISO 8601 time"),
])
def test_anything_else_is_not_a_notice(text, words):
    with pytest.raises(ValueError, match=words):
        parse_instance_action(text)


def test_a_capacity_block_notice_comes_the_margin_before_terminations_begin():
    end = datetime(2026, 12, 4, 11, 30, tzinfo=timezone.utc)
    margin = timedelta(minutes=10)
    # EC2 begins terminating at 11:00 (30 minutes before the end); with 10 minutes' margin the
    # watcher acts from 10:50.
    assert block_notice(reservation_id=BLOCK, end=end, margin=margin,
                        now=datetime(2026, 12, 4, 10, 49, 59, tzinfo=timezone.utc)) is None
    notice = block_notice(reservation_id=BLOCK, end=end, margin=margin,
                          now=datetime(2026, 12, 4, 10, 50, tzinfo=timezone.utc))
    assert (notice.kind, notice.action, notice.when) == (
        "capacity-block", "terminate", "2026-12-04T11:00:00Z")
    assert "ends at 2026-12-04T11:30:00Z" in notice.detail
    # Also after the end date (a watcher started late still acts).
    assert block_notice(reservation_id=BLOCK, end=end, margin=margin, now=end) == notice


def test_the_end_date_of_a_capacity_block_and_of_nothing_else():
    session = boto3.session.Session(region_name="us-east-1", aws_access_key_id="testing",
                                    aws_secret_access_key="testing")
    Replay({"DescribeCapacityReservations": {BLOCK: "block-p4d-us-east-1a-active",
                                             ODCR: "odcr-p4d-us-east-1a-2-available",
                                             "cr-0123456789abcdef0": "not-found"}}).install(session)
    ec2 = session.client("ec2")
    assert capacity_block_end(ec2, BLOCK) == datetime(2026, 12, 4, 11, 30, tzinfo=timezone.utc)
    assert capacity_block_end(ec2, ODCR) is None
    with pytest.raises(ClientError, match="InvalidCapacityReservationId.NotFound"):
        capacity_block_end(ec2, "cr-0123456789abcdef0")


# --- Slurm ---------------------------------------------------------------------------------------

class SlurmRecorder:
    """Takes each Slurm command in place of a controller (none runs in these tests); squeue
    answers with `jobs`, as `squeue -h -o %i` prints them."""

    def __init__(self, jobs: str = "") -> None:
        self.jobs, self.calls = jobs, []

    def __call__(self, argv: list[str]) -> str:
        self.calls.append(argv)
        return self.jobs if argv[0] == "squeue" else ""


def spot_notice(time_text: str = NOTICE_TIME) -> Notice:
    return parse_instance_action(json.dumps({"action": "terminate", "time": time_text}))


def test_drain_then_requeue_every_job_running_on_the_node():
    slurm = SlurmRecorder(jobs="17\n18_2\n17\n")
    outcome = drain_and_requeue(spot_notice(), node="worker-2", run=slurm)
    assert slurm.calls == [
        ["scontrol", "update", "NodeName=worker-2", "State=DRAIN",
         "Reason=spot interruption at 2026-12-04T10:58:00Z"],
        ["squeue", "-h", "-w", "worker-2", "-t", "RUNNING", "-o", "%i"],
        ["scontrol", "requeue", "17"],
        ["scontrol", "requeue", "18_2"],
    ]
    assert outcome.failed == []
    assert outcome.done == ["drained Slurm node worker-2",
                            "requeued job 17 (it checkpoints on SIGTERM)",
                            "requeued job 18_2 (it checkpoints on SIGTERM)"]


@pytest.fixture
def slurm_without_controller(tmp_path, monkeypatch):
    """A slurm.conf naming a controller on a port of 127.0.0.1 where nothing listens."""
    conf = tmp_path / "slurm.conf"
    conf.write_text(f"ClusterName=test\nSlurmctldHost=ctl(127.0.0.1)\nSlurmctldPort={free_port()}\n"
                    "NodeName=worker-2 CPUs=1 State=CLOUD\nPartitionName=train Nodes=worker-2\n"
                    "MessageTimeout=2\n")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    return conf


def test_failing_slurm_commands_are_reported_with_what_they_said(slurm_without_controller):
    outcome = drain_and_requeue(spot_notice(), node="worker-2")   # the real scontrol and squeue
    assert outcome.done == []
    drain, listing = outcome.failed
    assert drain.startswith(
        "`scontrol update NodeName=worker-2 State=DRAIN "
        "'Reason=spot interruption at 2026-12-04T10:58:00Z'` exited with status 1")
    assert listing.startswith("`squeue -h -w worker-2 -t RUNNING -o %i` exited with status 1")
    for message in (drain, listing):
        assert "Unable to contact slurm controller" in message


def test_a_missing_command_names_where_to_run_the_watcher():
    with pytest.raises(ActionFailed, match="no-such-scontrol is not installed here; run the "
                                           "watcher in the training container"):
        run_command(["no-such-scontrol", "requeue", "17"])


def test_the_node_name_is_the_slurm_name_this_instance_claimed(tmp_path):
    env = {"EFS_MOUNT": str(tmp_path), "STACK_NAME": STACK}
    names = tmp_path / ".maskrcnn" / STACK / "slurm" / "nodes"
    for name, holder in (("master", "i-0aaaaaaaaaaaaaaaa"), ("worker-1", "i-0bbbbbbbbbbbbbbbb"),
                         ("worker-2", "i-0123456789abcdef0")):
        (names / name).mkdir(parents=True)
        (names / name / "instance").write_text(holder + "\n")
    assert interruption.slurm_node_name(env, "i-0123456789abcdef0") == "worker-2"
    assert interruption.slurm_node_name(env, "i-0ccccccccccccccccc") is None


# --- the watcher ---------------------------------------------------------------------------------

@pytest.fixture
def alerts(aws_env):
    """The alerts topic in moto with an SQS queue subscribed; returns (topic ARN, read) where
    read() returns the SNS notifications delivered since the last read."""
    session = boto3.session.Session()
    sns, sqs = session.client("sns"), session.client("sqs")
    topic = sns.create_topic(Name="maskrcnn-alerts")["TopicArn"]
    queue = sqs.create_queue(QueueName="alerts-inbox")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])[
        "Attributes"]["QueueArn"]
    sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=queue_arn)

    def read() -> list[dict]:
        got = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10).get("Messages", [])
        for message in got:
            sqs.delete_message(QueueUrl=queue, ReceiptHandle=message["ReceiptHandle"])
        return [json.loads(message["Body"]) for message in got]
    return topic, read


@pytest.fixture
def moto_instance(aws_env) -> str:
    """An On-Demand instance in moto (no capacity reservation): the node's own instance."""
    ec2 = boto3.session.Session().client("ec2")
    return ec2.run_instances(ImageId="ami-12c6146b", InstanceType="c5.xlarge", MinCount=1,
                             MaxCount=1)["Instances"][0]["InstanceId"]


def node_env(topic: str, efs: Path) -> dict[str, str]:
    return {"AWS_REGION": "us-east-1", "ALERTS_TOPIC_ARN": topic, "STACK_NAME": STACK,
            "EFS_MOUNT": str(efs)}


def test_a_spot_notice_is_acted_on_once_and_a_404_never(imds, alerts, moto_instance, tmp_path):
    topic, read = alerts
    imds.instance_id = moto_instance
    slurm = SlurmRecorder(jobs="17\n")
    log: list[str] = []
    state = tmp_path / "run"
    watcher = Watcher(imds=Imds(imds.url), env=node_env(topic, tmp_path / "efs"), state_dir=state,
                      node="worker-2", session=boto3.session.Session(), run=slurm,
                      log=log.append)

    for _ in range(3):                       # nothing scheduled: 404 at every poll
        assert watcher.check() == 0
    assert slurm.calls == [] and read() == []
    assert not list(state.glob("spot-*"))

    imds.spot_action = json.dumps({"action": "terminate", "time": NOTICE_TIME})
    assert watcher.check() == 0
    assert slurm.calls == [
        ["scontrol", "update", "NodeName=worker-2", "State=DRAIN",
         "Reason=spot interruption at 2026-12-04T10:58:00Z"],
        ["squeue", "-h", "-w", "worker-2", "-t", "RUNNING", "-o", "%i"],
        ["scontrol", "requeue", "17"]]
    (sent,) = read()
    assert sent["TopicArn"] == topic
    assert sent["Subject"] == (f"{STACK}: Spot interruption of node worker-2 at "
                               "2026-12-04T10:58:00Z")
    assert "EC2 will terminate this Spot Instance at 2026-12-04T10:58:00Z" in sent["Message"]
    assert f"worker-2 ({moto_instance})" in sent["Message"]
    assert "Done: requeued job 17" in sent["Message"] and "FAILED" not in sent["Message"]
    marker = json.loads((state / "spot-terminate-20261204T105800Z.json").read_text())
    assert marker["failed"] == [] and marker["node"] == "worker-2"

    # The notice stays in the metadata until the end: the loop, and a new watcher (`--once` from
    # a timer, the same state directory), leave it alone.
    assert watcher.check() == 0
    again = Watcher(imds=Imds(imds.url), env=node_env(topic, tmp_path / "efs"), state_dir=state,
                    node="worker-2", session=boto3.session.Session(), run=slurm, log=log.append)
    assert again.check() == 0
    assert len(slurm.calls) == 3 and read() == []


def test_the_loop_survives_an_unreachable_metadata_service(imds, alerts, moto_instance, tmp_path):
    topic, read = alerts
    imds.instance_id = moto_instance
    imds.stop()                                   # down when the watcher starts
    slurm = SlurmRecorder()
    log: list[str] = []
    watcher = Watcher(imds=Imds(imds.url, timeout_s=1), env=node_env(topic, tmp_path / "efs"),
                      state_dir=tmp_path / "run", node="worker-2",
                      session=boto3.session.Session(), run=slurm, log=log.append)
    stop = threading.Event()
    loop = threading.Thread(target=interruption.watch, args=(watcher,),
                            kwargs={"interval_s": 0.1, "stop": stop})
    loop.start()
    try:
        time.sleep(0.6)                           # several polls against a closed port
        imds.spot_action = json.dumps({"action": "terminate", "time": NOTICE_TIME})
        imds.start()                              # back, with the notice
        deadline = time.monotonic() + 20
        while not slurm.calls and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)                           # more polls after acting
    finally:
        stop.set()
        loop.join(timeout=10)
    assert not loop.is_alive()
    assert [c[:2] for c in slurm.calls] == [["scontrol", "update"], ["squeue", "-h"]]
    unreachable = [line for line in log if line.startswith("instance metadata unreachable")]
    assert len(unreachable) == 1, log             # said once, not at every poll
    assert "instance metadata answers again" in log
    assert len(read()) == 1


def test_acting_without_an_alerts_topic_says_nobody_was_told(imds, moto_instance, tmp_path):
    imds.instance_id = moto_instance
    imds.spot_action = DOCUMENTED_NOTICE
    watcher = Watcher(imds=Imds(imds.url), env={"AWS_REGION": "us-east-1"},
                      state_dir=tmp_path / "run", node="worker-2",
                      session=boto3.session.Session(), run=SlurmRecorder(), log=lambda _: None)
    assert watcher.check() == 1
    marker = json.loads((tmp_path / "run" / "spot-terminate-20170918T082200Z.json").read_text())
    assert marker["failed"] == ["no ALERTS_TOPIC_ARN in /etc/maskrcnn/cluster.env: nobody was told"]


# --- a Capacity Block ending ---------------------------------------------------------------------

# DescribeInstances as EC2 answers it for an instance in a Capacity Block (element names of the API
# reference's DescribeInstances response and Instance type; fields the watcher does not read are
# left out).
INSTANCE_IN_BLOCK = f"""<?xml version="1.0" encoding="UTF-8"?>
<DescribeInstancesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">
  <requestId>8f7e6d5c-4b3a-2910-8f7e-6d5c4b3a2910</requestId>
  <reservationSet><item>
    <reservationId>r-0a1b2c3d4e5f60789</reservationId>
    <ownerId>123456789012</ownerId>
    <instancesSet><item>
      <instanceId>{BLOCK_INSTANCE}</instanceId>
      <instanceType>p4d.24xlarge</instanceType>
      <instanceState><code>16</code><name>running</name></instanceState>
      <placement><availabilityZone>us-east-1a</availabilityZone><tenancy>default</tenancy></placement>
      <instanceLifecycle>capacity-block</instanceLifecycle>
      <capacityReservationId>{BLOCK}</capacityReservationId>
      <capacityReservationSpecification>
        <capacityReservationPreference>capacity-reservations-only</capacityReservationPreference>
        <capacityReservationTarget><capacityReservationId>{BLOCK}</capacityReservationId></capacityReservationTarget>
      </capacityReservationSpecification>
    </item></instancesSet>
  </item></reservationSet>
</DescribeInstancesResponse>
"""


class _Raw:
    def __init__(self, body: bytes):
        self._body = body

    def stream(self, **kwargs):
        yield self._body


def answer_describe_instances(session, body: str, asked: list[str]) -> None:
    def send(request, **kwargs):
        asked.append("DescribeInstances")
        return AWSResponse(request.url, 200, {"Content-Type": "text/xml"}, _Raw(body.encode()))
    session.events.register("before-send.ec2.DescribeInstances", send)


class Clock:
    """Wall time for the watcher, moved by the test."""

    def __init__(self, start: datetime):
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def seconds(self) -> float:
        return self.now.timestamp()


def test_a_capacity_block_ending_is_acted_on_once_the_margin_before(imds, alerts, tmp_path):
    topic, read = alerts
    imds.instance_id = BLOCK_INSTANCE
    session = boto3.session.Session()
    replay = Replay({"DescribeCapacityReservations": {BLOCK: "block-p4d-us-east-1a-active"}})
    replay.install(session)
    asked: list[str] = []
    answer_describe_instances(session, INSTANCE_IN_BLOCK, asked)
    clock = Clock(datetime(2026, 12, 4, 10, 40, tzinfo=timezone.utc))
    slurm = SlurmRecorder(jobs="23\n")
    watcher = Watcher(imds=Imds(imds.url), env=node_env(topic, tmp_path / "efs"),
                      state_dir=tmp_path / "run", node="worker-1", session=session, run=slurm,
                      now=clock, clock=clock.seconds, log=lambda _: None)

    assert watcher.check() == 0                   # 10:40: terminations begin at 11:00, act at 10:50
    clock.now += timedelta(minutes=4)             # 10:44: the end date is still fresh, not asked
    assert watcher.check() == 0
    assert slurm.calls == [] and read() == []
    assert asked == ["DescribeInstances"]
    assert replay.answered == [("DescribeCapacityReservations", BLOCK)]

    clock.now += timedelta(minutes=7)             # 10:51, past the refresh: asked again, acts
    assert watcher.check() == 0
    assert asked == ["DescribeInstances"]         # the instance's reservation does not change
    assert len(replay.answered) == 2
    assert slurm.calls == [
        ["scontrol", "update", "NodeName=worker-1", "State=DRAIN",
         "Reason=capacity block ends, terminations from 2026-12-04T11:00:00Z"],
        ["squeue", "-h", "-w", "worker-1", "-t", "RUNNING", "-o", "%i"],
        ["scontrol", "requeue", "23"]]
    (sent,) = read()
    assert sent["Subject"] == (f"{STACK}: Capacity Block ending of node worker-1 at "
                               "2026-12-04T11:00:00Z")
    assert (f"Capacity Block {BLOCK} ends at 2026-12-04T11:30:00Z; EC2 terminates its instances "
            "from 2026-12-04T11:00:00Z") in sent["Message"]

    clock.now += timedelta(minutes=2)
    assert watcher.check() == 0
    assert len(slurm.calls) == 3 and read() == []


def test_a_node_outside_any_reservation_asks_ec2_once(imds, moto_instance, tmp_path):
    imds.instance_id = moto_instance
    session = boto3.session.Session()
    asked: list[str] = []
    session.events.register("before-call.ec2", lambda model, **kw: asked.append(model.name))
    clock = Clock(datetime(2026, 12, 4, 10, 0, tzinfo=timezone.utc))
    watcher = Watcher(imds=Imds(imds.url), env={"AWS_REGION": "us-east-1"},
                      state_dir=tmp_path / "run", node="worker-1", session=session,
                      run=SlurmRecorder(), now=clock, clock=clock.seconds, log=lambda _: None)
    for _ in range(3):
        assert watcher.check() == 0
        clock.now += timedelta(minutes=10)        # past the refresh each time
    assert asked == ["DescribeInstances"]


# --- the command -------------------------------------------------------------------------------

@pytest.fixture
def cluster_env(tmp_path, alerts):
    topic, _ = alerts
    path = tmp_path / "cluster.env"
    path.write_text("".join(f"{k}={v}\n" for k, v in node_env(topic, tmp_path / "efs").items()))
    return path


def test_once_exit_status(imds, alerts, moto_instance, cluster_env, slurm_without_controller,
                          tmp_path, monkeypatch, capsys):
    _, read = alerts
    imds.instance_id = moto_instance
    monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", imds.url)
    args = ["--once", "--cluster-env", str(cluster_env), "--state-dir", str(tmp_path / "run"),
            "--node", "worker-2"]
    assert interruption.main(args) == 0           # 404: nothing to do
    imds.spot_action = DOCUMENTED_NOTICE
    assert interruption.main(args) == 1           # acted; no slurmctld answered
    out = capsys.readouterr().out
    assert "FAILED: `scontrol update NodeName=worker-2" in out
    assert "done: told the alerts topic" in out
    (sent,) = read()
    assert "FAILED: `squeue -h -w worker-2" in sent["Message"]
    assert interruption.main(args) == 0           # acted on before
    imds.stop()
    assert interruption.main(args) == 3
    assert "instance metadata unreachable" in capsys.readouterr().err
