"""The estimated cost of a finished training run, from the prices recorded in
infra/instance_types.py (EC2 types in INSTANCE_TYPES, SageMaker ml.* types in SAGEMAKER_PRICES), or,
for a type the table has no price for, from AWS's Price List (launch/price_list.py) where the caller
has AWS credentials.

One computation (:func:`estimate`) behind both cost lines: a cluster run's (launch/cluster/jobs.py:
its job's nodes x the time each attempt held them) and a finished SageMaker job's (launch/sagemaker/launcher.py: its
billable seconds x its instance count). Always an estimate: on-demand list prices of us-east-1,
without storage, data transfer, or spot and savings-plan discounts.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from infra.instance_types import INSTANCE_TYPES, SAGEMAKER_PRICES

PRICE_BASIS = "on-demand list price in us-east-1; other regions differ by up to ~30%"
# AWS's own price pages: where a type missing from the table is priced (no figure is guessed here).
PRICING_PAGES = {"sagemaker": "https://aws.amazon.com/sagemaker/pricing/",
                 "ec2": "https://aws.amazon.com/ec2/pricing/on-demand/"}


def pricing_page(instance_type: str) -> str:
    return PRICING_PAGES["sagemaker" if instance_type.startswith("ml.") else "ec2"]


def no_price(instance_type: str) -> str:
    """Why there is no figure, and where AWS publishes one."""
    return (f"no price recorded for {instance_type} in infra/instance_types.py; its on-demand price: "
            f"{pricing_page(instance_type)} (add it to the table, with the date it was read, for an "
            f"estimate)")


def price_per_hour(instance_type: str) -> float | None:
    """USD per hour of one instance, or None when infra/instance_types.py records no price."""
    if instance_type.startswith("ml."):
        return SAGEMAKER_PRICES.get(instance_type)
    info = INSTANCE_TYPES.get(instance_type)
    return info.price_per_hour if info is not None else None


@dataclass(frozen=True)
class CostEstimate:
    instance_type: str
    instances: int
    seconds: float
    price_per_hour: float | None
    basis: str = PRICE_BASIS
    # Without a price: why AWS's Price List gave none, when it was asked.
    unpriced: str | None = None

    @property
    def hours(self) -> float:
        return self.seconds / 3600

    @property
    def usd(self) -> float | None:
        if self.price_per_hour is None:
            return None
        return self.instances * self.hours * self.price_per_hour

    def line(self) -> str:
        what = f"{self.instances} x {self.instance_type} x {self.hours:.2f} h"
        if self.usd is None:
            return f"estimated cost: {self.why_no_price()} ({what})"
        return (f"estimated cost: ${self.usd:.2f} = {what} x ${self.price_per_hour:g}/h "
                f"({self.basis})")

    def why_no_price(self) -> str:
        reason = no_price(self.instance_type)
        return reason if self.unpriced is None else f"{reason}; {self.unpriced}"


def estimate(instance_type: str, instances: int, seconds: float, *, price_list: bool = False,
             session=None, region: str | None = None) -> CostEstimate:
    """``instances`` of ``instance_type`` for ``seconds`` each, at the recorded price. A type without
    one is priced from AWS's Price List when asked to (``price_list``, with the default credentials,
    or with a boto3 ``session``), in ``region`` (default: the session's, else us-east-1)."""
    seconds = max(float(seconds), 0.0)
    recorded = price_per_hour(instance_type)
    if recorded is not None or not (price_list or session):
        return CostEstimate(instance_type, instances, seconds, recorded)
    from launch.price_list import PriceUnavailable, on_demand_price
    if session is None:
        import boto3
        session = boto3.session.Session(region_name=region)
    try:
        listed = on_demand_price(instance_type, region or session.region_name or "us-east-1", session)
    except PriceUnavailable as err:
        return CostEstimate(instance_type, instances, seconds, None, unpriced=str(err))
    return CostEstimate(instance_type, instances, seconds, listed.usd_per_hour, basis=listed.basis())


def main(argv: list[str] | None = None) -> int:
    """`maskrcnn cost`: what the deployment's cluster costs an hour (settings.json), or a SageMaker
    job of --instance-type and --instances, for --hours. A type without a price in
    infra/instance_types.py is priced from AWS's Price List, with AWS credentials."""
    p = argparse.ArgumentParser(prog="maskrcnn cost", description=main.__doc__.splitlines()[0])
    p.add_argument("--hours", type=float, default=1.0, help="how long (default: 1 hour)")
    p.add_argument("--instance-type", help="an ml.* type for a SageMaker job, instead of the cluster's settings")
    p.add_argument("--instances", type=int, default=1, help="with --instance-type: the job's instance count")
    p.add_argument("--settings-file", type=Path, help="the deployment's settings (default: settings.json)")
    p.add_argument("--region", help="where a type without a recorded price is priced from AWS's Price "
                                    "List (default: your AWS region, else us-east-1)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    if a.hours <= 0 or a.instances < 1:
        print("error: --hours must be more than 0 and --instances at least 1", file=sys.stderr)
        return 2
    if a.instance_type:
        instance_type, instances, what = a.instance_type, a.instances, "SageMaker job"
    else:
        from infra.config import ConfigError
        from infra.settings import load_config
        try:
            config = load_config(a.settings_file)
        except ConfigError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        instance_type, instances = config.instance_type, config.worker_count + 1
        what = "cluster (master and workers, while they run)"
    result = estimate(instance_type, instances, a.hours * 3600, price_list=True, region=a.region)
    if result.usd is None:
        print(f"error: {result.why_no_price()}", file=sys.stderr)
        return 2
    if a.json:
        print(json.dumps({"what": what, "instance_type": instance_type, "instances": instances,
                          "hours": a.hours, "usd_per_hour": result.usd / a.hours, "usd": result.usd,
                          "basis": result.basis}))
    else:
        print(f"{what}: {result.line()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
