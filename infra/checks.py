"""The checks every synth of the app runs, wherever the app is built (app.py, the tests, the
benchmark): each fails synth on a finding that is not acknowledged on its construct.

- cdk-nag's AWS Solutions pack: security and best practice (acknowledgments: acknowledge.py);
- cdk-preflight, enforced: CloudFormation constraints that the resource schemas miss, each
  reproduced on real AWS (findings `pf-...`), i.e. templates that would fail `cdk deploy`;
- CDK's own CloudFormation validation runs anyway; cdk.json's
  `@aws-cdk/core:validateAgainstDefaultRules` makes its default rules' findings errors.
"""
from __future__ import annotations

import aws_cdk as cdk
from cdk_nag import AwsSolutionsChecks
from cdk_preflight import Preflight

# The context key that turns CDK's default validation rules from warnings into errors.
DEFAULT_RULES_AS_ERRORS = "@aws-cdk/core:validateAgainstDefaultRules"


def add_checks(app: cdk.App) -> None:
    """Registers cdk-nag and cdk-preflight (enforce mode) on `app`, before it synthesizes."""
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    Preflight.apply(app, enforce=True)
