"""cdk-nag acknowledgments, written next to the resource they excuse."""
from __future__ import annotations

from aws_cdk import Acknowledgment, Stack, Token, Validations
from constructs import IConstruct

_PSEUDO_PARAMETERS = ("<AWS::Partition>", "<AWS::Region>", "<AWS::AccountId>")


def acknowledge(scope: IConstruct, rule: str, reason: str) -> None:
    """Acknowledges one cdk-nag finding (e.g. "AwsSolutions-IAM5[Resource::*]") on `scope` and
    its children, with the reason a reviewer reads in the validation report. A finding names a
    resource as the template writes it: `<AWS::Region>` and the like in an environment-agnostic
    stack; in a stack bound to an account and region (a synth with credentials, app.py) CDK
    writes some ARNs with the literal values, so the finding is acknowledged in both spellings."""
    for spelling in dict.fromkeys([rule, _with_stack_environment(scope, rule)]):
        Validations.of(scope).acknowledge(Acknowledgment(id=spelling, reason=reason))


def _with_stack_environment(scope: IConstruct, rule: str) -> str:
    stack = Stack.of(scope)
    for placeholder, value in zip(_PSEUDO_PARAMETERS, (stack.partition, stack.region, stack.account)):
        if not Token.is_unresolved(value):
            rule = rule.replace(placeholder, value)
    return rule
