"""The app's settings, validated once, before any construct is created.

cdk.json's "context" holds the documented defaults; `cdk synth -c key=value` overrides them. Values
from cdk.json arrive typed (numbers, booleans, null), values from `-c` arrive as strings, so every
parser accepts both. A bad value raises ConfigError naming the key and what is allowed; app.py turns
that into a one-line message and a non-zero exit instead of a stack trace from inside CDK.
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
# EFS ids: `fs-` + 17 hex characters today; older file systems still have 8.
_FILE_SYSTEM_ID = re.compile(r"^fs-(?:[0-9a-f]{8}|[0-9a-f]{17})$")
_KEY_PAIR_NAME = re.compile(r"^[\x20-\x7e]{1,255}$")
_NOTEBOOK_INSTANCE_TYPE = re.compile(r"^ml\.[a-z0-9]+\.[a-z0-9]+$")
_SSM_PARAMETER = re.compile(r"^/aws/service/[A-Za-z0-9_./-]+$")
_AMI_ID = re.compile(r"^ami-(?:[0-9a-f]{8}|[0-9a-f]{17})$")
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
# Prefixed to the stack names, hence to the group, secret and export names derived from them.
# Short enough that "<prefix>-EfsClusterStack-cluster-key" stays a readable name.
_NAME_PREFIX = re.compile(r"^[A-Za-z](?:[A-Za-z0-9-]{0,22}[A-Za-z0-9])?$")
_ZONE = re.compile(r"^([a-z]{2}(?:-gov)?-[a-z]+-\d)[a-z]$")
VPC_ZONE_COUNT = 2
OPTIONAL_KEYS = ("ssh_cidr", "key_pair_name", "existing_file_system_id", "notification_email",
                 "ami_id", "name_prefix", "availability_zones", "cluster_availability_zone",
                 "fsx_lustre_storage_gib")
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

    @property
    def cluster_zone_index(self) -> int:
        """Which of the VPC's zones (and of its public and private subnets) the cluster uses."""
        if self.cluster_availability_zone is None:
            return 0
        return self.availability_zones.index(self.cluster_availability_zone)

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
        """Builds the config from context (cdk.json's values merged with `-c` overrides)."""
        known = set(cls.keys())
        unknown = sorted(k for k in context if _OWN_KEY.match(k) and k not in known)
        if unknown:
            raise ConfigError(
                f"unknown context key {unknown[0]!r}; known keys: {', '.join(sorted(known))}")
        # CDK drops context keys whose value is null, so an optional key may simply be absent.
        missing = [k for k in cls.keys() if k not in context and k not in OPTIONAL_KEYS]
        if missing:
            raise ConfigError(
                f"context key {missing[0]!r} is missing; cdk.json's \"context\" holds the defaults "
                f"(run from the repository root, or pass -c {missing[0]}=...)")

        values = {name: parse(name, context.get(name)) for name, parse in _PARSERS.items()}
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
        if self.ssh_cidr and not self.key_pair_name:
            raise ConfigError(
                "context key 'key_pair_name' is required when ssh_cidr is set: name an existing "
                "EC2 key pair in the target region, or unset ssh_cidr to connect with SSM Session "
                "Manager instead")


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


_PARSERS: dict[str, Callable[[str, Any], Any]] = {
    "instance_type": _choice(tuple(INSTANCE_TYPES)),
    "worker_count": _int_in(WORKER_COUNT),
    "ebs_volume_size_gib": _int_in(EBS_VOLUME_GIB),
    "ssh_cidr": _ssh_cidr,
    "key_pair_name": _matching(
        _KEY_PAIR_NAME, "an EC2 key pair name (printable ASCII, up to 255)", True),
    "efa": _bool,
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
        "dlami_ssm_parameter names, or unset to use the parameter's latest AMI", True),
    "name_prefix": _matching(
        _NAME_PREFIX, "up to 24 letters, digits and hyphens, starting with a letter and not "
        "ending with a hyphen (e.g. team-a), or unset for the plain stack names", True),
    "availability_zones": _zones,
    "cluster_availability_zone": _matching(
        _ZONE, "an availability zone name such as us-east-1d, one of availability_zones", True),
    "fsx_lustre_storage_gib": _lustre_storage,
}
assert tuple(_PARSERS) == AppConfig.keys(), "every AppConfig field needs a parser, in order"
