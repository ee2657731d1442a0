"""The app's settings: their defaults, what each means, and their validation, done once, before any
construct is created.

A deployment's values live in its settings file (infra/settings.py: `settings.json`, written by
`maskrcnn settings set key=value`), over the defaults here; `cdk ... -c key=value` overrides
either for one command. Values from the file arrive typed (numbers, booleans, null), values from
`-c` arrive as strings, so every parser accepts both. A bad value raises ConfigError naming the key
and what is allowed; app.py turns that into a one-line message and a non-zero exit instead of a
stack trace from inside CDK.
"""
from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, fields
from typing import Any, Callable, Mapping

from infra.instance_types import AMI_FAMILIES, EFA_INSTANCE_TYPES, INSTANCE_TYPES, ami_family


class ConfigError(ValueError):
    """A context value that the app cannot use; the message names the key and the fix."""


EFS_THROUGHPUT_MODES = ("elastic", "bursting")
# Where the training image is built: infra/image_build.py resolves `auto` at synth.
IMAGE_BUILDS = ("auto", "local", "codebuild")
# EFS ids: `fs-` + 17 hex characters today; older file systems still have 8.
_FILE_SYSTEM_ID = re.compile(r"^fs-(?:[0-9a-f]{8}|[0-9a-f]{17})$")
_KEY_PAIR_NAME = re.compile(r"^[\x20-\x7e]{1,255}$")
_NOTEBOOK_INSTANCE_TYPE = re.compile(r"^ml\.[a-z0-9]+\.[a-z0-9]+$")
_SSM_PARAMETER = re.compile(r"^/aws/service/[A-Za-z0-9_./-]+$")
_AMI_ID = re.compile(r"^ami-(?:[0-9a-f]{8}|[0-9a-f]{17})$")
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
# Prefixed to the stack names, hence to the group, secret and export names derived from them.
# Short enough that "<prefix>-EfsClusterStack-munge-key" stays a readable name.
_NAME_PREFIX = re.compile(r"^[A-Za-z](?:[A-Za-z0-9-]{0,22}[A-Za-z0-9])?$")
_ZONE = re.compile(r"^([a-z]{2}(?:-gov)?-[a-z]+-\d)[a-z]$")
VPC_ZONE_COUNT = 2
_CAPACITY_RESERVATION = re.compile(
    r"^(?:cr-[0-9a-f]{17}|arn:aws[a-z-]*:resource-groups:[a-z0-9-]+:\d{12}:group/[A-Za-z0-9_.-]+)$")
# Context keys this app owns look like Python identifiers; CDK's own keys contain ':', '@' or '-'.
_OWN_KEY = re.compile(r"^[a-z][a-z0-9_]*$")

# Bounds with their reasons. The Deep Learning AMI's root snapshot is about 100 GiB; EBS gp3 stops
# at 16 TiB. A notebook volume is 5 GiB to 16 TiB. 64 workers + 1 master is far above any quota a
# new account gets for GPU instances and catches typos such as 1000.
EBS_VOLUME_GIB = (100, 16384)
NOTEBOOK_VOLUME_GIB = (5, 16384)
WORKER_COUNT = (0, 64)
# FSx for Lustre SCRATCH_2 (and PERSISTENT_2) capacities: 1200 GiB or a multiple of 2400 GiB. The
# upper bound is FSx's default per-region Lustre storage quota (a larger one needs a quota raise
# first, and then this bound raised with it). 0 turns the file system off.
LUSTRE_STORAGE_GIB_STEP = 2400
LUSTRE_STORAGE_GIB_MIN = 1200
LUSTRE_STORAGE_GIB_MAX = 100800
# Idle times: 0 turns the stop off; a day is the longest wait that still saves anything.
IDLE_MINUTES = (0, 1440)
# The stall alarm evaluates one data point a minute; CloudWatch caps an alarm's evaluation range at
# one day. Below 5 minutes a checkpoint save alone would set it off.
STALL_ALARM_MINUTES = (5, 1440)
MONTHLY_BUDGET_USD = (1, 10_000_000)
BOOT_FAILURE_LIMIT = (1, 100)
# The retention periods CloudWatch Logs accepts (PutRetentionPolicy), in days.
LOG_RETENTION_DAYS = (1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827,
                      2192, 2557, 2922, 3288, 3653)
# A Spot maximum price must be above USD 0.001 (EC2 refuses the launch otherwise).
SPOT_MAX_PRICE_FLOOR_USD = 0.001
_USD = re.compile(r"^\d+(?:\.\d+)?$")


@dataclass(frozen=True)
class Setting:
    default: Any
    help: str


# Every setting, its default and what it means: the one source of `maskrcnn settings show`,
# docs/infra.md's table (a test keeps them equal) and AppConfig.from_context's defaults.
SETTINGS: dict[str, Setting] = {
    "instance_type": Setting('g5.48xlarge', (
        "EC2 type of every cluster node: p4d.24xlarge, p5.48xlarge, g5.xlarge ... g5.48xlarge, "
        "or c5.xlarge / m5.xlarge (CPU, wiring tests only); only types the AMI family of "
        "dlami_ssm_parameter supports (not p3/p3dn: V100). See infra/instance_types.py.")),
    "worker_count": Setting(1, (
        "Cluster workers besides the master (0 to 64). Total nodes = worker_count + 1.")),
    "ebs_volume_size_gib": Setting(200, (
        "Encrypted gp3 root volume of each node, GiB (100 to 16384; the Deep Learning AMI needs"
        " about 100).")),
    "ssh_cidr": Setting(None, (
        "IPv4 CIDR allowed to SSH to the master (e.g. 203.0.113.7/32). null: no SSH ingress; "
        "connect with SSM Session Manager.")),
    "key_pair_name": Setting(None, (
        "Existing EC2 key pair for SSH to the master; required when ssh_cidr is set.")),
    "efa": Setting(None, (
        "Elastic Fabric Adapter interfaces, one per EFA-capable network card (p4d.24xlarge 4, "
        "p5.48xlarge 32, g5.8xlarge and larger 1; infra/instance_types.py); the security groups "
        "allow EFA traffic to and from themselves. null (or auto): on wherever instance_type has"
        " EFA cards. false: NCCL runs over TCP sockets on one ENA interface, a fraction of EFA's "
        "bandwidth (docs/infra.md).")),
    "existing_file_system_id": Setting(None, (
        "Reuse this EFS (fs- + 17 hex) instead of creating one. It must have no mount targets "
        "in another VPC. null: create a new one.")),
    "efs_throughput_mode": Setting('elastic', (
        "elastic (default; no burst credits to run out) or bursting.")),
    "notebook_instance_type": Setting('ml.t3.medium', (
        "SageMaker notebook instance type.")),
    "notebook_volume_size_gib": Setting(50, (
        "Notebook storage volume, GiB (5 to 16384).")),
    "dlami_ssm_parameter": Setting('/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id', (
        "Public SSM parameter holding the cluster's AMI id, read at the first deploy and kept "
        "in cdk.context.json (docs/infra.md, \"The cluster's AMI\"); must be a known AMI family "
        "(infra/instance_types.py).")),
    "notification_email": Setting(None, (
        "Email address subscribed to the alerts topic (node launch/terminate failures, EFS "
        "burst credits). null: the topic exists without a subscription.")),
    "ami_id": Setting(None, (
        "The cluster's AMI (ami-...) of the dlami_ssm_parameter family, over the one kept in "
        "cdk.context.json. null: the parameter's AMI as the first deploy read it.")),
    "name_prefix": Setting(None, (
        "Prefix of the stack names (and the group, secret and export names derived from them), "
        "for several deployments per account and region, e.g. team-a. null: plain names.")),
    "availability_zones": Setting(None, (
        "The VPC's two zones, e.g. us-east-1a,us-east-1d (decide before the first deploy: "
        "changing them replaces the subnets). null: the region's first two.")),
    "cluster_availability_zone": Setting(None, (
        "Zone of the EC2 cluster, one of availability_zones (where the instance type is "
        "offered, has capacity, or your capacity reservation is). null: the VPC's first zone.")),
    "fsx_lustre_storage_gib": Setting(0, (
        "FSx for Lustre file system (SCRATCH_2) in the cluster's zone, linked to s3://<data "
        "bucket>/data (COCO appears at /fsx/coco on the nodes; a SageMaker train channel with "
        "launcher --fsx): 0 = none, else 1200 or a multiple of 2400 GiB. Costs while the shared"
        " stack exists (docs/infra.md).")),
    "capacity_reservation": Setting(None, (
        "Launch every cluster node into this On-Demand Capacity Reservation or Capacity Block "
        "(cr-...), or into any open reservation of a resource group (its ARN): reserve "
        "instance_type in the cluster's zone for worker_count + 1 instances, an On-Demand "
        "reservation in a cluster placement group of your own, or a Capacity Block. The stack "
        "then creates no placement group (the reservation places the nodes). null: open "
        "on-demand capacity.")),
    "capacity_block": Setting(False, (
        "true: capacity_reservation is a Capacity Block for ML (market type capacity-block); "
        "the nodes run only inside the block's time window.")),
    "idle_scaledown_minutes": Setting(30, (
        "Scale the worker group to zero after this many minutes without a running training job "
        "(the master stays up; the next run scales the workers back). 0: never.")),
    "notebook_idle_minutes": Setting(60, (
        "Stop the SageMaker notebook instance after this many minutes without kernel or "
        "terminal activity. 0: never.")),
    "monthly_budget_usd": Setting(None, (
        "Monthly cost budget for the deployment's tagged resources, USD; the alerts topic hears"
        " at 80% actual and 100% forecast. null: no budget.")),
    "boot_failure_limit": Setting(10, (
        "After this many consecutive failed node boots a group stops launching (its Launch "
        "process is suspended) and the alerts topic is told which node failed and why.")),
    "log_retention_days": Setting(30, (
        "Days CloudWatch Logs keeps the nodes' boot and training logs (one of CloudWatch's "
        "retention periods).")),
    "worker_spot": Setting(False, (
        "true: the workers are Spot Instances (the master stays On-Demand). EC2 can reclaim one "
        "with two minutes' notice: each node's interruption watcher drains it, requeues its "
        "training job (which checkpoints) and tells the alerts topic; the worker group launches "
        "a replacement. Not with capacity_reservation.")),
    "spot_max_price": Setting(None, (
        "Highest hourly price in USD for a Spot worker, e.g. 12.5 (with worker_spot only). AWS "
        "advises against it: a Spot price above it interrupts the worker. null: pay the current"
        " Spot price, never more than the On-Demand price.")),
    "stall_alarm_minutes": Setting(30, (
        "The cluster's stalled-run alarm fires when a started run writes no heartbeat for this "
        "many minutes (5 to 1440); longer than the run's longest evaluation or checkpoint save.")),
    "image_build": Setting('auto', (
        "Where `cdk deploy` builds the training image (docker/Dockerfile): local (Docker on the "
        "deploying machine, pushed as a CDK asset), codebuild (AWS CodeBuild in the account, "
        "during the deploy of NetworkStorageStack; no Docker needed here), or auto (local when "
        "`docker info` succeeds on this machine, else codebuild; decided at each synth).")),
}


@dataclass(frozen=True)
class AppConfig:
    instance_type: str
    worker_count: int
    ebs_volume_size_gib: int
    ssh_cidr: str | None
    key_pair_name: str | None
    efa: bool
    existing_file_system_id: str | None
    efs_throughput_mode: str
    notebook_instance_type: str
    notebook_volume_size_gib: int
    dlami_ssm_parameter: str
    notification_email: str | None = None
    ami_id: str | None = None
    name_prefix: str | None = None
    availability_zones: tuple[str, ...] | None = None
    cluster_availability_zone: str | None = None
    fsx_lustre_storage_gib: int = 0
    capacity_reservation: str | None = None
    capacity_block: bool = False
    idle_scaledown_minutes: int = 30
    notebook_idle_minutes: int = 60
    monthly_budget_usd: int | None = None
    boot_failure_limit: int = 10
    log_retention_days: int = 30
    worker_spot: bool = False
    spot_max_price: str | None = None
    stall_alarm_minutes: int = 30
    image_build: str = "auto"

    @property
    def cluster_zone_index(self) -> int:
        """Which of the VPC's zones (and of its public and private subnets) the cluster uses."""
        if self.cluster_availability_zone is None:
            return 0
        return self.availability_zones.index(self.cluster_availability_zone)

    @property
    def efa_interfaces(self) -> int:
        """Network interfaces of each node's launch template that are EFA: one per EFA-capable
        network card, or none."""
        return INSTANCE_TYPES[self.instance_type].efa_cards if self.efa else 0

    @property
    def master_is_public(self) -> bool:
        """Whether the master runs in the public subnet with an Elastic IP. AWS assigns no public
        IPv4 address to an instance launched with more than one network interface, so a node
        with an EFA interface on each of several cards runs in the private subnet (reached
        through SSM Session Manager, with the NAT gateway for egress)."""
        return self.efa_interfaces <= 1

    def stack_name(self, base: str) -> str:
        """A stack's CloudFormation name: `base`, or `<name_prefix>-<base>` (several clusters
        per account and region)."""
        return f"{self.name_prefix}-{base}" if self.name_prefix else base

    @property
    def gpus_per_node(self) -> int:
        return INSTANCE_TYPES[self.instance_type].gpus

    @property
    def lustre_enabled(self) -> bool:
        return self.fsx_lustre_storage_gib > 0

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def from_context(cls, context: Mapping[str, Any]) -> "AppConfig":
        """Builds the config from `context` over the defaults (a key that is absent takes its
        default: CDK also drops context keys whose value is null)."""
        known = set(cls.keys())
        unknown = sorted(k for k in context if _OWN_KEY.match(k) and k not in known)
        if unknown:
            raise unknown_setting(unknown[0])
        values = {name: parse(name, context[name] if name in context else SETTINGS[name].default)
                  for name, parse in _PARSERS.items()}
        if values["efa"] is None:   # auto: on wherever the instance type has EFA cards
            values["efa"] = INSTANCE_TYPES[values["instance_type"]].efa
        config = cls(**values)
        config._check_combinations()
        return config

    def _check_combinations(self) -> None:
        if self.efa and self.instance_type not in EFA_INSTANCE_TYPES:
            raise ConfigError(
                f"context key 'efa' is true but instance_type {self.instance_type!r} has no EFA "
                f"support; use one of {', '.join(EFA_INSTANCE_TYPES)} or set efa=false")
        family = ami_family(self.dlami_ssm_parameter)
        if family is None:
            raise ConfigError(
                f"context key 'dlami_ssm_parameter' is {self.dlami_ssm_parameter!r}, not a known "
                f"AMI family; known: {'; '.join(f.ssm_parameter.pattern for f in AMI_FAMILIES)} "
                "(infra/instance_types.py lists the instance types each family's driver supports)")
        if not family.supports(self.instance_type):
            raise ConfigError(
                f"context key 'instance_type' is {self.instance_type!r}, which the AMI of "
                f"dlami_ssm_parameter ({family.description}) does not support: its NVIDIA driver "
                f"does not drive {self.instance_type.split('.')[0]} GPUs; use one of "
                f"{', '.join(family.supported_types())}")
        if self.cluster_availability_zone and not self.availability_zones:
            raise ConfigError(
                "context key 'cluster_availability_zone' needs availability_zones (the VPC's "
                "zones, which are otherwise the region's first two and unknown at synth): set "
                f"both, e.g. -c availability_zones=us-east-1a,us-east-1d "
                f"-c cluster_availability_zone={self.cluster_availability_zone}")
        if (self.cluster_availability_zone
                and self.cluster_availability_zone not in self.availability_zones):
            raise ConfigError(
                f"context key 'cluster_availability_zone' is {self.cluster_availability_zone!r}, "
                f"not one of the VPC's zones (availability_zones: "
                f"{', '.join(self.availability_zones)})")
        if self.capacity_block and not (self.capacity_reservation or "").startswith("cr-"):
            raise ConfigError(
                "context key 'capacity_block' is true but capacity_reservation is not a Capacity "
                "Block's reservation id (cr-...): set capacity_reservation to the id of the "
                "Capacity Block you bought, or set capacity_block=false")
        self._check_spot()
        if self.ssh_cidr and not self.master_is_public:
            raise ConfigError(
                f"context key 'ssh_cidr' is set, but with EFA on (the default for "
                f"{self.instance_type}) each node has {self.efa_interfaces} network interfaces, "
                "and AWS gives no public address to an instance launched with several: the master"
                " runs in the private subnet. Unset ssh_cidr and key_pair_name and connect with "
                "SSM Session Manager (the ConnectCommand output; SSH through it: docs/infra.md); "
                "efa=false would allow SSH at a fraction of EFA's bandwidth between the nodes")
        if self.ssh_cidr and not self.key_pair_name:
            raise ConfigError(
                "context key 'key_pair_name' is required when ssh_cidr is set: name an existing "
                "EC2 key pair in the target region, or unset ssh_cidr to connect with SSM Session "
                "Manager instead")

    def _check_spot(self) -> None:
        if self.spot_max_price is not None and not self.worker_spot:
            raise ConfigError(
                "context key 'spot_max_price' is set but worker_spot is false: set worker_spot="
                "true for Spot workers, or unset spot_max_price")
        if self.worker_spot and self.capacity_reservation:
            # A launch has one market: a Capacity Block's is capacity-block, and an On-Demand
            # Capacity Reservation holds On-Demand instances only; both groups use the reservation.
            kind = ("a Capacity Block" if self.capacity_block else
                    "a Capacity Reservation resource group"
                    if self.capacity_reservation.startswith("arn:")
                    else "an On-Demand Capacity Reservation")
            raise ConfigError(
                f"context key 'worker_spot' is true but capacity_reservation is set ({kind}, "
                f"{self.capacity_reservation}): a Spot Instance cannot launch into a capacity "
                "reservation or Capacity Block. Set worker_spot=false to run the workers in the "
                "reservation, or unset capacity_reservation (and capacity_block) for Spot workers")


def unknown_setting(key: str) -> ConfigError:
    return ConfigError(f"unknown setting {key!r}; known settings: {', '.join(sorted(SETTINGS))}")


# --- parsers: each takes (key, raw value) and returns the typed value or raises ConfigError ---

def _is_unset(raw: Any) -> bool:
    return raw is None or (isinstance(raw, str) and raw.strip().lower() in ("", "null", "none"))


def _choice(allowed: tuple[str, ...]) -> Callable[[str, Any], str]:
    def parse(key: str, raw: Any) -> str:
        value = str(raw).strip() if raw is not None else ""
        if value not in allowed:
            raise ConfigError(f"context key {key!r} is {raw!r}; allowed: {', '.join(allowed)}")
        return value
    return parse


def _int_in(bounds: tuple[int, int]) -> Callable[[str, Any], int]:
    low, high = bounds

    def parse(key: str, raw: Any) -> int:
        if isinstance(raw, bool):
            raw = repr(raw)  # JSON true is not a count
        try:
            value = int(str(raw).strip()) if not isinstance(raw, int) else raw
        except ValueError:
            raise ConfigError(
                f"context key {key!r} is {raw!r}; expected a whole number from {low} to {high}"
            ) from None
        if not low <= value <= high:
            raise ConfigError(
                f"context key {key!r} is {value}; allowed: a whole number from {low} to {high}")
        return value
    return parse


def _auto_bool(key: str, raw: Any) -> bool | None:
    """true, false, or None for auto (unset, null, auto): decided from the instance type."""
    if _is_unset(raw) or (isinstance(raw, str) and raw.strip().lower() == "auto"):
        return None
    try:
        return _bool(key, raw)
    except ConfigError:
        raise ConfigError(f"context key {key!r} is {raw!r}; allowed: true, false, auto (or null: "
                          "on wherever the instance type has EFA)") from None


def _bool(key: str, raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise ConfigError(f"context key {key!r} is {raw!r}; allowed: true, false")


def _matching(pattern: re.Pattern[str], what: str,
              optional: bool) -> Callable[[str, Any], str | None]:
    def parse(key: str, raw: Any) -> str | None:
        if _is_unset(raw):
            if optional:
                return None
            raise ConfigError(f"context key {key!r} must be set; expected {what}")
        value = str(raw).strip()
        if not pattern.match(value):
            raise ConfigError(f"context key {key!r} is {raw!r}; expected {what}")
        return value
    return parse


def _ssh_cidr(key: str, raw: Any) -> str | None:
    if _is_unset(raw):
        return None
    try:
        network = ipaddress.IPv4Network(str(raw).strip(), strict=True)
    except ValueError as error:
        raise ConfigError(
            f"context key {key!r} is {raw!r}, not an IPv4 CIDR ({error}); expected e.g. "
            "203.0.113.7/32, or leave it unset to use SSM Session Manager") from None
    if network.prefixlen == 0:
        raise ConfigError(
            f"context key {key!r} is {raw!r}, which opens SSH to the whole internet; use your own "
            "address range (e.g. 203.0.113.7/32) or leave it unset to use SSM Session Manager")
    return str(network)


def _lustre_storage(key: str, raw: Any) -> int:
    allowed = (f"0 (no FSx for Lustre file system), {LUSTRE_STORAGE_GIB_MIN}, or a multiple of "
               f"{LUSTRE_STORAGE_GIB_STEP} up to {LUSTRE_STORAGE_GIB_MAX} (GiB)")
    if _is_unset(raw):
        return 0
    if isinstance(raw, bool):
        raw = repr(raw)
    try:
        value = raw if isinstance(raw, int) else int(str(raw).strip())
    except ValueError:
        raise ConfigError(f"context key {key!r} is {raw!r}; allowed: {allowed}") from None
    if value == 0 or value == LUSTRE_STORAGE_GIB_MIN or (
            0 < value <= LUSTRE_STORAGE_GIB_MAX and value % LUSTRE_STORAGE_GIB_STEP == 0):
        return value
    raise ConfigError(f"context key {key!r} is {value}; allowed: {allowed}")


def _zones(key: str, raw: Any) -> tuple[str, ...] | None:
    if _is_unset(raw):
        return None
    names = raw if isinstance(raw, list) else str(raw).split(",")
    zones = tuple(str(name).strip() for name in names)
    expected = (f"expected {VPC_ZONE_COUNT} different zone names of one region separated by a "
                "comma, e.g. us-east-1a,us-east-1d")
    matches = [_ZONE.match(zone) for zone in zones]
    if (len(zones) != VPC_ZONE_COUNT or not all(matches) or len(set(zones)) != len(zones)
            or len({m.group(1) for m in matches}) != 1):
        raise ConfigError(f"context key {key!r} is {raw!r}; {expected}")
    return zones


def _optional_int_in(bounds: tuple[int, int]) -> Callable[[str, Any], int | None]:
    strict = _int_in(bounds)

    def parse(key: str, raw: Any) -> int | None:
        return None if _is_unset(raw) else strict(key, raw)
    return parse


def _log_retention(key: str, raw: Any) -> int:
    value = _int_in((1, 3653))(key, raw)
    if value not in LOG_RETENTION_DAYS:
        raise ConfigError(f"context key {key!r} is {value}; allowed (CloudWatch Logs' retention "
                          f"periods, days): {', '.join(map(str, LOG_RETENTION_DAYS))}")
    return value


def _spot_price(key: str, raw: Any) -> str | None:
    """A USD amount as the launch template's MaxPrice string; EC2 refuses one of $0.001 or less."""
    if _is_unset(raw):
        return None
    text = repr(raw) if isinstance(raw, bool) else str(raw).strip()
    if not _USD.match(text) or float(text) <= SPOT_MAX_PRICE_FLOOR_USD:
        raise ConfigError(
            f"context key {key!r} is {raw!r}; expected an hourly price in USD above "
            f"{SPOT_MAX_PRICE_FLOOR_USD} such as 12.5, or unset to pay the current Spot price")
    return text


_PARSERS: dict[str, Callable[[str, Any], Any]] = {
    "instance_type": _choice(tuple(INSTANCE_TYPES)),
    "worker_count": _int_in(WORKER_COUNT),
    "ebs_volume_size_gib": _int_in(EBS_VOLUME_GIB),
    "ssh_cidr": _ssh_cidr,
    "key_pair_name": _matching(
        _KEY_PAIR_NAME, "an EC2 key pair name (printable ASCII, up to 255)", True),
    "efa": _auto_bool,
    "existing_file_system_id": _matching(
        _FILE_SYSTEM_ID, "an EFS id: 'fs-' and 17 (or, for old file systems, 8) lowercase hex "
        "characters, e.g. fs-0123456789abcdef0; or unset to create a file system", True),
    "efs_throughput_mode": _choice(EFS_THROUGHPUT_MODES),
    "notebook_instance_type": _matching(
        _NOTEBOOK_INSTANCE_TYPE, "a SageMaker notebook instance type such as ml.t3.medium", False),
    "notebook_volume_size_gib": _int_in(NOTEBOOK_VOLUME_GIB),
    "dlami_ssm_parameter": _matching(
        _SSM_PARAMETER, "a public SSM parameter path under /aws/service/ holding an AMI id", False),
    "notification_email": _matching(
        _EMAIL, "an email address for the alerts topic, or unset for no subscription", True),
    "ami_id": _matching(
        _AMI_ID, "an AMI id (ami- and 17 or 8 lowercase hex characters) of the family "
        "dlami_ssm_parameter names, or unset to use the parameter's AMI kept at the first deploy", True),
    "name_prefix": _matching(
        _NAME_PREFIX, "up to 24 letters, digits and hyphens, starting with a letter and not "
        "ending with a hyphen (e.g. team-a), or unset for the plain stack names", True),
    "availability_zones": _zones,
    "cluster_availability_zone": _matching(
        _ZONE, "an availability zone name such as us-east-1d, one of availability_zones", True),
    "fsx_lustre_storage_gib": _lustre_storage,
    "capacity_reservation": _matching(
        _CAPACITY_RESERVATION, "an On-Demand Capacity Reservation or Capacity Block id "
        "(cr- and 17 lowercase hex characters) or a resource group ARN "
        "(arn:aws:resource-groups:REGION:ACCOUNT:group/NAME), or unset for open capacity", True),
    "capacity_block": _bool,
    "idle_scaledown_minutes": _int_in(IDLE_MINUTES),
    "notebook_idle_minutes": _int_in(IDLE_MINUTES),
    "monthly_budget_usd": _optional_int_in(MONTHLY_BUDGET_USD),
    "boot_failure_limit": _int_in(BOOT_FAILURE_LIMIT),
    "log_retention_days": _log_retention,
    "worker_spot": _bool,
    "spot_max_price": _spot_price,
    "stall_alarm_minutes": _int_in(STALL_ALARM_MINUTES),
    "image_build": _choice(IMAGE_BUILDS),
}
assert tuple(_PARSERS) == AppConfig.keys() == tuple(SETTINGS), \
    "every AppConfig field needs a parser and a SETTINGS entry, in order"
