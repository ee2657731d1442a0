"""Context validation (infra/config.py) and how app.py reports a bad value: one line naming the
key and what is allowed, a non-zero exit, no stack trace, no stack created."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from infra.config import SETTINGS, AppConfig, ConfigError
from infra.instance_types import INSTANCE_TYPES

from cdk_synth import REPO_ROOT, cdk_json_context, load_app_module


def config_with(**overrides) -> AppConfig:
    return AppConfig.from_context(overrides)


# (overrides, words the message must contain)
BAD_CONTEXT = {
    "negative worker count": ({"worker_count": -1}, ["worker_count", "-1", "0 to 64"]),
    "worker count not a number": ({"worker_count": "two"}, ["worker_count", "'two'", "whole number"]),
    "worker count boolean": ({"worker_count": True}, ["worker_count", "whole number"]),
    "too many workers": ({"worker_count": 1000}, ["worker_count", "1000", "0 to 64"]),
    "volume below the AMI's size": ({"ebs_volume_size_gib": 20}, ["ebs_volume_size_gib", "100 to 16384"]),
    "unknown instance type": ({"instance_type": "p9.huge"}, ["instance_type", "'p9.huge'", "p4d.24xlarge"]),
    "unparsable CIDR": ({"ssh_cidr": "10.0.0.300/32"}, ["ssh_cidr", "not an IPv4 CIDR"]),
    "CIDR with host bits": ({"ssh_cidr": "203.0.113.7/24", "key_pair_name": "k"}, ["ssh_cidr", "host bits"]),
    "SSH open to the internet": ({"ssh_cidr": "0.0.0.0/0", "key_pair_name": "k"}, ["ssh_cidr", "whole internet"]),
    "SSH without a key pair": ({"ssh_cidr": "203.0.113.7/32"}, ["key_pair_name", "required when ssh_cidr"]),
    "short file-system id": ({"existing_file_system_id": "fs-1234"}, ["existing_file_system_id", "17"]),
    "upper-case file-system id": ({"existing_file_system_id": "fs-0123456789ABCDEF0"}, ["existing_file_system_id", "lowercase hex"]),
    "not a file-system id": ({"existing_file_system_id": "vol-0123456789abcdef0"}, ["existing_file_system_id", "fs-"]),
    "unknown throughput mode": ({"efs_throughput_mode": "provisioned"}, ["efs_throughput_mode", "elastic, bursting"]),
    "EFA on a type without it": ({"efa": True, "instance_type": "g5.4xlarge"}, ["efa", "g5.4xlarge", "p4d.24xlarge"]),
    "EFA flag not a boolean": ({"efa": "maybe"}, ["efa", "true, false, auto"]),
    "notebook type without ml. prefix": ({"notebook_instance_type": "t3.medium"}, ["notebook_instance_type", "ml.t3.medium"]),
    "notebook volume too small": ({"notebook_volume_size_gib": 0}, ["notebook_volume_size_gib", "5 to 16384"]),
    "AMI parameter not an SSM path": ({"dlami_ssm_parameter": "ami-0123456789abcdef0"}, ["dlami_ssm_parameter", "/aws/service/"]),
    "V100 type the AMI's driver dropped": ({"instance_type": "p3.16xlarge"}, ["instance_type", "'p3.16xlarge'", "does not support", "p3 GPUs", "g5.48xlarge", "p4d.24xlarge"]),
    "V100 type with EFA": ({"instance_type": "p3dn.24xlarge", "efa": True}, ["instance_type", "'p3dn.24xlarge'", "does not support"]),
    "AMI family the app does not know": ({"dlami_ssm_parameter": "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64"}, ["dlami_ssm_parameter", "not a known AMI family", "base-oss-nvidia-driver-gpu-ubuntu"]),
    "one zone only": ({"availability_zones": "us-east-1a"}, ["availability_zones", "2 different zone names", "us-east-1a,us-east-1d"]),
    "zones of two regions": ({"availability_zones": "us-east-1a,us-west-2a"}, ["availability_zones", "one region"]),
    "not a zone name": ({"availability_zones": "us-east-1,us-east-2"}, ["availability_zones", "zone names"]),
    "cluster zone outside the VPC": ({"availability_zones": "us-east-1a,us-east-1b", "cluster_availability_zone": "us-east-1c"}, ["cluster_availability_zone", "'us-east-1c'", "not one of the VPC's zones", "us-east-1a, us-east-1b"]),
    "cluster zone without the VPC's zones": ({"cluster_availability_zone": "us-east-1d"}, ["cluster_availability_zone", "needs availability_zones", "unknown at synth"]),
    "bad alerts email": ({"notification_email": "not-an-address"}, ["notification_email", "email address"]),
    "bad AMI id": ({"ami_id": "ami-123"}, ["ami_id", "ami-", "17"]),
    "name prefix ending with a hyphen": ({"name_prefix": "team-"}, ["name_prefix", "not ending with a hyphen"]),
    "misspelt key": ({"worker_cout": 2}, ["unknown setting", "worker_cout", "worker_count"]),
    "capacity block without a reservation id": ({"capacity_block": True}, ["capacity_block", "cr-"]),
    "capacity block on a resource group": ({"capacity_block": True, "capacity_reservation": "arn:aws:resource-groups:us-east-1:123456789012:group/gpus"}, ["capacity_block", "Capacity Block's reservation id"]),
    "not a reservation": ({"capacity_reservation": "cr-123"}, ["capacity_reservation", "cr- and 17"]),
    "SSH to a master with several network cards": ({"instance_type": "p4d.24xlarge", "efa": True, "ssh_cidr": "203.0.113.7/32", "key_pair_name": "k"}, ["ssh_cidr", "4 network interfaces", "private subnet", "SSM Session Manager"]),
    "SSH to a p4d master with EFA on by default": ({"instance_type": "p4d.24xlarge", "ssh_cidr": "203.0.113.7/32", "key_pair_name": "k"}, ["ssh_cidr", "the default for p4d.24xlarge", "4 network interfaces", "SSM Session Manager", "efa=false"]),
    "idle minutes negative": ({"idle_scaledown_minutes": -5}, ["idle_scaledown_minutes", "0 to 1440"]),
    "budget not a number": ({"monthly_budget_usd": "lots"}, ["monthly_budget_usd", "whole number"]),
    "retention CloudWatch does not offer": ({"log_retention_days": 10}, ["log_retention_days", "7, 14, 30"]),
    "boot failure limit zero": ({"boot_failure_limit": 0}, ["boot_failure_limit", "1 to 100"]),
    "Lustre size not a Lustre size": ({"fsx_lustre_storage_gib": 1000}, ["fsx_lustre_storage_gib", "1000", "1200, or a multiple of 2400"]),
    "Lustre size not a number": ({"fsx_lustre_storage_gib": "big"}, ["fsx_lustre_storage_gib", "'big'", "0 (no FSx for Lustre"]),
    "Lustre size above the quota": ({"fsx_lustre_storage_gib": 103200}, ["fsx_lustre_storage_gib", "up to 100800"]),
    "Lustre size negative": ({"fsx_lustre_storage_gib": -2400}, ["fsx_lustre_storage_gib", "-2400"]),
    "bad key pair name": ({"key_pair_name": "tab\there"}, ["key_pair_name", "printable ASCII"]),
}


@pytest.mark.parametrize("overrides, words", BAD_CONTEXT.values(), ids=BAD_CONTEXT.keys())
def test_bad_context_is_rejected_with_a_message_naming_key_and_allowed_values(overrides, words):
    with pytest.raises(ConfigError) as raised:
        config_with(**overrides)
    message = str(raised.value)
    for word in words:
        assert word in message, f"{word!r} missing from: {message}"
    assert "\n" not in message


def test_absent_settings_take_their_defaults_and_the_defaults_are_valid_and_secure():
    config = AppConfig.from_context({})
    assert config.instance_type in INSTANCE_TYPES
    assert config.ssh_cidr is None and config.key_pair_name is None  # secure default: SSM only
    assert config.efs_throughput_mode == "elastic"
    assert config.idle_scaledown_minutes > 0 and config.notebook_idle_minutes > 0  # cost control on
    assert config.boot_failure_limit == 10    # ParallelCluster's protected mode stops at 10


# Network cards that carry EFA, from AWS's "Maximize network bandwidth on Amazon EC2 instances with
# multiple network cards" page: p4d.24xlarge 4, p5.48xlarge 32; g5.48xlarge one (EFA on card 0).
@pytest.mark.parametrize("overrides, efa, interfaces, public_master", [
    ({"instance_type": "p4d.24xlarge"}, True, 4, False),
    ({"instance_type": "p5.48xlarge"}, True, 32, False),
    ({"instance_type": "p4d.24xlarge", "efa": "auto"}, True, 4, False),
    ({"instance_type": "p4d.24xlarge", "efa": None}, True, 4, False),
    ({"instance_type": "p4d.24xlarge", "efa": "false"}, False, 0, True),
    ({"instance_type": "g5.48xlarge"}, True, 1, True),
    ({"instance_type": "g5.4xlarge"}, False, 0, True),       # no EFA on this size
    ({"instance_type": "c5.xlarge"}, False, 0, True),
])
def test_efa_is_on_wherever_the_instance_type_has_it_unless_turned_off(overrides, efa, interfaces,
                                                                       public_master):
    config = config_with(**overrides)
    assert (config.efa, config.efa_interfaces, config.master_is_public) == (efa, interfaces, public_master)


def test_efa_off_on_p4d_allows_ssh_to_a_public_master():
    config = config_with(instance_type="p4d.24xlarge", efa="false", ssh_cidr="203.0.113.7/32",
                         key_pair_name="k")
    assert (config.efa_interfaces, config.master_is_public) == (0, True)


def test_deployment_settings_are_not_in_cdk_json():
    """cdk.json keeps CDK's own flags: a default there would be indistinguishable from a `-c`
    flag, so an override could not be told from the settings file's value."""
    assert not set(cdk_json_context()) & set(SETTINGS)


def test_every_setting_is_documented_with_its_default():
    table = (REPO_ROOT / "docs" / "infra.md").read_text()
    for key, setting in SETTINGS.items():
        assert len(setting.help) > 20, key
        default = "null" if setting.default is None else json.dumps(setting.default).strip('"')
        assert f"| `{key}` | `{default}`" in table, f"docs/infra.md's settings table: {key}"


def test_lustre_sizes_are_the_ones_fsx_accepts():
    assert config_with().fsx_lustre_storage_gib == 0 and not config_with().lustre_enabled
    for raw, value in ((1200, 1200), ("2400", 2400), ("4800", 4800), (100800, 100800), ("0", 0),
                       (None, 0)):
        assert config_with(fsx_lustre_storage_gib=raw).fsx_lustre_storage_gib == value


def test_values_passed_as_strings_with_dash_c_are_parsed():
    config = config_with(worker_count="3", efa="true", instance_type="g5.48xlarge",
                         ebs_volume_size_gib="300", ssh_cidr="198.51.100.0/24",
                         key_pair_name="k", existing_file_system_id="fs-01234567")
    assert (config.worker_count, config.efa, config.ebs_volume_size_gib) == (3, True, 300)
    assert config.ssh_cidr == "198.51.100.0/24"
    assert config.existing_file_system_id == "fs-01234567"   # an old 8-hex id is still valid
    assert config_with(ssh_cidr="").ssh_cidr is None          # `-c ssh_cidr=` unsets it


def test_cluster_zone_picks_the_subnets_of_that_zone():
    config = config_with(availability_zones="us-east-1a, us-east-1d",
                         cluster_availability_zone="us-east-1d")
    assert config.availability_zones == ("us-east-1a", "us-east-1d")
    assert config.cluster_zone_index == 1
    assert config_with().cluster_zone_index == 0


def test_config_is_frozen():
    config = config_with()
    with pytest.raises(Exception):
        config.worker_count = 5


def test_build_rejects_bad_context_before_creating_any_stack():
    import aws_cdk as cdk

    app = cdk.App(context={**cdk_json_context(), "worker_count": -2,
                           "settings_file": "none"})
    with pytest.raises(ConfigError):
        load_app_module().build(app)
    assert [c for c in app.node.children if isinstance(c, cdk.Stack)] == []


def test_app_py_prints_one_line_and_exits_non_zero_without_a_traceback():
    env = {**os.environ, "CDK_CONTEXT_JSON": json.dumps({
        **cdk_json_context(), "ssh_cidr": "nope", "key_pair_name": "k",
        "settings_file": "none"})}
    result = subprocess.run([sys.executable, "app.py"], cwd=REPO_ROOT, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: context key 'ssh_cidr' is 'nope', not an IPv4 CIDR")
    assert lines[0].endswith("expected e.g. 203.0.113.7/32, or leave it unset to use SSM "
                             "Session Manager")
