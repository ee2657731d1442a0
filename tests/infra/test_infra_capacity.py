"""Network interfaces, the master's address, capacity reservations and the FSx for Lustre version, on
synthesized templates of the configurations that decide them.

Expected values are AWS's documented facts, written out here rather than read from
infra/instance_types.py: p4d.24xlarge has 4 network cards with EFA and p5.48xlarge 32 (AWS
"Maximize network bandwidth on Amazon EC2 instances with multiple network cards": one EFA interface
per card; the primary on card 0 at device index 0, EFA-only interfaces at device index 0 and ENA ones
at 1 on the other cards; P5: EFA-only on cards 1-31); AWS assigns no public IPv4 address to an instance launched
with more than one network interface; EC2 launches into a reservation named by
CapacityReservationTarget (an id, or a resource group's ARN), and into a Capacity Block only with
market type capacity-block; FSx for Lustre's default version is 2.10, and 2.15 is the one AWS
recommends for new file systems.
"""
from __future__ import annotations

import json
import re
import subprocess

import pytest

from infra import outputs
from infra.constructs.cluster import network_interfaces
from infra.userdata import CLUSTER_NODE_SCRIPT

from cdk_synth import cfn_lint_problems, synthesize

CLUSTER = outputs.EFS_CLUSTER_STACK
SHARED = outputs.NETWORK_STORAGE_STACK

CAPACITY_BLOCK_ID = "cr-0fedcba9876543210"
RESERVATION_GROUP_ARN = "arn:aws:resource-groups:us-east-1:123456789012:group/ml-reservations"

# p5.48xlarge, launched into a Capacity Block, with EFA as it is by default (efa not given).
P5_CAPACITY_BLOCK = {"instance_type": "p5.48xlarge", "worker_count": "2",
                     "capacity_reservation": CAPACITY_BLOCK_ID, "capacity_block": "true"}
# p4d.24xlarge with every other setting at its default: EFA on its four cards.
P4D_DEFAULTS = {"instance_type": "p4d.24xlarge"}
# p4d.24xlarge with EFA turned off: NCCL over TCP sockets on one ordinary interface.
P4D_WITHOUT_EFA = {"instance_type": "p4d.24xlarge", "efa": "false"}
# g5.48xlarge (one network card) with EFA, launched into any reservation of a resource group.
G5_RESERVATION_GROUP = {"instance_type": "g5.48xlarge", "efa": "true",
                        "capacity_reservation": RESERVATION_GROUP_ARN}


@pytest.fixture(scope="module")
def p5_block_synth(synth_of):
    return synth_of(P5_CAPACITY_BLOCK)   # also test_infra_checks.py's


@pytest.fixture(scope="module")
def p4d_default_synth(tmp_path_factory):
    return synthesize(tmp_path_factory.mktemp("cdk-p4d-default"), P4D_DEFAULTS)


@pytest.fixture(scope="module")
def p4d_no_efa_synth(tmp_path_factory):
    return synthesize(tmp_path_factory.mktemp("cdk-p4d-no-efa"), P4D_WITHOUT_EFA)


@pytest.fixture(scope="module")
def g5_group_synth(synth_of):
    return synth_of(G5_RESERVATION_GROUP)   # also test_infra_checks.py's


def launch_templates(synth) -> dict[str, dict]:
    """'master' and 'worker' -> LaunchTemplateData."""
    found = {}
    for logical_id, lt in synth.resources(CLUSTER, "AWS::EC2::LaunchTemplate").items():
        role = ("master" if logical_id.startswith("ClusterMaster") else
                "worker" if logical_id.startswith("ClusterWorker") else None)
        if role:
            found[role] = lt["Properties"]["LaunchTemplateData"]
    assert set(found) == {"master", "worker"}
    return found


def groups_by_role(synth) -> dict[str, dict]:
    groups = synth.resources(CLUSTER, "AWS::AutoScaling::AutoScalingGroup").values()
    by_name = {g["Properties"]["AutoScalingGroupName"]: g["Properties"] for g in groups}
    name = synth.stack_names[CLUSTER]
    return {"master": by_name[f"{name}-master"], "worker": by_name[f"{name}-worker"]}


def node_security_group(synth) -> dict:
    (group_id,) = [lid for lid in synth.resources(CLUSTER, "AWS::EC2::SecurityGroup")
                   if lid.startswith("ClusterNodeSecurityGroup")]
    return {"Fn::GetAtt": [group_id, "GroupId"]}


def master_env(synth) -> dict[str, str]:
    """The master's cluster.env as its user data writes it (CloudFormation values as JSON)."""
    parts = launch_templates(synth)["master"]["UserData"]["Fn::Base64"]["Fn::Join"][1]
    text = "".join(p if isinstance(p, str) else json.dumps(p) for p in parts)
    block = text.split("cat > /etc/maskrcnn/cluster.env <<'EOF'\n", 1)[1].split("\nEOF\n", 1)[0]
    return dict(line.split("=", 1) for line in block.splitlines())


def address_statements(synth) -> list[dict]:
    return [s for policy in synth.resources(CLUSTER, "AWS::IAM::Policy").values()
            for s in policy["Properties"]["PolicyDocument"]["Statement"]
            if "ec2:AssociateAddress" in json.dumps(s["Action"])]


# --- EFA on every network card ------------------------------------------------------------------

# (network card, device index, interface type) of each node's interfaces. AWS's "Maximize network
# bandwidth on Amazon EC2 instances with multiple network cards": the primary interface is card 0,
# device index 0; on each additional card "device index 0, for EFA-only network interface, and/or
# device index 1 for ENA network interface". Its P5 section: EFA with ENA on card 0, EFA-only on the
# other 31 cards. p4d keeps EFA with ENA on each of its 4 cards (docs/infra.md).
P4D_INTERFACES = [(0, 0, "efa")] + [(card, 1, "efa") for card in range(1, 4)]
P5_INTERFACES = [(0, 0, "efa")] + [(card, 0, "efa-only") for card in range(1, 32)]


@pytest.mark.parametrize("synth_fixture, instance_type, expected", [
    ("variant_synth", "p4d.24xlarge", P4D_INTERFACES),        # efa=true
    ("p4d_default_synth", "p4d.24xlarge", P4D_INTERFACES),    # efa not given: on by default
    ("p5_block_synth", "p5.48xlarge", P5_INTERFACES),         # efa not given: on by default
])
def test_one_efa_interface_on_each_network_card(request, synth_fixture, instance_type, expected):
    synth = request.getfixturevalue(synth_fixture)
    node_group = node_security_group(synth)
    for role, data in launch_templates(synth).items():
        assert data["InstanceType"] == instance_type
        interfaces = data["NetworkInterfaces"]
        assert [(i["NetworkCardIndex"], i["DeviceIndex"], i["InterfaceType"]) for i in interfaces] == (
            expected), role
        # The interfaces with an IP address (an ENA device): on p5 card 0's alone, the one that MPI's
        # TCP transport and NCCL's socket bootstrap find once lo and docker0 are excluded
        # (launch_command.py); no multi-homed host.
        assert [i["NetworkCardIndex"] for i in interfaces if i["InterfaceType"] != "efa-only"] == (
            [0] if instance_type.startswith("p5") else list(range(4)))
        for interface in interfaces:
            # CloudFormation's LaunchTemplate schema: "If you specify efa-only, do not assign any
            # IP addresses to the network interface."
            assert not {"PrivateIpAddress", "PrivateIpAddresses", "SecondaryPrivateIpAddressCount",
                        "Ipv6AddressCount", "Ipv6Addresses"} & set(interface)
            assert interface["DeleteOnTermination"] is True
            assert interface["Groups"] == [node_group]
            # Several interfaces: no public address on any of them, master included.
            assert "AssociatePublicIpAddress" not in interface
        # With NetworkInterfaces the groups are on the interfaces only.
        assert "SecurityGroupIds" not in data


def test_single_card_efa_keeps_a_public_master_with_an_elastic_ip(g5_group_synth):
    synth = g5_group_synth
    templates = launch_templates(synth)
    for role, public in (("master", True), ("worker", False)):
        (interface,) = templates[role]["NetworkInterfaces"]
        assert interface["InterfaceType"] == "efa"
        assert (interface["NetworkCardIndex"], interface["DeviceIndex"]) == (0, 0)
        assert interface["AssociatePublicIpAddress"] is public
        assert interface["Groups"] == [node_security_group(synth)]
    groups = groups_by_role(synth)
    assert "PublicSubnet1" in groups["master"]["VPCZoneIdentifier"][0]["Fn::ImportValue"]
    assert "PrivateSubnet1" in groups["worker"]["VPCZoneIdentifier"][0]["Fn::ImportValue"]
    (address_id,) = synth.resources(CLUSTER, "AWS::EC2::EIP")
    assert synth.templates[CLUSTER]["Outputs"][outputs.MASTER_ADDRESS]["Value"] == {
        "Ref": address_id}
    assert master_env(synth)["EIP_ALLOCATION_ID"] == json.dumps(
        {"Fn::GetAtt": [address_id, "AllocationId"]})
    assert address_statements(synth)


def test_without_efa_each_node_has_one_ordinary_interface(p4d_no_efa_synth):
    synth = p4d_no_efa_synth
    templates = launch_templates(synth)
    for role, public in (("master", True), ("worker", False)):
        (interface,) = templates[role]["NetworkInterfaces"]
        assert "InterfaceType" not in interface
        assert interface["DeviceIndex"] == 0
        assert interface["AssociatePublicIpAddress"] is public
        assert interface["Groups"] == [node_security_group(synth)]
        assert "SecurityGroupIds" not in templates[role]


def test_a_public_address_is_refused_with_several_interfaces():
    with pytest.raises(ValueError, match="no public IPv4"):
        network_interfaces(["sg-1"], efa_interfaces=4, public=True)


# --- the master of a multi-card cluster: private, no Elastic IP --------------------------------

def test_multi_card_master_is_private_without_an_elastic_ip(variant_synth):
    synth = variant_synth
    groups = groups_by_role(synth)
    # The cluster's zone is the VPC's second one in the variant: both groups in its private subnet.
    for role in ("master", "worker"):
        assert "PrivateSubnet2" in groups[role]["VPCZoneIdentifier"][0]["Fn::ImportValue"], role
    assert synth.resources(CLUSTER, "AWS::EC2::EIP") == {}
    assert address_statements(synth) == []
    env = master_env(synth)
    assert env["ROLE"] == "master" and "EIP_ALLOCATION_ID" not in env
    stack_outputs = synth.templates[CLUSTER]["Outputs"]
    assert outputs.MASTER_ADDRESS not in stack_outputs
    assert "aws ssm start-session" in json.dumps(stack_outputs[outputs.CONNECT_COMMAND])


def _shell_function(name: str) -> str:
    match = re.search(rf"^{name}\(\) \{{\n.*?^\}}\n", CLUSTER_NODE_SCRIPT.read_text(),
                      re.DOTALL | re.MULTILINE)
    assert match, name
    return match.group(0)


@pytest.mark.parametrize("allocation_id", [None, "eipalloc-0123456789abcdef0"])
def test_boot_script_attaches_an_address_only_when_the_master_has_one(tmp_path, allocation_id):
    """The boot script's own function, under its own shell options, with `aws` recorded."""
    calls = tmp_path / "calls"
    script = "\n".join([
        "set -Eeuo pipefail",
        f"aws() {{ echo \"aws $*\" >> {calls}; }}",
        'retry() { shift 2; "$@"; }',
        "INSTANCE_ID=i-0123456789abcdef0",
        *([f"EIP_ALLOCATION_ID={allocation_id}"] if allocation_id else []),
        _shell_function("attach_master_address"),
        "attach_master_address",
    ])
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    made = calls.read_text().splitlines() if calls.exists() else []
    assert made == ([f"aws ec2 associate-address --allocation-id {allocation_id} --instance-id "
                     "i-0123456789abcdef0 --allow-reassociation"] if allocation_id else [])


# --- capacity reservations and Capacity Blocks --------------------------------------------------

@pytest.mark.parametrize("synth_fixture, target, market_options", [
    ("p5_block_synth", {"CapacityReservationId": CAPACITY_BLOCK_ID},
     {"MarketType": "capacity-block"}),
    ("g5_group_synth", {"CapacityReservationResourceGroupArn": RESERVATION_GROUP_ARN}, None),
])
def test_both_groups_launch_into_the_reservation(request, synth_fixture, target, market_options):
    synth = request.getfixturevalue(synth_fixture)
    for role, data in launch_templates(synth).items():
        assert data["CapacityReservationSpecification"] == {"CapacityReservationTarget": target}
        assert data.get("InstanceMarketOptions") == market_options, role
        # The reservation places the nodes; this stack's own placement group would be a second
        # constraint that can refuse launches the reservation has room for.
        assert "Placement" not in data, role
    assert synth.resources(CLUSTER, "AWS::EC2::PlacementGroup") == {}


def test_without_a_reservation_both_groups_share_one_cluster_placement_group(default_synth,
                                                                            variant_synth):
    for synth in (default_synth, variant_synth):
        ((group_id, group),) = synth.resources(CLUSTER, "AWS::EC2::PlacementGroup").items()
        assert group["Properties"] == {"Strategy": "cluster"}
        for role, data in launch_templates(synth).items():
            assert data["Placement"] == {"GroupName": {"Ref": group_id}}, role
            assert "CapacityReservationSpecification" not in data
            assert "InstanceMarketOptions" not in data


@pytest.mark.parametrize("synth_fixture", ["p5_block_synth", "g5_group_synth", "p4d_default_synth",
                                           "p4d_no_efa_synth"])
def test_cfn_lint_accepts_the_reservation_templates(request, synth_fixture):
    synth = request.getfixturevalue(synth_fixture)
    # us-east-1 only: cfn-lint's instance-type data has no p5.48xlarge in eu-west-1 (E3628), a
    # fact about the region, not about the reservation properties checked here.
    assert cfn_lint_problems(synth.templates[CLUSTER], regions=("us-east-1",)) == []


# --- FSx for Lustre -----------------------------------------------------------------------------

def test_lustre_runs_version_2_15(variant_synth):
    (lustre,) = variant_synth.resources(SHARED, "AWS::FSx::FileSystem").values()
    assert lustre["Properties"]["FileSystemTypeVersion"] == "2.15"
