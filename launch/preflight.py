"""Read-only checks of the account and region before `cdk deploy` creates anything.

    maskrcnn preflight [--region us-east-1] [--settings-file PATH] [--json]

It reads the deployment's settings as the next `cdk deploy` would (infra/settings.py) and checks:

  zone                  the instance type is offered in the cluster's zone
  vcpu-quota            the On-Demand vCPU quota of the type's family covers the instances already
                        running in that family plus this deployment's nodes; with worker_spot it
                        covers the master only, and the family's Spot vCPU quota covers the running
                        Spot Instances it counts plus the workers
  elastic-ip-quota      the Elastic IP quota has room for the NAT gateway's address and the master's
  capacity-reservation  the reservation (or one in the resource group) exists, is active, and fits
                        the instance type, the zone and the node count
  stacks                no stack of the deployment is in a state CloudFormation cannot deploy over
  file-system           a deploy that switches the shared file system (existing_file_system_id)
                        deletes the old one's mount targets, which breaks the NFS mounts of
                        whatever uses them: refused while a cluster node or the notebook runs

Each check reports one line; a check AWS refuses to answer (AccessDenied) fails and names the
permission it needs. Exit status: 0 all passed, 1 a check failed, 2 bad settings, credentials or
region.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

import boto3
from botocore.exceptions import BotoCoreError, ClientError

from infra import outputs
from infra.config import AppConfig, ConfigError
from infra.instance_types import (ELASTIC_IP_QUOTA, INSTANCE_TYPES, SPOT_P_GENERATIONS, SPOT_VCPU_QUOTAS,
                                  VCPU_QUOTAS, vcpu_quota)
from infra.settings import DEFAULT_PATH, load_config
from launch.aws import LaunchError, make_session

STACK_IDS = (outputs.NETWORK_STORAGE_STACK, outputs.EFS_CLUSTER_STACK, outputs.SAGEMAKER_STACK)

# The prefix of each service's IAM actions, to name the permission a refused call needs.
IAM_PREFIX = {"ec2": "ec2", "service-quotas": "servicequotas", "resource-groups": "resource-groups",
              "cloudformation": "cloudformation", "ssm": "ssm", "autoscaling": "autoscaling",
              "sagemaker": "sagemaker"}
ACCESS_DENIED = {"AccessDenied", "AccessDeniedException", "UnauthorizedOperation", "UnauthorizedAccess",
                 "ForbiddenException"}


# Instances that are not On-Demand Instances do not use the On-Demand vCPU quotas: Spot Instances
# have quotas of their own, and so do Capacity Blocks for ML. A Capacity Block's instances run with
# their own market type and lifecycle (InstanceLifecycle "capacity-block" in DescribeInstances, as
# "spot" for Spot), and AWS documents their own limits (64 instances per block, 256 across blocks:
# https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-blocks-purchase.html); its Capacity
# Block pages name no On-Demand quota for them. On-Demand Capacity Reservations count against it:
# creating one fails "if the requested quantity exceeds your On-Demand Instance limit for the
# selected instance family", and instances in one are On-Demand Instances
# (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-reservations-create.html).
NOT_ON_DEMAND = frozenset({"spot", "capacity-block"})
# The generation digits after an instance type's family letters (p4d -> 4, p6-b200 -> 6).
_GENERATION = re.compile(r"^[a-z]+(\d*)")

# CloudFormation states a `cdk deploy` cannot update, with what to do about each.
_DELETE_FIRST = ("CloudFormation cannot update it: delete it with `aws cloudformation delete-stack "
                 "--stack-name {name} --region {region}`, then deploy again")
BLOCKING_STACK_STATES = {
    "ROLLBACK_COMPLETE": "its first creation failed and was rolled back; " + _DELETE_FIRST,
    "ROLLBACK_FAILED": "its first creation failed and so did the rollback; " + _DELETE_FIRST,
    "DELETE_FAILED": "its deletion failed; " + _DELETE_FIRST.replace("delete it", "retry the deletion"),
    "UPDATE_ROLLBACK_FAILED": ("an update's rollback failed; finish it with `aws cloudformation "
                               "continue-update-rollback --stack-name {name} --region {region}`, "
                               "then deploy again"),
}


@dataclasses.dataclass(frozen=True)
class CheckResult:
    name: str
    ok: bool
    message: str


class Preflight:
    """The checks of one configuration in one session's account and region; every call is a
    Describe/Get/List."""

    def __init__(self, config: AppConfig, session: boto3.session.Session,
                 settings_file: Path | None = None):
        self.config = config
        self.session = session
        self.region = session.region_name
        self.settings_file = settings_file
        self._clients: dict[str, object] = {}
        self._zone: tuple[str, str] | None = None
        self._instances: list[dict] | None = None

    # -- helpers --

    def client(self, service: str):
        if service not in self._clients:
            self._clients[service] = self.session.client(service)
        return self._clients[service]

    @property
    def nodes(self) -> int:
        return self.config.worker_count + 1

    def settings_command(self, *assignments: str) -> str:
        file = f" --file {self.settings_file}" if self.settings_file and self.settings_file != DEFAULT_PATH else ""
        return f"maskrcnn settings{file} set {' '.join(assignments)}"

    def cluster_zone(self) -> tuple[str, str]:
        """(zone, why that zone): the zone the cluster's nodes launch in."""
        if self._zone is None:
            if self.config.cluster_availability_zone:
                self._zone = (self.config.cluster_availability_zone, "cluster_availability_zone")
            elif self.config.availability_zones:
                self._zone = (self.config.availability_zones[0], "the first of availability_zones")
            else:
                self._zone = (self.region_zones()[0],
                              f"the first zone of {self.region}, as the VPC takes it with "
                              "availability_zones unset")
        return self._zone

    def region_zones(self) -> list[str]:
        """The region's available zones by name: what CloudFormation's Fn::GetAZs gives the VPC."""
        zones = self.client("ec2").describe_availability_zones(
            Filters=[{"Name": "state", "Values": ["available"]}])["AvailabilityZones"]
        return sorted(z["ZoneName"] for z in zones
                      if z.get("ZoneType", "availability-zone") == "availability-zone")

    def quota(self, code: str) -> int:
        """The applied value of an EC2 quota (Service Quotas); its AWS default where no applied
        value is recorded for the account."""
        sq = self.client("service-quotas")
        try:
            value = sq.get_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]["Value"]
        except ClientError as err:
            if err.response["Error"]["Code"] != "NoSuchResourceException":
                raise
            value = sq.get_aws_default_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]["Value"]
        return int(value)

    def vcpus(self, instance_types: Iterable[str]) -> dict[str, int]:
        """Default vCPUs of each type: infra/instance_types.py, else DescribeInstanceTypes."""
        known = {t: INSTANCE_TYPES[t].vcpus for t in instance_types if t in INSTANCE_TYPES}
        unknown = sorted(set(instance_types) - set(known))
        for start in range(0, len(unknown), 100):   # DescribeInstanceTypes takes up to 100 types
            for info in self.client("ec2").describe_instance_types(
                    InstanceTypes=unknown[start:start + 100])["InstanceTypes"]:
                known[info["InstanceType"]] = info["VCpuInfo"]["DefaultVCpus"]
        return known

    # -- the checks --

    def check_zone(self) -> CheckResult:
        itype = self.config.instance_type
        zone, why = self.cluster_zone()
        paginator = self.client("ec2").get_paginator("describe_instance_type_offerings")
        offered = sorted({o["Location"]
                          for page in paginator.paginate(
                              LocationType="availability-zone",
                              Filters=[{"Name": "instance-type", "Values": [itype]}])
                          for o in page["InstanceTypeOfferings"]})
        if zone in offered:
            return CheckResult("zone", True, f"{itype} is offered in {zone} ({why})")
        if not offered:
            return CheckResult("zone", False,
                               f"{itype} is offered in no zone of {self.region}: deploy to another "
                               f"region (--region, and the same for cdk) or choose another instance_type")
        vpc_zones = self.config.availability_zones or ()
        in_vpc = [z for z in vpc_zones if z in offered]
        if in_vpc:
            fix = f"`{self.settings_command(f'cluster_availability_zone={in_vpc[0]}')}`"
        else:
            others = [z for z in self.region_zones() if z not in offered]
            pair = (offered + others)[:2]
            command = self.settings_command(f"availability_zones={pair[0]},{pair[1]}",
                                            f"cluster_availability_zone={pair[0]}")
            fix = (f"`{command}` (before the first deploy: changing availability_zones later "
                   "replaces the subnets)")
        return CheckResult("zone", False,
                           f"{itype} is not offered in {zone} ({why}); zones of {self.region} that offer "
                           f"it: {', '.join(offered)}. Set availability_zones/cluster_availability_zone "
                           f"to one of them: {fix}")

    def check_vcpu_quota(self) -> CheckResult:
        itype = self.config.instance_type
        if self.config.capacity_block:
            code, name = vcpu_quota(itype)
            return CheckResult("vcpu-quota", True,
                               f"not needed: the {self.nodes} x {itype} run in a Capacity Block, whose "
                               f"instances are not On-Demand Instances: {name} ({code}) does not count them")
        if not self.config.worker_spot:
            ok, message = self.on_demand_fit(self.nodes, "worker_count + 1 nodes",
                                             "stop instances of the family, or lower worker_count")
            return CheckResult("vcpu-quota", ok, message)
        # Spot workers: the master stays On-Demand, and only it counts against the On-Demand quota.
        fits = [self.on_demand_fit(1, "the master, On-Demand with worker_spot too",
                                   "or stop On-Demand instances of the family")]
        if self.config.worker_count:
            fits.append(self.spot_fit(self.config.worker_count))
        # The quotas that fall short first: they are what to act on.
        return CheckResult("vcpu-quota", all(ok for ok, _ in fits),
                           " | ".join(message for _, message in sorted(fits, key=lambda fit: fit[0])))

    def on_demand_fit(self, count: int, role: str, other_fixes: str) -> tuple[bool, str]:
        """(fits, message): `count` nodes in the On-Demand vCPU quota of their family."""
        code, name = vcpu_quota(self.config.instance_type)
        return self.quota_fit(code, name, count, role, self.on_demand_vcpus_in_use(code), other_fixes)

    def spot_fit(self, count: int) -> tuple[bool, str]:
        """(fits, message): `count` Spot workers in the Spot vCPU quota of their family."""
        itype = self.config.instance_type
        unspot = f"set worker_spot=false (`{self.settings_command('worker_spot=false')}`) to run them On-Demand"
        quota = spot_vcpu_quota(itype)
        if quota is None:
            known = ", ".join(f"{name} ({code})" for code, name in SPOT_VCPU_QUOTAS.values())
            return False, (f"Spot workers not checked: no Spot vCPU quota is recorded here for {itype}, "
                           f"and AWS's quota names do not say which counts it (recorded: {known}). Find it "
                           f"in the Service Quotas console (Amazon EC2, the \"... Spot Instance Requests\" "
                           f"quotas) and make sure it has {count * INSTANCE_TYPES[itype].vcpus} vCPUs free "
                           f"for the {count} x {itype} Spot workers, or {unspot}")
        code, name = quota
        return self.quota_fit(code, name, count, "worker_count Spot workers", self.spot_vcpus_in_use(code),
                              f"stop Spot Instances of the family, lower worker_count, or {unspot} (the "
                              f"On-Demand quota then counts them)")

    def quota_fit(self, code: str, name: str, count: int, role: str, in_use: tuple[int, int],
                  other_fixes: str) -> tuple[bool, str]:
        """(fits, message): `count` nodes' vCPUs in quota `code`, of which `in_use` (vCPUs,
        instances) are taken; a shortfall says by how much and how to ask for more."""
        itype = self.config.instance_type
        vcpus = INSTANCE_TYPES[itype].vcpus
        need, quota, (used, counted) = count * vcpus, self.quota(code), in_use
        available = quota - used
        what = f"{count} x {itype} ({vcpus} vCPUs each; {role})"
        in_use_text = f"{used} in use by {counted} running instance(s) of the family" if counted else "none in use"
        if need <= available:
            return True, (f"{name} ({code}): {need} vCPUs needed for {what}, {available} of {quota} "
                          f"available ({in_use_text})")
        desired = used + need
        return False, (
            f"{name} ({code}) is {quota} vCPUs, {in_use_text}: {available} available, {need} needed for "
            f"{what}: {desired - quota} short. Raise the quota to at least {desired} in the Service Quotas "
            f"console (Amazon EC2, \"{name}\") or with `aws service-quotas request-service-quota-increase "
            f"--service-code ec2 --quota-code {code} --desired-value {desired} --region {self.region}`, "
            f"{other_fixes}")

    def running_instances(self) -> list[dict]:
        """The region's pending and running instances (DescribeInstances, once per pre-flight)."""
        if self._instances is None:
            paginator = self.client("ec2").get_paginator("describe_instances")
            self._instances = [
                instance
                for page in paginator.paginate(
                    Filters=[{"Name": "instance-state-name", "Values": ["pending", "running"]}])
                for reservation in page["Reservations"] for instance in reservation["Instances"]]
        return self._instances

    def vcpus_in_use(self, counted: Callable[[dict], bool]) -> tuple[int, int]:
        """(vCPUs, instances) of the pending and running instances `counted` selects."""
        types = [i["InstanceType"] for i in self.running_instances() if counted(i)]
        vcpus = self.vcpus(types)
        return sum(vcpus[t] for t in types), len(types)

    def on_demand_vcpus_in_use(self, code: str) -> tuple[int, int]:
        """(vCPUs, instances) of the pending and running On-Demand instances counted by quota `code`."""
        return self.vcpus_in_use(lambda i: i.get("InstanceLifecycle") not in NOT_ON_DEMAND
                                 and quota_code(i["InstanceType"]) == code)

    def spot_vcpus_in_use(self, code: str) -> tuple[int, int]:
        """(vCPUs, instances) of the pending and running Spot Instances counted by Spot quota `code`.
        Spot requests still open (not yet fulfilled, e.g. a Spot Fleet's) count against it too; they
        are not looked up: the cluster's groups launch Spot Instances that leave no open request."""
        return self.vcpus_in_use(lambda i: i.get("InstanceLifecycle") == "spot"
                                 and spot_quota_code(i["InstanceType"]) == code)

    def check_elastic_ip_quota(self) -> CheckResult:
        code, name = ELASTIC_IP_QUOTA
        quota = self.quota(code)
        addresses = self.client("ec2").describe_addresses()["Addresses"]
        need = 2 if self.config.master_is_public else 1
        why = ("the NAT gateway's and the master's" if need == 2 else
               f"the NAT gateway's; the master has none: with efa each {self.config.instance_type} "
               f"node has {self.config.efa_interfaces} network interfaces")
        available = quota - len(addresses)
        if need <= available:
            return CheckResult("elastic-ip-quota", True,
                               f"{name} ({code}): {need} needed ({why}), {available} of {quota} "
                               f"available ({len(addresses)} allocated)")
        desired = len(addresses) + need
        fixes = [f"raise the quota to at least {desired} in the Service Quotas console (Amazon EC2, "
                 f"\"{name}\") or with `aws service-quotas request-service-quota-increase "
                 f"--service-code ec2 --quota-code {code} --desired-value {desired} --region {self.region}`"]
        unused = [a["AllocationId"] for a in addresses if not a.get("AssociationId") and a.get("AllocationId")]
        if unused:
            fixes.append(f"release addresses nothing uses (not associated: {', '.join(unused)}) with "
                         f"`aws ec2 release-address --allocation-id ID --region {self.region}`")
        return CheckResult(
            "elastic-ip-quota", False,
            f"{name} ({code}) is {quota} addresses, {len(addresses)} allocated: {max(available, 0)} "
            f"available, {need} needed ({why}). To fix, " + ", or ".join(fixes))

    def check_capacity_reservation(self) -> CheckResult:
        target = self.config.capacity_reservation
        if not target:
            return CheckResult("capacity-reservation", True, "none set: the nodes use open On-Demand capacity")
        zone, _ = self.cluster_zone()
        if target.startswith("cr-"):
            found = self.describe_reservation(target)
            if found is None:
                return CheckResult("capacity-reservation", False,
                                   f"{target} does not exist in {self.region} (or is not shared with "
                                   f"this account): check the id and the region, or unset capacity_reservation")
            problems = self.reservation_problems(found, zone)
            if problems:
                return CheckResult("capacity-reservation", False, f"{target} {'; '.join(problems)}")
            return CheckResult("capacity-reservation", True, f"{target}: {self.describe_fit(found)}")
        ids = self.group_reservations(target)
        if not ids:
            return CheckResult("capacity-reservation", False,
                               f"resource group {target} lists no capacity reservation: add one for "
                               f"{self.nodes} x {self.config.instance_type} in {zone} to it")
        report = []
        for cr in ids:
            found = self.describe_reservation(cr)
            problems = ["does not exist"] if found is None else self.reservation_problems(found, zone)
            if not problems:
                return CheckResult("capacity-reservation", True,
                                   f"{cr} of resource group {target}: {self.describe_fit(found)}")
            report.append(f"{cr} {'; '.join(problems)}")
        # EC2 would launch the nodes as On-Demand Instances outside any reservation instead.
        return CheckResult("capacity-reservation", False,
                           f"no reservation of resource group {target} fits (the nodes would launch "
                           f"without one): " + " | ".join(report))

    def describe_reservation(self, reservation_id: str) -> dict | None:
        try:
            found = self.client("ec2").describe_capacity_reservations(
                CapacityReservationIds=[reservation_id])["CapacityReservations"]
        except ClientError as err:
            if err.response["Error"]["Code"].startswith("InvalidCapacityReservationId."):
                return None
            raise
        return found[0] if found else None

    def group_reservations(self, group_arn: str) -> list[str]:
        paginator = self.client("resource-groups").get_paginator("list_group_resources")
        return [r["Identifier"]["ResourceArn"].rsplit("/", 1)[-1]
                for page in paginator.paginate(Group=group_arn)
                for r in page.get("Resources", [])
                if r["Identifier"]["ResourceType"] == "AWS::EC2::CapacityReservation"]

    def reservation_problems(self, r: dict, zone: str) -> list[str]:
        """Why reservation `r` cannot take this deployment's nodes (empty: it can)."""
        itype, problems = self.config.instance_type, []
        is_block = r.get("ReservationType") == "capacity-block"
        if r["InstanceType"] != itype:
            problems.append(f"is for {r['InstanceType']}, not instance_type {itype}")
        if r["AvailabilityZone"] != zone:
            problems.append(f"is in {r['AvailabilityZone']}, not the cluster's zone {zone}: put the "
                            f"cluster there (availability_zones and cluster_availability_zone)")
        if r.get("InstancePlatform", "Linux/UNIX") != "Linux/UNIX":
            problems.append(f"is for {r['InstancePlatform']}; the nodes run Linux/UNIX (Ubuntu)")
        if self.config.capacity_block and not is_block:
            problems.append("is an On-Demand Capacity Reservation, not a Capacity Block: set capacity_block=false")
        if not self.config.capacity_block and is_block:
            problems.append("is a Capacity Block: set capacity_block=true (its instances launch with "
                            "market type capacity-block)")
        state = r["State"]
        if state == "scheduled":
            start = r.get("StartDate")
            when = f"starts {start:%Y-%m-%d %H:%M} UTC" if start else "has not started"
            problems.append(f"is scheduled: it {when}, and the nodes cannot launch into it before; "
                            f"deploy after it is active")
        elif state != "active":
            problems.append(f"is {state}, not active")
        available = r["AvailableInstanceCount"]
        if available < self.nodes:
            problems.append(f"has {available} of its {r['TotalInstanceCount']} instances available, "
                            f"{self.nodes} needed (worker_count + 1)")
        return problems

    def describe_fit(self, r: dict) -> str:
        kind = ("Capacity Block" if r.get("ReservationType") == "capacity-block"
                else "On-Demand Capacity Reservation")
        end = f", ends {r['EndDate']:%Y-%m-%d %H:%M} UTC" if r.get("EndDate") else ""
        return (f"{kind} of {r['InstanceType']} in {r['AvailabilityZone']}, {r['State']}, "
                f"{r['AvailableInstanceCount']} of {r['TotalInstanceCount']} available for "
                f"{self.nodes} nodes{end}")

    def check_stacks(self) -> CheckResult:
        cfn, found, blocked = self.client("cloudformation"), [], []
        for stack_id in STACK_IDS:
            name = self.config.stack_name(stack_id)
            try:
                status = cfn.describe_stacks(StackName=name)["Stacks"][0]["StackStatus"]
            except ClientError as err:
                if err.response["Error"]["Code"] == "ValidationError" and "does not exist" in str(err):
                    continue
                raise
            if status in BLOCKING_STACK_STATES:
                blocked.append(f"{name} is {status}: "
                               + BLOCKING_STACK_STATES[status].format(name=name, region=self.region))
            elif status.endswith("_IN_PROGRESS"):
                blocked.append(f"{name} is {status}: wait until it finishes")
            elif status != "DELETE_COMPLETE":
                found.append(f"{name} ({status})")
        if blocked:
            return CheckResult("stacks", False, "; ".join(blocked))
        return CheckResult("stacks", True, ("exist, the deploy updates them: " + ", ".join(found)) if found
                           else f"none of {', '.join(self.config.stack_name(s) for s in STACK_IDS)} exists yet")

    def deployed_file_system(self) -> str | None:
        """The file system id the deployed shared stack gives the training stacks (its SSM
        parameter, infra/constructs/file_system.py); None before the first deploy."""
        name = f"/maskrcnn/{self.config.stack_name(outputs.NETWORK_STORAGE_STACK)}/file-system-id"
        try:
            return self.client("ssm").get_parameter(Name=name)["Parameter"]["Value"]
        except ClientError as err:
            if err.response["Error"]["Code"] == "ParameterNotFound":
                return None
            raise

    def created_file_systems(self) -> set[str]:
        """The file systems the deployed shared stack created itself (not existing_file_system_id)."""
        paginator = self.client("cloudformation").get_paginator("list_stack_resources")
        return {r["PhysicalResourceId"]
                for page in paginator.paginate(StackName=self.config.stack_name(outputs.NETWORK_STORAGE_STACK))
                for r in page["StackResourceSummaries"] if r["ResourceType"] == "AWS::EFS::FileSystem"}

    def file_system_users(self) -> list[str]:
        """What mounts the deployed file system now: cluster nodes and a running notebook."""
        cluster = self.config.stack_name(outputs.EFS_CLUSTER_STACK)
        names = [f"{cluster}-master", f"{cluster}-worker"]   # the groups' fixed names (infra/constructs/cluster.py)
        users = [f"{len(g['Instances'])} instance(s) of {g['AutoScalingGroupName']}"
                 for g in self.client("autoscaling").describe_auto_scaling_groups(
                     AutoScalingGroupNames=names)["AutoScalingGroups"] if g["Instances"]]
        sagemaker = self.config.stack_name(outputs.SAGEMAKER_STACK)
        try:
            (stack,) = self.client("cloudformation").describe_stacks(StackName=sagemaker)["Stacks"]
        except ClientError as err:
            if "does not exist" in str(err):
                return users
            raise
        notebook = next((o["OutputValue"] for o in stack.get("Outputs", [])
                         if o["OutputKey"] == outputs.NOTEBOOK_NAME), None)
        if notebook:
            status = self.client("sagemaker").describe_notebook_instance(
                NotebookInstanceName=notebook)["NotebookInstanceStatus"]
            if status in ("Pending", "InService", "Updating"):
                users.append(f"the notebook {notebook} ({status})")
        return users

    def check_file_system(self) -> CheckResult:
        deployed = self.deployed_file_system()
        wanted = self.config.existing_file_system_id
        if deployed is None:
            return CheckResult("file-system", True, "no shared file system is deployed yet")
        if wanted == deployed or (wanted is None and deployed in self.created_file_systems()):
            return CheckResult("file-system", True, f"the deploy keeps {deployed}")
        target = wanted or "a new file system"
        users = self.file_system_users()
        if not users:
            return CheckResult("file-system", True,
                               f"the deploy switches from {deployed} to {target}; nothing mounts {deployed} now")
        return CheckResult("file-system", False, (
            f"the deploy switches from {deployed} to {target} and deletes {deployed}'s mount targets in "
            f"this VPC, which forcibly breaks the NFS mounts of {', '.join(users)} (writes not yet "
            f"committed are lost). Stop the run gracefully (`sudo maskrcnn job stop RUN` on the master), "
            f"`maskrcnn cluster pause`, stop the notebook, then deploy; `maskrcnn cluster resume` "
            f"afterwards mounts {target}"))

    def run(self) -> list[CheckResult]:
        checks: list[tuple[str, Callable[[], CheckResult]]] = [
            ("zone", self.check_zone), ("vcpu-quota", self.check_vcpu_quota),
            ("elastic-ip-quota", self.check_elastic_ip_quota),
            ("capacity-reservation", self.check_capacity_reservation), ("stacks", self.check_stacks),
            ("file-system", self.check_file_system)]
        return [_guarded(name, check) for name, check in checks]


def quota_code(instance_type: str) -> str | None:
    """The code of the On-Demand vCPU quota (P, G and VT, Standard) `instance_type` counts
    against; None for families with quotas of their own."""
    quota = vcpu_quota(instance_type)
    return quota[0] if quota else None


def spot_vcpu_quota(instance_type: str) -> tuple[str, str] | None:
    """(quota code, quota name) of the Spot vCPU quota `instance_type` counts against (P by
    generation, G and VT, Standard); None for the families with quotas of their own and for P6,
    which no Spot quota's name covers."""
    on_demand = vcpu_quota(instance_type)
    key = next((k for k, quota in VCPU_QUOTAS.items() if quota == on_demand), None)
    if key == "P":
        key = SPOT_P_GENERATIONS.get(_GENERATION.match(instance_type).group(1))
    return SPOT_VCPU_QUOTAS.get(key)


def spot_quota_code(instance_type: str) -> str | None:
    quota = spot_vcpu_quota(instance_type)
    return quota[0] if quota else None


def _guarded(name: str, check: Callable[[], CheckResult]) -> CheckResult:
    """The check's result; AWS refusing or failing a call is that check failing, said plainly."""
    try:
        return check()
    except ClientError as err:
        code = err.response.get("Error", {}).get("Code", "")
        message = err.response.get("Error", {}).get("Message", "")
        action = f"{IAM_PREFIX[_service_of(err)]}:{err.operation_name}"
        if code in ACCESS_DENIED:
            return CheckResult(name, False,
                               f"not checked: the caller may not call {action} ({code}); grant it "
                               f"(with the other read-only actions of docs/infra.md \"Pre-flight\") "
                               f"or run as a principal that has it")
        return CheckResult(name, False, f"not checked: {action} failed: {code}: {message}")
    except BotoCoreError as err:   # no endpoint, connection refused, credentials expired mid-run
        return CheckResult(name, False, f"not checked: {err}")


def _service_of(err: ClientError) -> str:
    """The service of a failed call, from the operation (ClientError carries only its name)."""
    return {"GetServiceQuota": "service-quotas", "GetAWSDefaultServiceQuota": "service-quotas",
            "ListGroupResources": "resource-groups",
            "DescribeStacks": "cloudformation", "ListStackResources": "cloudformation",
            "GetParameter": "ssm", "DescribeAutoScalingGroups": "autoscaling",
            "DescribeNotebookInstance": "sagemaker"}.get(err.operation_name, "ec2")


def run_checks(config: AppConfig, session: boto3.session.Session,
               settings_file: Path | None = None) -> list[CheckResult]:
    return Preflight(config, session, settings_file).run()


def format_results(results: list[CheckResult]) -> str:
    lines = [f"{'PASS' if r.ok else 'FAIL'}  {r.name}: {r.message}" for r in results]
    failed = sum(not r.ok for r in results)
    lines.append(f"{len(results) - failed} of {len(results)} checks passed"
                 + (f"; fix the {failed} failed before `cdk deploy`" if failed else ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="maskrcnn preflight", description=__doc__.splitlines()[0])
    p.add_argument("--region", help="default: AWS_REGION / the profile's region")
    p.add_argument("--settings-file", type=Path,
                   help=f"the deployment's settings (default: {DEFAULT_PATH.name} at the repository root; "
                        "the file cdk reads with -c settings_file=PATH)")
    p.add_argument("--json", action="store_true", help="print the results as a JSON list")
    a = p.parse_args(argv)
    settings_file = a.settings_file.expanduser().resolve() if a.settings_file else None
    try:
        config = load_config(settings_file)
        session = make_session(a.region)
    except ConfigError as err:
        print(f"error: bad settings: {err}", file=sys.stderr)
        return 2
    except LaunchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    results = run_checks(config, session, settings_file)
    if a.json:
        print(json.dumps([dataclasses.asdict(r) for r in results], indent=2))
    else:
        print(f"pre-flight of {config.stack_name(outputs.EFS_CLUSTER_STACK)} and its stacks in "
              f"{session.region_name}: {config.worker_count + 1} x {config.instance_type}")
        print(format_results(results))
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
