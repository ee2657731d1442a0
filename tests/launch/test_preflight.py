"""The pre-flight (launch/preflight.py) against a moto server, with responses written from the API
references (tests/launch/recorded_aws/, not captured from AWS) for what moto does not answer:
Service Quotas' EC2 quotas, DescribeCapacityReservations, Resource Groups' ListGroupResources,
and a stack in ROLLBACK_COMPLETE.

moto answers DescribeAvailabilityZones, DescribeInstanceTypeOfferings, DescribeInstanceTypes,
DescribeInstances, DescribeAddresses and DescribeStacks. Its offerings are AWS's: p4d.24xlarge in
us-east-1 is offered in us-east-1a to us-east-1d, not in us-east-1e or us-east-1f
(test_moto_offers_p4d_in_four_zones pins that), and the scenarios are built on it.

Expected numbers are worked out by hand in each test: a p4d.24xlarge has 96 vCPUs, a g5.48xlarge
192, a c5.xlarge 4, a node count is worker_count + 1 (with worker_spot: 1 On-Demand master and
worker_count Spot workers); quota codes, names and AWS defaults are AWS's (Service Quotas console,
Amazon EC2; the EC2 User Guide's "Spot Instance quotas": 0 vCPUs for G and VT, 5 for Standard)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import boto3
import pytest

from aws_fakes import deploy_stack
from infra.config import AppConfig
from infra.settings import set_values
from launch import preflight
from recorded_aws import Replay

REPO_ROOT = preflight.DEFAULT_PATH.parent
P_QUOTA, P_NAME = "L-417A185B", "Running On-Demand P instances"
EIP_QUOTA, EIP_NAME = "L-0263D0A3", "EC2-VPC Elastic IPs"
QUOTAS = {"GetServiceQuota": {P_QUOTA: "p-192", EIP_QUOTA: "elastic-ip-5"}}
P_SPOT_QUOTA, P_SPOT_NAME = "L-7212CCBC", "All P4, P3 and P2 Spot Instance Requests"
G_QUOTA, G_NAME = "L-DB2E81BA", "Running On-Demand G and VT instances"
G_SPOT_QUOTA, G_SPOT_NAME = "L-3819A6DF", "All G and VT Spot Instance Requests"
STANDARD_QUOTA, STANDARD_NAME = "L-1216C47A", "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances"
STANDARD_SPOT_QUOTA = "L-34B43A08"
STANDARD_SPOT_NAME = "All Standard (A, C, D, H, I, M, R, T, Z) Spot Instance Requests"
SPOT_QUOTAS = {"GetServiceQuota": {**QUOTAS["GetServiceQuota"], P_SPOT_QUOTA: "p4-p3-p2-spot-192"}}
SPOT = {"InstanceMarketOptions": {"MarketType": "spot"}}

# Reservations as the API reference shapes them (tests/launch/recorded_aws/describe_capacity_reservations.json).
ODCR_FITS = "cr-0a1b2c3d4e5f60718"         # p4d.24xlarge, us-east-1a, active, 2 of 2 available
ODCR_ZONE_B = "cr-0b2c3d4e5f6071829"       # p4d.24xlarge, us-east-1b, active, 2 of 2
ODCR_G5 = "cr-0c3d4e5f607182930"           # g5.48xlarge, us-east-1a, active, 2 of 2
ODCR_ONE_LEFT = "cr-0d4e5f60718293a41"     # p4d.24xlarge, us-east-1a, active, 1 of 2
BLOCK_SCHEDULED = "cr-0e5f60718293a4b52"   # Capacity Block, p4d.24xlarge, us-east-1a, starts 2026-12-01 11:30 UTC
BLOCK_ACTIVE = "cr-0f60718293a4b5c63"      # Capacity Block, p4d.24xlarge, us-east-1a, active, 2 of 2
MISSING = "cr-0123456789abcdef0"
RESERVATIONS = {
    ODCR_FITS: "odcr-p4d-us-east-1a-2-available", ODCR_ZONE_B: "odcr-p4d-us-east-1b-2-available",
    ODCR_G5: "odcr-g5-us-east-1a-2-available", ODCR_ONE_LEFT: "odcr-p4d-us-east-1a-1-of-2-available",
    BLOCK_SCHEDULED: "block-p4d-us-east-1a-scheduled", BLOCK_ACTIVE: "block-p4d-us-east-1a-active",
    MISSING: "not-found",
}
GROUP = "arn:aws:resource-groups:us-east-1:123456789012:group/p4d-reservations"
EMPTY_GROUP = "arn:aws:resource-groups:us-east-1:123456789012:group/nothing-yet"


def p4d(**values) -> AppConfig:
    return AppConfig.from_context({"instance_type": "p4d.24xlarge", "worker_count": 1, **values})


def checks(config: AppConfig, replay: Replay, session=None) -> dict[str, preflight.CheckResult]:
    session = session or boto3.session.Session()
    replay.install(session)
    return {r.name: r for r in preflight.run_checks(config, session)}


def run_instances(instance_type: str, count: int = 1, **kwargs) -> list[str]:
    ec2 = boto3.client("ec2")
    image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    made = ec2.run_instances(ImageId=image, MinCount=count, MaxCount=count, InstanceType=instance_type, **kwargs)
    return [i["InstanceId"] for i in made["Instances"]]


def test_moto_offers_p4d_in_four_zones(aws_env):
    offers = boto3.client("ec2").describe_instance_type_offerings(
        LocationType="availability-zone",
        Filters=[{"Name": "instance-type", "Values": ["p4d.24xlarge"]}])["InstanceTypeOfferings"]
    assert sorted(o["Location"] for o in offers) == ["us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d"]


def test_all_checks_pass(aws_env):
    replay = Replay(QUOTAS)
    results = checks(p4d(), replay)

    assert list(results) == ["zone", "vcpu-quota", "elastic-ip-quota", "capacity-reservation", "stacks",
                            "file-system"]
    assert all(r.ok for r in results.values()), results
    # availability_zones unset: the VPC's first zone is the region's first available one.
    assert "offered in us-east-1a (the first zone of us-east-1" in results["zone"].message
    # 2 nodes x 96 vCPUs = 192 needed; nothing running, so all of the 192 are available.
    assert results["vcpu-quota"].message.startswith(f"{P_NAME} ({P_QUOTA}): 192 vCPUs needed")
    assert "192 of 192 available (none in use)" in results["vcpu-quota"].message
    # EFA is on by default on p4d: four network interfaces, so the master has no public address.
    assert "1 needed (the NAT gateway's; the master has none" in results["elastic-ip-quota"].message
    assert "5 of 5 available" in results["elastic-ip-quota"].message
    assert "none of NetworkStorageStack, EfsClusterStack, SageMakerStack exists" in results["stacks"].message
    assert sorted(replay.answered) == [("GetServiceQuota", EIP_QUOTA), ("GetServiceQuota", P_QUOTA)]


def test_type_not_offered_in_the_cluster_zone_names_the_zones_that_offer_it(aws_env):
    results = checks(p4d(availability_zones="us-east-1a,us-east-1e", cluster_availability_zone="us-east-1e"),
                     Replay(QUOTAS))

    zone = results["zone"]
    assert not zone.ok
    assert zone.message.startswith("p4d.24xlarge is not offered in us-east-1e (cluster_availability_zone)")
    assert "offer it: us-east-1a, us-east-1b, us-east-1c, us-east-1d" in zone.message
    # One of the VPC's zones offers it: only the cluster's zone needs to move.
    assert "`maskrcnn settings set cluster_availability_zone=us-east-1a`" in zone.message
    assert all(r.ok for name, r in results.items() if name != "zone")


def test_no_vpc_zone_offers_the_type_suggests_two_that_do(aws_env):
    zone = checks(p4d(availability_zones="us-east-1e,us-east-1f"), Replay(QUOTAS))["zone"]

    assert not zone.ok and "not offered in us-east-1e (the first of availability_zones)" in zone.message
    assert ("maskrcnn settings set availability_zones=us-east-1a,us-east-1b "
            "cluster_availability_zone=us-east-1a") in zone.message


def test_vcpu_quota_too_small_with_a_running_instance(aws_env):
    run_instances("p4d.24xlarge")   # 96 of the 192 in use

    results = checks(p4d(), Replay(QUOTAS))

    vcpu = results["vcpu-quota"]
    assert not vcpu.ok
    # 192 - 96 = 96 available; 2 nodes x 96 = 192 needed; 96 + 192 = 288 asked for.
    assert vcpu.message.startswith(f"{P_NAME} ({P_QUOTA}) is 192 vCPUs, 96 in use by 1 running instance(s)")
    assert "96 available, 192 needed for 2 x p4d.24xlarge" in vcpu.message
    assert (f"aws service-quotas request-service-quota-increase --service-code ec2 --quota-code {P_QUOTA} "
            f"--desired-value 288 --region us-east-1") in vcpu.message
    assert "Service Quotas console" in vcpu.message
    assert all(r.ok for name, r in results.items() if name != "vcpu-quota")


def test_vcpu_usage_counts_running_on_demand_instances_of_the_family_only(aws_env):
    ec2 = boto3.client("ec2")
    run_instances("p4d.24xlarge")                 # P, 96
    run_instances("p5.4xlarge")                   # P, 16 (not in infra/instance_types.py)
    run_instances("g5.xlarge")                    # G and VT quota
    run_instances("inf2.xlarge")                  # Inf quota, though its first letter is a Standard one
    ec2.stop_instances(InstanceIds=run_instances("p4d.24xlarge"))                          # stopped
    run_instances("p4d.24xlarge", InstanceMarketOptions={"MarketType": "spot"})          # Spot quota

    vcpu = checks(p4d(worker_count=0), Replay(QUOTAS))["vcpu-quota"]

    # 96 + 16 = 112 in use; 192 - 112 = 80 available; 1 node x 96 needed; 112 + 96 = 208 asked for.
    assert not vcpu.ok
    assert "112 in use by 2 running instance(s) of the family: 80 available, 96 needed" in vcpu.message
    assert "--desired-value 208" in vcpu.message


def test_elastic_ip_quota_full(aws_env):
    ec2 = boto3.client("ec2")
    allocated = [ec2.allocate_address(Domain="vpc")["AllocationId"] for _ in range(4)]

    results = checks(p4d(efa=False), Replay(QUOTAS))

    eip = results["elastic-ip-quota"]
    # Without EFA the master is public: 5 - 4 = 1 available; the NAT gateway and the master need 2;
    # 4 + 2 = 6 asked for.
    assert not eip.ok
    assert eip.message.startswith(f"{EIP_NAME} ({EIP_QUOTA}) is 5 addresses, 4 allocated: 1 available, 2 needed")
    assert f"--quota-code {EIP_QUOTA} --desired-value 6" in eip.message
    assert all(a in eip.message for a in allocated) and "aws ec2 release-address" in eip.message

    # With an EFA interface on each of a p4d's 4 cards (the default) the master has no address:
    # 1 needed, 1 free.
    eip = checks(p4d(), Replay(QUOTAS))["elastic-ip-quota"]
    assert eip.ok and "1 needed (the NAT gateway's; the master has none" in eip.message


def test_quota_without_an_applied_value_falls_back_to_the_default(aws_env):
    replay = Replay({"GetServiceQuota": {P_QUOTA: "p-192", EIP_QUOTA: "no-such-resource"},
                     "GetAWSDefaultServiceQuota": {EIP_QUOTA: "elastic-ip-default-5"}})
    eip = checks(p4d(), replay)["elastic-ip-quota"]
    assert eip.ok and "5 of 5 available" in eip.message
    assert ("GetAWSDefaultServiceQuota", EIP_QUOTA) in replay.answered


def test_spot_workers_count_against_the_spot_quota_not_the_on_demand_one(aws_env):
    # On-Demand, 3 nodes x 96 = 288 vCPUs do not fit the P quota's 192.
    vcpu = checks(p4d(worker_count=2), Replay(SPOT_QUOTAS))["vcpu-quota"]
    assert not vcpu.ok and "192 available, 288 needed for 3 x p4d.24xlarge" in vcpu.message

    replay = Replay(SPOT_QUOTAS)
    vcpu = checks(p4d(worker_count=2, worker_spot=True), replay)["vcpu-quota"]

    # The master's 96 of the On-Demand P quota's 192; the 2 workers' 2 x 96 = 192 of the Spot quota's 192.
    assert vcpu.ok, vcpu.message
    on_demand, spot = vcpu.message.split(" | ")
    assert on_demand.startswith(f"{P_NAME} ({P_QUOTA}): 96 vCPUs needed for 1 x p4d.24xlarge (96 vCPUs each; "
                                "the master")
    assert on_demand.endswith("192 of 192 available (none in use)")
    assert spot == (f"{P_SPOT_NAME} ({P_SPOT_QUOTA}): 192 vCPUs needed for 2 x p4d.24xlarge (96 vCPUs each; "
                    "worker_count Spot workers), 192 of 192 available (none in use)")
    assert sorted(replay.answered) == [("GetServiceQuota", EIP_QUOTA), ("GetServiceQuota", P_QUOTA),
                                       ("GetServiceQuota", P_SPOT_QUOTA)]


def test_spot_workers_over_the_spot_quota_fail_naming_it(aws_env):
    run_instances("p4d.24xlarge", **SPOT)   # 96 of the P4, P3 and P2 Spot quota
    run_instances("p5.4xlarge", **SPOT)     # the P5 Spot quota's, not this one's
    run_instances("p4d.24xlarge")           # On-Demand: 96 of the On-Demand P quota

    results = checks(p4d(worker_count=2, worker_spot=True), Replay(SPOT_QUOTAS))

    vcpu = results["vcpu-quota"]
    # 192 - 96 = 96 available, 2 workers x 96 = 192 needed: 96 short; 96 + 192 = 288 asked for.
    assert not vcpu.ok
    assert vcpu.message.startswith(
        f"{P_SPOT_NAME} ({P_SPOT_QUOTA}) is 192 vCPUs, 96 in use by 1 running instance(s) of the family: "
        "96 available, 192 needed for 2 x p4d.24xlarge (96 vCPUs each; worker_count Spot workers): 96 short.")
    assert f"Service Quotas console (Amazon EC2, \"{P_SPOT_NAME}\")" in vcpu.message
    assert (f"aws service-quotas request-service-quota-increase --service-code ec2 --quota-code {P_SPOT_QUOTA} "
            "--desired-value 288 --region us-east-1") in vcpu.message
    assert ("lower worker_count, or set worker_spot=false (`maskrcnn settings set worker_spot=false`)"
            in vcpu.message)
    # The master fits beside the On-Demand p4d: 192 - 96 = 96 available, 96 needed.
    assert vcpu.message.endswith(f" | {P_NAME} ({P_QUOTA}): 96 vCPUs needed for 1 x p4d.24xlarge (96 vCPUs each; "
                                 "the master, On-Demand with worker_spot too), 96 of 192 available (96 in use by "
                                 "1 running instance(s) of the family)")
    assert all(r.ok for name, r in results.items() if name != "vcpu-quota")


def test_with_spot_workers_the_master_still_counts_on_demand(aws_env):
    run_instances("p4d.24xlarge", count=2)   # the whole On-Demand P quota (2 x 96 = 192) in use

    vcpu = checks(p4d(worker_count=1, worker_spot=True), Replay(SPOT_QUOTAS))["vcpu-quota"]

    # 192 - 192 = 0 available, the master needs 96: 96 short; 192 + 96 = 288 asked for.
    assert not vcpu.ok
    failed, fits = vcpu.message.split(" | ")
    assert failed.startswith(f"{P_NAME} ({P_QUOTA}) is 192 vCPUs, 192 in use by 2 running instance(s) of the "
                             "family: 0 available, 96 needed for 1 x p4d.24xlarge (96 vCPUs each; the master")
    assert failed.endswith(f"--quota-code {P_QUOTA} --desired-value 288 --region us-east-1`, or stop On-Demand "
                           "instances of the family")
    # The one worker: 96 of the Spot quota's 192.
    assert fits.startswith(f"{P_SPOT_NAME} ({P_SPOT_QUOTA}): 96 vCPUs needed for 1 x p4d.24xlarge")


def test_spot_quotas_without_an_applied_value_fall_back_to_aws_defaults(aws_env):
    # A new account: no applied value, AWS's defaults. G and VT: 0 vCPUs On-Demand and Spot.
    replay = Replay({"GetServiceQuota": {G_QUOTA: "no-such-resource", G_SPOT_QUOTA: "no-such-resource",
                                         EIP_QUOTA: "elastic-ip-5"},
                     "GetAWSDefaultServiceQuota": {G_QUOTA: "g-and-vt-default-0",
                                                   G_SPOT_QUOTA: "g-and-vt-spot-default-0"}})
    g5 = AppConfig.from_context({"instance_type": "g5.48xlarge", "worker_count": 1, "worker_spot": True})

    vcpu = checks(g5, replay)["vcpu-quota"]

    # Both fall short by a g5.48xlarge's 192 vCPUs, and both are named with what to ask for.
    assert not vcpu.ok
    on_demand, spot = vcpu.message.split(" | ")
    assert on_demand.startswith(f"{G_NAME} ({G_QUOTA}) is 0 vCPUs, none in use: 0 available, 192 needed for "
                                "1 x g5.48xlarge (192 vCPUs each; the master")
    assert spot.startswith(f"{G_SPOT_NAME} ({G_SPOT_QUOTA}) is 0 vCPUs, none in use: 0 available, 192 needed "
                           "for 1 x g5.48xlarge (192 vCPUs each; worker_count Spot workers): 192 short.")
    assert f"--quota-code {G_QUOTA} --desired-value 192" in on_demand
    assert f"--quota-code {G_SPOT_QUOTA} --desired-value 192" in spot
    assert ("GetAWSDefaultServiceQuota", G_SPOT_QUOTA) in replay.answered

    # Standard: 64 vCPUs applied On-Demand, AWS's default 5 for Spot. One c5.xlarge worker (4 vCPUs) fits;
    # two (8) are 3 short.
    replay = Replay({"GetServiceQuota": {STANDARD_QUOTA: "standard-64", STANDARD_SPOT_QUOTA: "no-such-resource",
                                         EIP_QUOTA: "elastic-ip-5"},
                     "GetAWSDefaultServiceQuota": {STANDARD_SPOT_QUOTA: "standard-spot-default-5"}})

    def c5(workers):
        config = AppConfig.from_context({"instance_type": "c5.xlarge", "worker_count": workers,
                                         "worker_spot": True})
        return checks(config, replay)["vcpu-quota"]

    vcpu = c5(1)
    assert vcpu.ok and f"{STANDARD_SPOT_NAME} ({STANDARD_SPOT_QUOTA}): 4 vCPUs needed" in vcpu.message
    assert "5 of 5 available" in vcpu.message
    assert (f"{STANDARD_NAME} ({STANDARD_QUOTA}): 4 vCPUs needed for 1 x c5.xlarge (4 vCPUs each; the master"
            in vcpu.message)
    vcpu = c5(2)
    assert not vcpu.ok
    assert vcpu.message.startswith(f"{STANDARD_SPOT_NAME} ({STANDARD_SPOT_QUOTA}) is 5 vCPUs, none in use: "
                                   "5 available, 8 needed for 2 x c5.xlarge (4 vCPUs each; worker_count Spot "
                                   "workers): 3 short.")
    assert f"--quota-code {STANDARD_SPOT_QUOTA} --desired-value 8" in vcpu.message
    assert f"| {STANDARD_NAME} ({STANDARD_QUOTA}): 4 vCPUs needed" in vcpu.message


def test_spot_workers_of_a_family_without_a_known_spot_quota_are_said_not_checked(aws_env):
    # No Spot quota's name covers P6 (the P ones: "P4, P3 and P2", "P5"): the message says so.
    replay = Replay(QUOTAS)
    config = AppConfig.from_context({"instance_type": "p6-b200.48xlarge", "worker_count": 1, "worker_spot": True})

    vcpu = checks(config, replay)["vcpu-quota"]

    assert not vcpu.ok
    unknown, master = vcpu.message.split(" | ")
    assert unknown.startswith("Spot workers not checked: no Spot vCPU quota is recorded here for p6-b200.48xlarge")
    assert f"{P_SPOT_NAME} ({P_SPOT_QUOTA})" in unknown and "All P5 Spot Instance Requests (L-C4BD4855)" in unknown
    assert "192 vCPUs free for the 1 x p6-b200.48xlarge Spot workers" in unknown
    assert master.startswith(f"{P_NAME} ({P_QUOTA}): 192 vCPUs needed for 1 x p6-b200.48xlarge")
    assert ("GetServiceQuota", P_SPOT_QUOTA) not in replay.answered


def test_spot_without_workers_checks_the_master_only(aws_env):
    replay = Replay(SPOT_QUOTAS)
    vcpu = checks(p4d(worker_count=0, worker_spot=True), replay)["vcpu-quota"]
    assert vcpu.ok and " | " not in vcpu.message
    assert vcpu.message.startswith(f"{P_NAME} ({P_QUOTA}): 96 vCPUs needed for 1 x p4d.24xlarge")
    assert ("GetServiceQuota", P_SPOT_QUOTA) not in replay.answered


@pytest.mark.parametrize("reservation, values, expected", [
    (ODCR_FITS, {}, f"{ODCR_FITS}: On-Demand Capacity Reservation of p4d.24xlarge in us-east-1a, active, "
                    "2 of 2 available for 2 nodes"),
    (BLOCK_ACTIVE, {"capacity_block": True}, f"{BLOCK_ACTIVE}: Capacity Block of p4d.24xlarge in us-east-1a, "
                                             "active, 2 of 2 available for 2 nodes, ends 2026-12-04 11:30 UTC"),
])
def test_reservation_that_fits(aws_env, reservation, values, expected):
    replay = Replay({**QUOTAS, "DescribeCapacityReservations": RESERVATIONS})
    results = checks(p4d(capacity_reservation=reservation, **values), replay)
    assert all(r.ok for r in results.values()), results
    assert results["capacity-reservation"].message == expected


def test_capacity_block_nodes_are_not_counted_against_the_on_demand_quota(aws_env):
    run_instances("p4d.24xlarge", count=2)   # the whole P quota (2 x 96 = 192) in use
    replay = Replay({**QUOTAS, "DescribeCapacityReservations": RESERVATIONS})

    results = checks(p4d(capacity_reservation=BLOCK_ACTIVE, capacity_block=True), replay)

    assert results["vcpu-quota"].ok and "Capacity Block" in results["vcpu-quota"].message
    assert ("GetServiceQuota", P_QUOTA) not in replay.answered
    # The same nodes in an On-Demand Capacity Reservation do count: 0 of 192 left, 192 needed.
    vcpu = checks(p4d(capacity_reservation=ODCR_FITS), replay)["vcpu-quota"]
    assert not vcpu.ok and "0 available, 192 needed" in vcpu.message


@pytest.mark.parametrize("reservation, values, expected", [
    (MISSING, {}, f"{MISSING} does not exist in us-east-1"),
    (ODCR_G5, {}, f"{ODCR_G5} is for g5.48xlarge, not instance_type p4d.24xlarge"),
    (ODCR_ZONE_B, {}, f"{ODCR_ZONE_B} is in us-east-1b, not the cluster's zone us-east-1a"),
    (ODCR_ZONE_B, {"availability_zones": "us-east-1b,us-east-1c", "cluster_availability_zone": "us-east-1c"},
     f"{ODCR_ZONE_B} is in us-east-1b, not the cluster's zone us-east-1c"),
    (ODCR_ONE_LEFT, {}, f"{ODCR_ONE_LEFT} has 1 of its 2 instances available, 2 needed (worker_count + 1)"),
    (BLOCK_SCHEDULED, {"capacity_block": True},
     f"{BLOCK_SCHEDULED} is scheduled: it starts 2026-12-01 11:30 UTC, and the nodes cannot launch into it"),
    (BLOCK_ACTIVE, {}, f"{BLOCK_ACTIVE} is a Capacity Block: set capacity_block=true"),
    (ODCR_FITS, {"capacity_block": True},
     f"{ODCR_FITS} is an On-Demand Capacity Reservation, not a Capacity Block: set capacity_block=false"),
])
def test_reservation_that_does_not_fit(aws_env, reservation, values, expected):
    replay = Replay({**QUOTAS, "DescribeCapacityReservations": RESERVATIONS})
    results = checks(p4d(capacity_reservation=reservation, **values), replay)
    check = results["capacity-reservation"]
    assert not check.ok and check.message.startswith(expected), check.message
    assert ("DescribeCapacityReservations", reservation) in replay.answered


def test_resource_group_passes_when_one_reservation_fits(aws_env):
    # The group lists ODCR_ZONE_B first (wrong zone), then ODCR_FITS.
    replay = Replay({**QUOTAS, "DescribeCapacityReservations": RESERVATIONS,
                     "ListGroupResources": {GROUP: "two-reservations", EMPTY_GROUP: "empty"}})

    check = checks(p4d(capacity_reservation=GROUP), replay)["capacity-reservation"]
    assert check.ok and check.message.startswith(f"{ODCR_FITS} of resource group {GROUP}: ")

    # 3 nodes fit in neither (2 instances each); each is named with why.
    check = checks(p4d(capacity_reservation=GROUP, worker_count=2), replay)["capacity-reservation"]
    assert not check.ok and check.message.startswith(f"no reservation of resource group {GROUP} fits")
    assert f"{ODCR_ZONE_B} is in us-east-1b, not the cluster's zone us-east-1a" in check.message
    assert f"{ODCR_FITS} has 2 of its 2 instances available, 3 needed" in check.message

    check = checks(p4d(capacity_reservation=EMPTY_GROUP), replay)["capacity-reservation"]
    assert not check.ok and f"resource group {EMPTY_GROUP} lists no capacity reservation" in check.message


def test_access_denied_fails_that_check_and_names_the_permission(aws_env):
    replay = Replay({"GetServiceQuota": {P_QUOTA: "access-denied", EIP_QUOTA: "access-denied"},
                     "DescribeCapacityReservations": {ODCR_FITS: "unauthorized"}})

    results = checks(p4d(capacity_reservation=ODCR_FITS), replay)

    for name in ("vcpu-quota", "elastic-ip-quota"):
        assert not results[name].ok
        assert results[name].message.startswith(
            "not checked: the caller may not call servicequotas:GetServiceQuota (AccessDeniedException)")
    assert results["capacity-reservation"].message.startswith(
        "not checked: the caller may not call ec2:DescribeCapacityReservations (UnauthorizedOperation)")
    assert results["zone"].ok and results["stacks"].ok


def test_stack_in_rollback_complete_blocks_and_a_healthy_one_does_not(aws_env):
    session = boto3.session.Session()
    deploy_stack(session, name="team-a-SageMakerStack")   # CREATE_COMPLETE in moto
    replay = Replay({**QUOTAS, "DescribeStacks": {
        "team-a-NetworkStorageStack": "team-a-network-stack-rollback-complete"}})

    stacks = checks(p4d(name_prefix="team-a"), replay, session)["stacks"]

    assert not stacks.ok
    assert stacks.message.startswith("team-a-NetworkStorageStack is ROLLBACK_COMPLETE")
    assert ("aws cloudformation delete-stack --stack-name team-a-NetworkStorageStack "
            "--region us-east-1") in stacks.message

    stacks = checks(p4d(name_prefix="team-a"), Replay(QUOTAS))["stacks"]
    assert stacks.ok
    assert stacks.message == "exist, the deploy updates them: team-a-SageMakerStack (CREATE_COMPLETE)"


def test_quota_family_of_running_instances():
    # The quota names list the families: "Running On-Demand P instances", "G and VT instances",
    # "Standard (A, C, D, H, I, M, R, T, Z) instances"; Inf, Trn, DL, HPC, X, F have their own.
    expected = {"p4d.24xlarge": P_QUOTA, "p6-b200.48xlarge": P_QUOTA, "g5.xlarge": "L-DB2E81BA",
                "gr6.4xlarge": "L-DB2E81BA", "vt1.3xlarge": "L-DB2E81BA", "m5.xlarge": "L-1216C47A",
                "im4gn.large": "L-1216C47A", "t3.micro": "L-1216C47A", "inf2.xlarge": None,
                "trn1.2xlarge": None, "dl1.24xlarge": None, "hpc7g.4xlarge": None, "x2idn.16xlarge": None,
                "f1.2xlarge": None, "u-6tb1.metal": None}
    assert {t: preflight.quota_code(t) for t in expected} == expected


def test_spot_quota_of_each_family():
    # AWS's Spot quota names: "All P4, P3 and P2", "All P5", "All G and VT", "All Standard (A, C, D, H,
    # I, M, R, T, Z) Spot Instance Requests"; Inf, Trn, DL, X, F have their own, and none names P6.
    p5 = "L-C4BD4855"
    expected = {"p3dn.24xlarge": P_SPOT_QUOTA, "p4d.24xlarge": P_SPOT_QUOTA, "p4de.24xlarge": P_SPOT_QUOTA,
                "p5.48xlarge": p5, "p5e.48xlarge": p5, "p5en.48xlarge": p5, "p6-b200.48xlarge": None,
                "g5.48xlarge": G_SPOT_QUOTA, "gr6.4xlarge": G_SPOT_QUOTA, "vt1.3xlarge": G_SPOT_QUOTA,
                "c5.xlarge": STANDARD_SPOT_QUOTA, "m5.xlarge": STANDARD_SPOT_QUOTA,
                "t3.micro": STANDARD_SPOT_QUOTA,
                "inf2.xlarge": None, "trn1.2xlarge": None, "dl1.24xlarge": None, "x2idn.16xlarge": None,
                "f1.2xlarge": None}
    assert {t: preflight.spot_quota_code(t) for t in expected} == expected


def test_bad_settings_exit_2(tmp_path, capsys):
    settings = tmp_path / "settings.json"
    settings.write_text('{"worker_count": -1}')
    assert preflight.main(["--settings-file", str(settings)]) == 2
    assert "error: bad settings: context key 'worker_count' is -1" in capsys.readouterr().err


def _preflight(args, env):
    return subprocess.run([sys.executable, "-m", "launch.preflight", *args], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_command_against_moto_with_a_settings_file(aws_env, tmp_path):
    settings = tmp_path / "deploy-a.json"
    set_values(settings, ["instance_type=p4d.24xlarge", "worker_count=1",
                          "availability_zones=us-east-1a,us-east-1e", "cluster_availability_zone=us-east-1e"])
    with Replay(QUOTAS).serve() as quotas_url:
        # The subprocess reaches moto for EC2 and CloudFormation, the recorded quotas for Service Quotas.
        env = {**os.environ, "AWS_ENDPOINT_URL_SERVICE_QUOTAS": quotas_url}

        failed = _preflight(["--settings-file", str(settings)], env)
        set_values(settings, ["cluster_availability_zone=us-east-1a"])
        passed = _preflight(["--settings-file", str(settings), "--json"], env)

    assert failed.returncode == 1, failed.stderr
    lines = failed.stdout.splitlines()
    assert lines[0] == "pre-flight of EfsClusterStack and its stacks in us-east-1: 2 x p4d.24xlarge"
    assert [line.split(":")[0] for line in lines[1:7]] == [
        "FAIL  zone", "PASS  vcpu-quota", "PASS  elastic-ip-quota", "PASS  capacity-reservation", "PASS  stacks",
        "PASS  file-system"]
    assert f"maskrcnn settings --file {settings} set cluster_availability_zone=us-east-1a" in lines[1]
    assert lines[-1] == "5 of 6 checks passed; fix the 1 failed before `cdk deploy`"

    assert passed.returncode == 0, passed.stderr
    results = json.loads(passed.stdout)
    assert [(r["name"], r["ok"]) for r in results] == [
        ("zone", True), ("vcpu-quota", True), ("elastic-ip-quota", True), ("capacity-reservation", True),
        ("stacks", True), ("file-system", True)]
    assert "offered in us-east-1a (cluster_availability_zone)" in results[0]["message"]


# --- the shared file system switch ------------------------------------------------------------
# EFS's DeleteMountTarget "forcibly breaks any mounts of the file system by using the mount target
# that is being deleted ... Uncommitted writes might be lost" (EFS API reference): a deploy that
# switches existing_file_system_id removes the old file system's mount targets.
OLD_FS, NEW_FS = "fs-0aaaaaaaaaaaaaaa1", "fs-0bbbbbbbbbbbbbbb2"
FS_PARAMETER = "/maskrcnn/NetworkStorageStack/file-system-id"   # infra/constructs/file_system.py


def deployed_file_system(fs_id: str, *, nodes: bool) -> None:
    from aws_fakes import node_groups
    boto3.client("ssm").put_parameter(Name=FS_PARAMETER, Value=fs_id, Type="String")
    size = 1 if nodes else 0
    node_groups(boto3.session.Session(), {"EfsClusterStack-master": (0, 1, size),
                                          "EfsClusterStack-worker": (0, 1, size)})


def test_switching_the_file_system_is_refused_while_cluster_nodes_mount_it(aws_env):
    deployed_file_system(OLD_FS, nodes=True)
    check = checks(p4d(existing_file_system_id=NEW_FS), Replay(QUOTAS))["file-system"]
    assert not check.ok
    assert f"switches from {OLD_FS} to {NEW_FS}" in check.message
    assert "1 instance(s) of EfsClusterStack-master, 1 instance(s) of EfsClusterStack-worker" in check.message
    assert "`maskrcnn cluster pause`" in check.message and "job stop" in check.message


def test_switching_the_file_system_of_a_paused_cluster_passes(aws_env):
    deployed_file_system(OLD_FS, nodes=False)
    check = checks(p4d(existing_file_system_id=NEW_FS), Replay(QUOTAS))["file-system"]
    assert check.ok and f"nothing mounts {OLD_FS} now" in check.message, check


def test_keeping_the_file_system_passes_with_nodes_running(aws_env):
    deployed_file_system(OLD_FS, nodes=True)
    check = checks(p4d(existing_file_system_id=OLD_FS), Replay(QUOTAS))["file-system"]
    assert check.ok and check.message == f"the deploy keeps {OLD_FS}"


def test_a_file_system_the_stack_created_is_kept_and_leaving_a_reused_one_is_refused(aws_env):
    cloudformation = boto3.client("cloudformation")
    cloudformation.create_stack(StackName="NetworkStorageStack", TemplateBody=json.dumps(
        {"Resources": {"FileSystem": {"Type": "AWS::EFS::FileSystem", "Properties": {"Encrypted": True}}}}))
    (created,) = [r["PhysicalResourceId"] for r in cloudformation.list_stack_resources(
        StackName="NetworkStorageStack")["StackResourceSummaries"]]
    deployed_file_system(created, nodes=True)
    assert checks(p4d(), Replay(QUOTAS))["file-system"].ok          # existing_file_system_id unset: kept
    boto3.client("ssm").put_parameter(Name=FS_PARAMETER, Value=OLD_FS, Type="String", Overwrite=True)
    check = checks(p4d(), Replay(QUOTAS))["file-system"]            # reused OLD_FS, back to a new one
    assert not check.ok and f"switches from {OLD_FS} to a new file system" in check.message


def test_a_running_notebook_blocks_the_switch_too(aws_env):
    from aws_fakes import deploy_stack
    from infra import outputs
    deployed_file_system(OLD_FS, nodes=False)
    session = boto3.session.Session()
    role = boto3.client("iam").create_role(RoleName="nb", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
    boto3.client("sagemaker").create_notebook_instance(
        NotebookInstanceName="team-notebook", InstanceType="ml.t3.medium", RoleArn=role)
    deploy_stack(session, values={outputs.NOTEBOOK_NAME: "team-notebook"})
    check = checks(p4d(existing_file_system_id=NEW_FS), Replay(QUOTAS), session)["file-system"]
    assert not check.ok and "the notebook team-notebook (InService)" in check.message, check
