"""Helpers for the CDK app's tests: cdk.json's context, the real app.py, and synthesis into a
directory with the templates read back (fixtures in conftest.py synthesize once per session)."""
from __future__ import annotations

import importlib.util
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import boto3

REPO_ROOT = Path(__file__).resolve().parents[2]

# A configuration that exercises every optional path but SSH: EFA on each of a p4d's four network
# cards (so the master runs in the private subnet), an existing file system, bursting throughput,
# several workers, a pinned AMI, an alerts email, a name prefix (a second deployment in the same
# account and region) and an FSx for Lustre file system.
VARIANT_CONTEXT = {
    "instance_type": "p4d.24xlarge",
    "efa": "true",              # as `-c efa=true` passes it: a string
    "worker_count": "3",
    "ebs_volume_size_gib": 500,
    "existing_file_system_id": "fs-0123456789abcdef0",
    "efs_throughput_mode": "bursting",
    "ami_id": "ami-0123456789abcdef0",
    "notification_email": "ml-team@example.com",
    "name_prefix": "team-a",
    "availability_zones": "us-east-1a,us-east-1b",
    "cluster_availability_zone": "us-east-1b",   # the VPC's second zone
    "fsx_lustre_storage_gib": "2400",
}

# SSH to a public master from a CIDR with a key pair (a type with at most one EFA card).
SSH_CONTEXT = {
    "ssh_cidr": "203.0.113.0/24",
    "key_pair_name": "research-key",
}


# A deploy with credentials: the account and region the CDK CLI passes the app, and the values of
# its lookups as the CLI passes them back from cdk.context.json (keys as CDK writes them there:
# `<provider>:<prop>=<value>:...`, props sorted by name). The AMI is the default
# dlami_ssm_parameter's value, an id of the right shape.
DEPLOY_ACCOUNT, DEPLOY_REGION = "123456789012", "eu-west-1"


def deploy_environment():
    import aws_cdk as cdk
    return cdk.Environment(account=DEPLOY_ACCOUNT, region=DEPLOY_REGION)


def ami_lookup_key(parameter: str) -> str:
    return f"ssm:account={DEPLOY_ACCOUNT}:parameterName={parameter}:region={DEPLOY_REGION}"


ZONES_LOOKUP_KEY = f"availability-zones:account={DEPLOY_ACCOUNT}:region={DEPLOY_REGION}"


def recorded_lookups() -> dict[str, Any]:
    """cdk.context.json after the first deploy with the default settings."""
    from infra.config import SETTINGS
    return {ami_lookup_key(SETTINGS["dlami_ssm_parameter"].default): "ami-0fedcba9876543210",
            ZONES_LOOKUP_KEY: ["eu-west-1a", "eu-west-1b", "eu-west-1c"]}


def cdk_json_context() -> dict[str, Any]:
    """cdk.json's context, as the CDK CLI passes it (aws_cdk.App() does not read cdk.json)."""
    return json.loads((REPO_ROOT / "cdk.json").read_text())["context"]


def load_app_module() -> ModuleType:
    """The real app.py at the repository root (not a package, so loaded by path)."""
    name = "maskrcnn_cdk_app"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "app.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look the module up while the class is built
    spec.loader.exec_module(module)
    return module


@dataclass
class Synthesized:
    context: dict[str, Any]         # every setting's value in effect (typed, as AppConfig holds it)
    outdir: Path
    templates: dict[str, dict]      # stack id (as `cdk deploy` takes it) -> template
    stack_names: dict[str, str]     # stack id -> CloudFormation stack name (with name_prefix)
    stacks: Any                     # app.Stacks
    missing_context: dict[str, str]  # context keys the CLI would look up (key -> provider)

    def template(self, stack_name: str):
        from aws_cdk.assertions import Template
        return Template.from_json(self.templates[stack_name])

    def resources(self, stack_name: str, resource_type: str) -> dict[str, dict]:
        return {logical_id: resource
                for logical_id, resource in self.templates[stack_name]["Resources"].items()
                if resource["Type"] == resource_type}


def synthesize(tmp_dir: Path, overrides: dict[str, Any] | None = None, *,
               settings_file: Path | None = None, env: Any = None) -> Synthesized:
    """Synthesizes the real app as `cdk synth -c key=value ...` would with `overrides` as the
    -c flags, reading `settings_file` in place of the repository's settings.json, and never the
    developer's own. Like the default settings.json, `settings_file` may not exist yet: then the
    defaults (a file named with -c settings_file must exist, so "none" is passed). ``env``: the
    stacks' account and region (a `cdk.Environment`), as app.py sets them when the CLI has
    credentials; None, as offline."""
    import aws_cdk as cdk

    context = _app_context(overrides, settings_file)
    app = cdk.App(context=context, outdir=str(tmp_dir))
    stacks = load_app_module().build(app, env=env)
    return _synthesized(app.synth(), context, tmp_dir, stacks)   # synth raises on an unacknowledged finding


def read_synthesized(outdir: Path, overrides: dict[str, Any] | None = None) -> Synthesized:
    """What :func:`synthesize` returned for ``overrides`` into ``outdir``, read back from the cloud
    assembly it wrote there (no app objects: ``stacks`` is None)."""
    from aws_cdk import cx_api
    return _synthesized(cx_api.CloudAssembly(str(outdir)), _app_context(overrides, None), outdir, None)


def _app_context(overrides, settings_file) -> dict[str, Any]:
    from infra import settings

    named = settings_file if settings_file and settings_file.exists() else None
    # The image build mode is fixed (the Docker asset), never `auto`: the templates must not
    # depend on whether the machine running the tests has Docker. A test of another mode or of
    # `auto` says so in its overrides or settings file.
    fixed = {} if "image_build" in settings.read_file(named) else {"image_build": "local"}
    return {**cdk_json_context(), "settings_file": str(named) if named else settings.NO_FILE,
            **fixed, **(overrides or {})}


def _synthesized(assembly, context, outdir: Path, stacks) -> Synthesized:
    from infra import settings

    templates = {stack.id: stack.template for stack in assembly.stacks}
    stack_names = {stack.id: stack.stack_name for stack in assembly.stacks}
    # The settings in effect: defaults, the settings file, then the overrides.
    config = settings.resolve(context).config
    return Synthesized(context={key: getattr(config, key) for key in settings.SETTINGS}, outdir=outdir,
                       templates=templates, stack_names=stack_names, stacks=stacks,
                       missing_context={m["key"]: m["provider"] for m in json.loads(
                           (Path(assembly.directory) / "manifest.json").read_text()).get("missing", [])})


def cfn_lint_problems(template: dict, regions: tuple[str, ...] = ("us-east-1", "eu-west-1")) -> list[str]:
    """cfn-lint's errors and warnings (E and W rules) for ``template`` deployed in ``regions``."""
    from cfnlint.api import ManualArgs, lint

    matches = lint(json.dumps(template), config=ManualArgs(regions=list(regions)))
    return [f"{m.rule.id}: {m.message}" for m in matches if m.rule.id[0] in "EW"]


def failing_reports(outdir: Path) -> list[dict]:
    """The synth's validation plugins (cdk-nag, cdk-preflight) that did not conclude `success`."""
    report = json.loads((outdir / "validation-report.json").read_text())
    return [r for r in report["pluginReports"] if r.get("conclusion") != "success"]


# --- CloudFormation in moto ------------------------------------------------------------------

BOOTSTRAP_VERSION_PARAMETER = "/cdk-bootstrap/hnb659fds/version"
# moto reserves /aws/service/ (AWS's public parameters) and does not hold the Deep Learning AMI's,
# and it resolves a parameter's Default even when a value is passed: so the AMI parameter's
# Default is pointed at a stand-in that holds an image moto knows. Nothing else is changed.
AMI_PARAMETER_STAND_IN = "/maskrcnn-tests/deep-learning-ami-id"
AMI_PARAMETER_TYPE = "AWS::SSM::Parameter::Value<AWS::EC2::Image::Id>"


# moto's CloudFormation has no AWS::FSx::FileSystem: it skips the resource (with a warning) and
# resolves references to it as empty strings, which the SSM parameters holding them refuse. The
# file system is replaced by these values of the shape FSx gives; its properties are checked by
# the template assertions in test_infra_stacks.py instead.
LUSTRE_STAND_IN = {"Ref": "fs-0fedcba9876543210", "LustreMountName": "abcdefgh",
                   "DNSName": "fs-0fedcba9876543210.fsx.us-east-1.amazonaws.com"}


ALARM_TYPES = ("AWS::CloudWatch::Alarm", "AWS::CloudWatch::CompositeAlarm")


def without_alarm_arns(template: dict) -> dict:
    """`template` without composite alarms and with each alarm's Arn written out: moto's
    CloudFormation does not model CloudWatch alarms, so it has no Arn for a composite alarm or a
    dashboard's alarm widget to name (tests/infra/test_infra_monitoring.py checks the alarms in
    the template)."""
    resources = template.get("Resources", {})
    alarms = {lid for lid, r in resources.items() if r["Type"] in ALARM_TYPES}

    def replace(node):
        if isinstance(node, dict):
            get_att = node.get("Fn::GetAtt")
            if isinstance(get_att, list) and get_att[0] in alarms:
                return f"arn:aws:cloudwatch:us-east-1:123456789012:alarm:{get_att[0]}"
            return {key: replace(value) for key, value in node.items()}
        if isinstance(node, list):
            return [replace(value) for value in node]
        return node

    return replace({**template, "Resources": {
        lid: r for lid, r in resources.items() if r["Type"] != "AWS::CloudWatch::CompositeAlarm"}})


def without_lustre(template: dict) -> dict:
    """`template` with each AWS::FSx::FileSystem removed and references to it replaced by
    LUSTRE_STAND_IN's values."""
    resources = template.get("Resources", {})
    lustre = {lid for lid, r in resources.items() if r["Type"] == "AWS::FSx::FileSystem"}
    if not lustre:
        return template

    def replace(node):
        if isinstance(node, dict):
            if node.get("Ref") in lustre:
                return LUSTRE_STAND_IN["Ref"]
            get_att = node.get("Fn::GetAtt")
            if isinstance(get_att, list) and get_att[0] in lustre:
                return LUSTRE_STAND_IN[get_att[1]]
            return {key: replace(value) for key, value in node.items()}
        if isinstance(node, list):
            return [replace(value) for value in node]
        return node

    template = {**template, "Resources": {lid: r for lid, r in resources.items()
                                          if lid not in lustre}}
    return replace(template)


def deploy_to_moto(cloudformation, name: str, template: dict) -> dict:
    template = without_lustre(json.loads(json.dumps(template)))
    template = without_alarm_arns(template)
    for spec in template.get("Parameters", {}).values():
        if spec["Type"] == AMI_PARAMETER_TYPE:
            assert spec["Default"].startswith("/aws/service/deeplearning/")
            spec["Default"] = AMI_PARAMETER_STAND_IN
    cloudformation.create_stack(StackName=name, TemplateBody=json.dumps(template),
                                Capabilities=["CAPABILITY_IAM", "CAPABILITY_NAMED_IAM"])
    (stack,) = cloudformation.describe_stacks(StackName=name)["Stacks"]
    return stack


def prepare_moto_account() -> str:
    """What a bootstrapped account has: the CDK bootstrap version, and an AMI parameter.
    Returns the id of the AMI the parameter holds (an image moto knows)."""
    ssm = boto3.client("ssm")
    ssm.put_parameter(Name=BOOTSTRAP_VERSION_PARAMETER, Value="30", Type="String")
    image_id = boto3.client("ec2").describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    ssm.put_parameter(Name=AMI_PARAMETER_STAND_IN, Value=image_id, Type="String")
    return image_id
