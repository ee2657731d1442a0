"""cdk-nag acknowledgments, written next to the resource they excuse."""
from __future__ import annotations

from aws_cdk import Acknowledgment, Validations
from constructs import IConstruct


def acknowledge(scope: IConstruct, rule: str, reason: str) -> None:
    """Acknowledges one cdk-nag finding (e.g. "AwsSolutions-IAM5[Resource::*]") on `scope` and
    its children, with the reason a reviewer reads in the validation report."""
    Validations.of(scope).acknowledge(Acknowledgment(id=rule, reason=reason))
