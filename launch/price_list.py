"""An instance type's on-demand price per hour, read from AWS's Price List Query API
(``pricing:GetProducts``), for the types infra/instance_types.py records no price for.

AWS documents the API as the programmatic form of its public prices: GetProducts "returns a list of
all products that match the filter criteria", each "both the product metadata and the price
information" (AWS Price List Service API reference). A product is picked by its usage type, the
billing code AWS's invoices and Cost Explorer show: ``<region prefix>-Train:<ml type>`` for a
SageMaker training instance-hour, ``<region prefix>-BoxUsage:<type>`` for an EC2 On-Demand
instance-hour (Linux, shared tenancy). The answer must be one price; anything else is an error
that names AWS's pricing page, never a guessed figure.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import date, datetime

from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

# The Price List Query API answers in us-east-1 (also eu-central-1 and ap-south-1) for every region.
PRICING_API_REGION = "us-east-1"
# A price is part of a status line (`maskrcnn sagemaker describe`, `maskrcnn cost`): a Price List
# that does not answer costs seconds, not botocore's default five attempts with back-off.
CLIENT_CONFIG = Config(retries={"mode": "standard", "max_attempts": 2}, connect_timeout=5, read_timeout=20)
SAGEMAKER_SERVICE, EC2_SERVICE = "AmazonSageMaker", "AmazonEC2"
# EC2's Linux On-Demand instance, as the Deep Learning AMI runs it: no preinstalled software,
# shared tenancy, capacity in use (not an unused reservation).
EC2_LINUX_ON_DEMAND = {"operatingSystem": "Linux", "tenancy": "Shared", "preInstalledSw": "NA",
                       "capacitystatus": "Used"}


class PriceUnavailable(RuntimeError):
    """Why AWS's Price List gave no single price: the message says what to do."""


@dataclass(frozen=True)
class ListedPrice:
    usd_per_hour: float
    region: str
    effective: date          # the On-Demand term's effectiveDate
    read: date               # when it was asked

    def basis(self) -> str:
        return (f"on-demand price in {self.region} from AWS's Price List, effective "
                f"{self.effective.isoformat()}, read {self.read.isoformat()}")


def usage_type(instance_type: str) -> tuple[str, str]:
    """(Price List service code, usage type without its region prefix) of an instance-hour of
    ``instance_type``."""
    if instance_type.startswith("ml."):
        return SAGEMAKER_SERVICE, f"Train:{instance_type}"
    return EC2_SERVICE, f"BoxUsage:{instance_type}"


def filters(service: str, usage: str, region: str) -> list[dict[str, str]]:
    """GetProducts' Filters for the on-demand instance-hour of ``usage`` (see :func:`usage_type`)."""
    terms = [{"Type": "TERM_MATCH", "Field": "regionCode", "Value": region},
             # CONTAINS: the usage type's region prefix (USE1, USW2, ...) is not asked for.
             {"Type": "CONTAINS", "Field": "usagetype", "Value": usage}]
    if service == EC2_SERVICE:
        terms += [{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in EC2_LINUX_ON_DEMAND.items()]
    return terms


def on_demand_price(instance_type: str, region: str, session, *, today: date | None = None) -> ListedPrice:
    """``instance_type``'s on-demand USD per hour in ``region``, or :class:`PriceUnavailable`."""
    service, usage = usage_type(instance_type)
    asked = f"{instance_type} in {region}"
    try:
        client = session.client("pricing", region_name=PRICING_API_REGION, config=CLIENT_CONFIG)
        products = [p if isinstance(p, dict) else json.loads(p)   # each a JSON document (aws_v1)
                    for page in client.get_paginator("get_products").paginate(
                        ServiceCode=service, Filters=filters(service, usage, region), FormatVersion="aws_v1")
                    for p in page["PriceList"]]
    except NoCredentialsError:
        raise PriceUnavailable("AWS's Price List API needs AWS credentials (`aws configure` or "
                               "`aws sso login`)") from None
    except ClientError as err:
        code = err.response.get("Error", {}).get("Code", "")
        if code in ("AccessDeniedException", "AccessDenied"):
            raise PriceUnavailable("these credentials may not read AWS's Price List: allow "
                                   "pricing:GetProducts") from None
        status = err.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        if status >= 500:
            raise PriceUnavailable(f"AWS's Price List API failed (HTTP {status}); try again later") from None
        message = err.response.get("Error", {}).get("Message", "")
        raise PriceUnavailable(f"AWS's Price List API answered {code}: {message}".rstrip(": ")) from None
    except BotoCoreError as err:
        raise PriceUnavailable(f"AWS's Price List API could not be reached ({err})") from None
    found: dict[float, date] = {}
    for product in products:
        listed_usage = product.get("product", {}).get("attributes", {}).get("usagetype", "")
        same_usage = listed_usage == usage or listed_usage.endswith(f"-{usage}")
        if not same_usage or "spot" in listed_usage.lower():
            continue
        for term in product.get("terms", {}).get("OnDemand", {}).values():
            for dimension in term.get("priceDimensions", {}).values():
                usd = dimension.get("pricePerUnit", {}).get("USD")
                if dimension.get("unit", "").lower() == "hrs" and usd is not None:
                    found[float(usd)] = datetime.fromisoformat(
                        term["effectiveDate"].replace("Z", "+00:00")).date()
    if not found:
        raise PriceUnavailable(f"AWS's Price List has no on-demand hourly price of {asked} "
                               f"({service}, usage type *-{usage}); the type may not be offered there")
    if len(found) > 1:
        listed = ", ".join(f"${usd:g}" for usd in sorted(found))
        raise PriceUnavailable(f"AWS's Price List gives {len(found)} on-demand hourly prices of "
                               f"{asked} ({listed}), not one")
    (usd, effective), = found.items()
    return ListedPrice(usd, region, effective, today or date.today())
