"""Spot workers (worker_spot, spot_max_price) on a synthesized template, and the combinations the
settings refuse.

Expected values are AWS's documented facts, written out here: a launch template requests Spot
with InstanceMarketOptions MarketType spot; with an auto-scaling group AWS asks for one-time
requests (the group requests each replacement itself); a Spot Instance set to stop or hibernate
on interruption cannot launch into a placement group, so the interruption behaviour is terminate;
EC2 refuses a maximum price of USD 0.001 or less. A launch has one market type, and a capacity
reservation holds On-Demand instances (a Capacity Block its own market type, capacity-block): Spot
workers and capacity_reservation do not go together.
"""
from __future__ import annotations

import pytest

from infra import outputs
from infra.config import AppConfig, ConfigError
from infra.constructs.cluster import NodeSpec, spot_overrides

from cdk_synth import cfn_lint_problems

CLUSTER = outputs.EFS_CLUSTER_STACK
SPOT = {"worker_spot": "true", "spot_max_price": "12.5", "worker_count": "2"}


def launch_templates(synth) -> dict[str, dict]:
    """'master' and 'worker' -> LaunchTemplateData."""
    found = {}
    for logical_id, template in synth.resources(CLUSTER, "AWS::EC2::LaunchTemplate").items():
        for role in ("master", "worker"):
            if logical_id.startswith(f"Cluster{role.title()}"):
                found[role] = template["Properties"]["LaunchTemplateData"]
    assert set(found) == {"master", "worker"}
    return found


@pytest.fixture(scope="module")
def spot_synth(synth_of):
    return synth_of(SPOT)   # also test_infra_checks.py's


def test_the_workers_request_spot_and_the_master_stays_on_demand(spot_synth):
    templates = launch_templates(spot_synth)
    assert templates["worker"]["InstanceMarketOptions"] == {
        "MarketType": "spot",
        "SpotOptions": {"SpotInstanceType": "one-time",
                        "InstanceInterruptionBehavior": "terminate", "MaxPrice": "12.5"}}
    assert "InstanceMarketOptions" not in templates["master"]
    # Both still share the cluster placement group (allowed for Spot that terminates).
    ((group_id, _),) = spot_synth.resources(CLUSTER, "AWS::EC2::PlacementGroup").items()
    for role, data in templates.items():
        assert data["Placement"] == {"GroupName": {"Ref": group_id}}, role
        assert "CapacityReservationSpecification" not in data, role


def test_without_a_maximum_price_spot_pays_the_current_price():
    assert spot_overrides(NodeSpec("g5.48xlarge", 200, worker_spot=True)) == {
        "InstanceMarketOptions": {"MarketType": "spot", "SpotOptions": {
            "SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}}}
    assert spot_overrides(NodeSpec("g5.48xlarge", 200)) == {}


def test_on_demand_by_default(default_synth):
    assert default_synth.context["worker_spot"] is False
    assert default_synth.context["spot_max_price"] is None
    for role, data in launch_templates(default_synth).items():
        assert "InstanceMarketOptions" not in data, role


def test_cfn_lint_accepts_the_spot_template(spot_synth):
    assert cfn_lint_problems(spot_synth.templates[CLUSTER], regions=("us-east-1",)) == []


def test_the_construct_refuses_spot_into_a_reservation():
    node = NodeSpec("p4d.24xlarge", 200, capacity_reservation="cr-0fedcba9876543210",
                    capacity_block=True, worker_spot=True)
    with pytest.raises(ValueError, match="cannot launch into a capacity reservation"):
        spot_overrides(node)


# (settings, words the one-line message must contain)
REFUSED = {
    "spot into a Capacity Block": (
        {"worker_spot": "true", "capacity_reservation": "cr-0fedcba9876543210",
         "capacity_block": "true", "instance_type": "p4d.24xlarge"},
        ["worker_spot", "a Capacity Block, cr-0fedcba9876543210", "cannot launch into",
         "worker_spot=false", "unset capacity_reservation"]),
    "spot into an On-Demand Capacity Reservation": (
        {"worker_spot": True, "capacity_reservation": "cr-0123456789abcdef0"},
        ["worker_spot", "an On-Demand Capacity Reservation, cr-0123456789abcdef0"]),
    "spot into a reservation group": (
        {"worker_spot": True, "capacity_reservation":
            "arn:aws:resource-groups:us-east-1:123456789012:group/gpus"},
        ["worker_spot", "a Capacity Reservation resource group"]),
    "a maximum price without spot": (
        {"spot_max_price": "3"}, ["spot_max_price", "worker_spot is false", "worker_spot=true"]),
    "a price EC2 refuses": (
        {"worker_spot": True, "spot_max_price": "0.001"}, ["spot_max_price", "above 0.001"]),
    "a price that is not a number": (
        {"worker_spot": True, "spot_max_price": "$12"}, ["spot_max_price", "'$12'", "12.5"]),
    "spot not a boolean": ({"worker_spot": "sometimes"}, ["worker_spot", "true, false"]),
}


@pytest.mark.parametrize("context, words", REFUSED.values(), ids=REFUSED.keys())
def test_bad_spot_settings_are_refused_with_the_fix(context, words):
    with pytest.raises(ConfigError) as raised:
        AppConfig.from_context(context)
    message = str(raised.value)
    for word in words:
        assert word in message, f"{word!r} missing from: {message}"
    assert "\n" not in message


@pytest.mark.parametrize("raw, kept", [("12.5", "12.5"), (12.5, "12.5"), (3, "3"),
                                       ("0.0011", "0.0011"), ("null", None)])
def test_a_maximum_price_is_kept_as_written(raw, kept):
    config = AppConfig.from_context({"worker_spot": True, "spot_max_price": raw})
    assert config.spot_max_price == kept
