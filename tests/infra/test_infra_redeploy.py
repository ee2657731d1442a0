"""Redeploys change only what the user changed.

Exercises the real app synthesized step by step, as the README's deploy commands run it (its
settings commands for real, against a settings file in a temporary directory), and compares each
stack's template with the one the previous step deployed. What counts as a replacement comes from
outside this project: the CloudFormation resource schemas that cfn-lint ships (a change to a
`createOnlyProperties` property replaces the resource). Stands in for `cdk deploy` with
credentials (stacks bound to the account, the first deploy's lookups passed back from
cdk.context.json): nothing is deployed; moto's CloudFormation does not model updates.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from infra import settings

from cdk_synth import deploy_environment, recorded_lookups, synthesize
from readme_block import readme_commands

SHARED, CLUSTER, SAGEMAKER = "NetworkStorageStack", "EfsClusterStack", "SageMakerStack"
DEPENDENCIES = {CLUSTER: [SHARED], SAGEMAKER: [SHARED], SHARED: []}


# --- what a template change does to a deployed resource --------------------------------------

def create_only_paths(resource_type: str) -> list[list[str]]:
    from cfnlint.schema import PROVIDER_SCHEMA_MANAGER
    schema = PROVIDER_SCHEMA_MANAGER.get_resource_schema("us-east-1", resource_type).schema
    return [path.split("/")[2:] for path in schema.get("createOnlyProperties", [])]


def _at(properties: dict, path: list[str]):
    node = properties
    for part in path:
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


# Sizes that must not go down unless the user lowered them: a smaller group terminates running
# nodes; FSx refuses to shrink and a smaller file system would be a new one.
SIZES = {"AWS::AutoScaling::AutoScalingGroup": ("MinSize", "MaxSize", "DesiredCapacity"),
         "AWS::FSx::FileSystem": ("StorageCapacity",)}


@dataclass(frozen=True)
class Change:
    stack: str
    logical_id: str
    resource_type: str
    kind: str          # "deleted", "replaced" or "shrunk"
    detail: str = ""


def destructive_changes(stack: str, before: dict, after: dict) -> list[Change]:
    changes = []
    after_resources = after.get("Resources", {})
    for logical_id, old in before.get("Resources", {}).items():
        kind = old["Type"]
        new = after_resources.get(logical_id)
        if new is None or new["Type"] != kind:
            changes.append(Change(stack, logical_id, kind, "deleted"))
            continue
        old_props, new_props = old.get("Properties", {}), new.get("Properties", {})
        for path in create_only_paths(kind):
            if _at(old_props, path) != _at(new_props, path):
                changes.append(Change(stack, logical_id, kind, "replaced", "/".join(path)))
        for size in SIZES.get(kind, ()):
            if size in old_props and int(new_props.get(size, 0)) < int(old_props[size]):
                changes.append(Change(stack, logical_id, kind, "shrunk",
                                      f"{size} {old_props[size]} -> {new_props.get(size)}"))
    return changes


# Which settings may delete, replace or shrink which resources: a step in which the user changed one
# of these settings (with the settings command or a -c flag) may change its resources; any other
# destructive change is a defect, including one caused by a setting that fell back to its default.
OWNERS = {
    "worker_count": {"AWS::AutoScaling::AutoScalingGroup"},
    "notification_email": {"AWS::SNS::Subscription"},
    "fsx_lustre_storage_gib": {"AWS::FSx::FileSystem", "AWS::SSM::Parameter",
                               "AWS::EC2::SecurityGroupIngress", "AWS::EC2::SecurityGroupEgress"},
    "existing_file_system_id": {"AWS::EFS::FileSystem", "AWS::SSM::Parameter"},
    "ssh_cidr": {"AWS::EC2::SecurityGroup"},
    "efa": {"AWS::EC2::EIP"},
    "instance_type": {"AWS::EC2::EIP"},
    "cluster_availability_zone": {"AWS::FSx::FileSystem"},
}


# --- the README's deploy commands ----------------------------------------------------------------

def readme_deploy_commands() -> list[list[str]]:
    """The commands of step 1 ("Infrastructure") of the README's deploy block, as argv lists."""
    return [argv for step, argv in readme_commands() if step == "1"]


@dataclass
class Deployment:
    """What has been deployed so far, step by step."""
    settings_file: Path
    tmp: Path
    deployed: dict[str, dict] = field(default_factory=dict)        # stack id -> template
    settings_in_effect: dict[str, dict] = field(default_factory=dict)  # stack id -> settings
    changes: list[tuple[int, Change]] = field(default_factory=list)
    # Settings the user changed since each stack's last deploy: by a settings command or a -c flag.
    touched: dict[str, set[str]] = field(default_factory=dict)
    step: int = 0
    _synths: dict = field(default_factory=dict)

    def run(self, argv: list[str]) -> None:
        self.step += 1
        if argv[:2] == ["maskrcnn", "settings"]:
            assert settings.main(["--file", str(self.settings_file), *argv[2:]]) == 0, argv
            if argv[2] in ("set", "unset"):
                keys = {arg.partition("=")[0] for arg in argv[3:]}
                for stack in DEPENDENCIES:
                    self.touched.setdefault(stack, set()).update(keys)
        elif argv[:2] in (["maskrcnn", "preflight"], ["maskrcnn", "cost"]):
            pass   # read-only: tests/launch/test_preflight.py, tests/infra/test_readme_deploy.py
        elif argv[:3] == ["maskrcnn", "cluster", "resume"]:
            pass   # sets the groups' desired capacity, no template: tests/launch/test_cluster_capacity.py
        elif argv[:3] == ["npx", "cdk", "deploy"]:
            self.deploy(argv[3:])
        else:
            raise AssertionError(f"the replay does not know this README command: {argv}")

    def deploy(self, args: list[str]) -> None:
        stacks, overrides, exclusively = [], {}, False
        items = iter(args)
        for arg in items:
            if arg == "-c":
                key, _, value = next(items).partition("=")
                overrides[key] = value
            elif arg == "--exclusively":
                exclusively = True
            elif arg.startswith("-"):
                raise AssertionError(f"the replay does not know the cdk option {arg}")
            else:
                stacks.append(arg)
        synth = self.synthesize(overrides)
        # `cdk deploy STACK` also deploys the stacks STACK depends on, with this command's
        # settings, unless --exclusively is given.
        targets = [dep for stack in stacks for dep in
                   ([] if exclusively else DEPENDENCIES[stack])] + stacks
        for stack in dict.fromkeys(targets):
            template = synth.templates[stack]
            if stack in self.deployed:
                asked = self.touched.get(stack, set()) | set(overrides)
                changed = {key for key in asked
                           if synth.context[key] != self.settings_in_effect[stack][key]}
                allowed = set().union(*(OWNERS.get(key, set()) for key in changed))
                for change in destructive_changes(stack, self.deployed[stack], template):
                    if change.resource_type not in allowed:
                        self.changes.append((self.step, change))
            self.deployed[stack] = template
            self.settings_in_effect[stack] = dict(synth.context)
            self.touched[stack] = set()

    def synthesize(self, overrides: dict):
        stored = self.settings_file.read_text() if self.settings_file.exists() else ""
        key = (stored, tuple(sorted(overrides.items())))
        if key not in self._synths:
            outdir = self.tmp / f"synth-{len(self._synths)}"
            outdir.mkdir()
            # As `cdk deploy` with credentials runs the app: stacks bound to the account, the
            # AMI and zones the first deploy looked up passed back from cdk.context.json.
            self._synths[key] = synthesize(outdir, {**recorded_lookups(), **overrides},
                                           settings_file=self.settings_file, env=deploy_environment())
        return self._synths[key]


def replay(commands: list[list[str]], tmp: Path) -> Deployment:
    deployment = Deployment(settings_file=tmp / "settings.json", tmp=tmp)
    for argv in commands:
        deployment.run(argv)
    return deployment


def test_the_readme_deploy_sequence_never_deletes_replaces_or_shrinks_what_it_deployed(tmp_path):
    commands = readme_deploy_commands()
    deploys = [argv for argv in commands if argv[:3] == ["npx", "cdk", "deploy"]]
    assert len(deploys) >= 2, "the README deploys more than once (a later deploy is the point)"
    deployment = replay(commands, tmp_path)
    assert deployment.changes == []
    # The replay did deploy what the README says, with the settings it set.
    cluster = deployment.deployed[CLUSTER]["Resources"]
    sizes = sorted(r["Properties"]["MaxSize"] for r in cluster.values()
                   if r["Type"] == "AWS::AutoScaling::AutoScalingGroup")
    assert sizes == ["1", "3"]
    assert SAGEMAKER in deployment.deployed


# The sequence as a README wrote it when settings came only from `-c` flags: the second deploy
# fell back to the defaults. The checker must catch that, or the test above proves nothing.
FLAGS_ONLY_SEQUENCE = [
    ["npx", "cdk", "deploy", CLUSTER, "-c", "worker_count=3", "-c", "instance_type=g5.48xlarge",
     "-c", "efa=true", "-c", "notification_email=you@example.com"],
    ["npx", "cdk", "deploy", CLUSTER, "-c", "ami_id=ami-0123456789abcdef0"],
]


def test_the_checker_catches_a_deploy_that_falls_back_to_defaults(tmp_path):
    deployment = replay(FLAGS_ONLY_SEQUENCE, tmp_path)
    found = {(change.resource_type, change.kind) for _, change in deployment.changes}
    assert ("AWS::AutoScaling::AutoScalingGroup", "shrunk") in found   # 3 workers -> 1
    assert ("AWS::SNS::Subscription", "deleted") in found              # the alerts email


def test_a_dash_c_override_applies_to_one_command_and_the_settings_file_to_all(tmp_path):
    commands = [
        ["maskrcnn", "settings", "set", "worker_count=3"],
        ["npx", "cdk", "deploy", CLUSTER, "-c", "worker_count=2"],
        ["npx", "cdk", "deploy", SAGEMAKER],
    ]
    deployment = replay(commands, tmp_path)
    # Lowering the workers with -c is the user's change: allowed, and only for that command.
    assert [c.kind for _, c in deployment.changes] == []
    assert deployment.settings_in_effect[CLUSTER]["worker_count"] == 2
    assert deployment.settings_in_effect[SAGEMAKER]["worker_count"] == 3


# --- settings that move resources between stacks ---------------------------------------------------

def _exports(template: dict) -> set[str]:
    return {output["Export"]["Name"] for output in template.get("Outputs", {}).values()
            if "Export" in output}


def _imports(node) -> set[str]:
    if isinstance(node, dict):
        found = {node["Fn::ImportValue"]} if "Fn::ImportValue" in node else set()
        return found.union(*(_imports(value) for value in node.values()))
    if isinstance(node, list):
        return set().union(*(_imports(value) for value in node))
    return set()


def _security_groups_named_by_consumer_rules(synth, consumer: str) -> set[str]:
    """Logical ids, in the shared stack, of the security groups that `consumer`'s rules refer to
    through SSM parameters (how the Lustre group's id reaches the training stacks)."""
    template = synth.templates[consumer]
    parameter_names = {ref: spec["Default"] for ref, spec in template.get("Parameters", {}).items()
                       if spec["Type"] == "AWS::SSM::Parameter::Value<String>"}
    named = set()
    for resource in template["Resources"].values():
        if resource["Type"] in ("AWS::EC2::SecurityGroupIngress", "AWS::EC2::SecurityGroupEgress"):
            for key in ("GroupId", "SourceSecurityGroupId", "DestinationSecurityGroupId"):
                ref = resource["Properties"].get(key, {})
                if isinstance(ref, dict) and ref.get("Ref") in parameter_names:
                    named.add(parameter_names[ref["Ref"]])
    groups = set()
    for parameter in synth.resources(SHARED, "AWS::SSM::Parameter").values():
        if parameter["Properties"]["Name"] in named:
            groups.add(parameter["Properties"]["Value"]["Fn::GetAtt"][0])
    assert len(groups) == len(named)
    return groups


ZONES = {"availability_zones": "us-east-1a,us-east-1b", "fsx_lustre_storage_gib": "1200"}
TRANSITIONS = {
    "cluster moves to the other zone": (
        {**ZONES, "cluster_availability_zone": "us-east-1a"},
        {**ZONES, "cluster_availability_zone": "us-east-1b"}),
    "FSx turned off": (
        {**ZONES, "cluster_availability_zone": "us-east-1a"},
        {**ZONES, "cluster_availability_zone": "us-east-1a", "fsx_lustre_storage_gib": "0"}),
    "FSx turned on": (
        {**ZONES, "cluster_availability_zone": "us-east-1a", "fsx_lustre_storage_gib": "0"},
        {**ZONES, "cluster_availability_zone": "us-east-1a"}),
}


@pytest.fixture(scope="module")
def synth_of(tmp_path_factory):
    cache = {}

    def get(overrides: dict):
        key = tuple(sorted(overrides.items()))
        if key not in cache:
            cache[key] = synthesize(tmp_path_factory.mktemp("redeploy"), overrides)
        return cache[key]
    return get


@pytest.mark.parametrize("before, after", TRANSITIONS.values(), ids=TRANSITIONS.keys())
def test_the_shared_stack_keeps_what_the_deployed_training_stacks_still_use(synth_of, before,
                                                                             after):
    """`cdk deploy` updates the shared stack first, while the training stacks still run their old
    templates: CloudFormation refuses to remove an export they import, and EC2 to delete a
    security group their rules name."""
    old, new = synth_of(before), synth_of(after)
    exported = _exports(new.templates[SHARED])
    for consumer in (CLUSTER, SAGEMAKER):
        assert _imports(old.templates[consumer]) <= exported, consumer
        for group in _security_groups_named_by_consumer_rules(old, consumer):
            assert group in new.templates[SHARED]["Resources"], (consumer, group)
        # And the new training stacks find what they need in the new shared stack.
        assert _imports(new.templates[consumer]) <= exported, consumer


def test_moving_the_cluster_zone_replaces_only_the_fsx_file_system_in_the_shared_stack(synth_of):
    before, after = TRANSITIONS["cluster moves to the other zone"]
    old, new = synth_of(before), synth_of(after)
    changes = destructive_changes(SHARED, old.templates[SHARED], new.templates[SHARED])
    # The file system lives in the cluster's zone, so moving the cluster replaces it (its
    # SubnetIds are create-only): owned by cluster_availability_zone, and nothing else goes.
    assert {(c.resource_type, c.kind) for c in changes} == {("AWS::FSx::FileSystem", "replaced")}
