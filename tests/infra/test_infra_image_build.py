"""Where the training image is built: `image_build=local` (a Docker image asset, built by the
deploying machine's Docker), `codebuild` (cdklabs-deploy-time-build's ContainerImageBuild: AWS
CodeBuild builds it in the account during the deploy) and `auto` (local where `docker info`
succeeds, else codebuild). Real synths of the app; `auto` is driven by what is on PATH."""
from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

import pytest
from syrupy.extensions.json import JSONSnapshotExtension

from infra import image_build, outputs

from cdk_synth import (VARIANT_CONTEXT, cdk_json_context, cfn_lint_problems, failing_reports,
                       load_app_module, synthesize)

STACKS = (outputs.NETWORK_STORAGE_STACK, outputs.EFS_CLUSTER_STACK, outputs.SAGEMAKER_STACK)
TRAINING_STACKS = (outputs.EFS_CLUSTER_STACK, outputs.SAGEMAKER_STACK)
BUILD_TYPE = "Custom::CDKContainerImageBuild"


@pytest.fixture(scope="module")
def codebuild_synth(tmp_path_factory):
    return synthesize(tmp_path_factory.mktemp("cdk-codebuild"), {"image_build": "codebuild"})


@pytest.fixture(scope="module")
def codebuild_variant_synth(tmp_path_factory):
    """Every option on (EFA on four cards, name prefix, FSx for Lustre, ...) with the build."""
    return synthesize(tmp_path_factory.mktemp("cdk-codebuild-variant"),
                      {**VARIANT_CONTEXT, "image_build": "codebuild"})


def asset_manifests(outdir: Path) -> dict[str, dict]:
    """Each stack's asset manifest (`<stack>.assets.json`): what `cdk deploy` publishes first."""
    return {path.name.removesuffix(".assets.json"): json.loads(path.read_text())
            for path in outdir.glob("*.assets.json")}


def one(resources: dict[str, dict]) -> tuple[str, dict]:
    assert len(resources) == 1, sorted(resources)
    return next(iter(resources.items()))


# --- codebuild ------------------------------------------------------------------------------

def test_codebuild_needs_no_docker_on_the_deploying_machine(codebuild_synth):
    """No Docker image asset anywhere (`cdk deploy` would run `docker build` for one); the shared
    stack holds the library's build: a CodeBuild project, its trigger and the repository."""
    manifests = asset_manifests(codebuild_synth.outdir)
    assert set(manifests) == set(STACKS)
    assert {stack: m.get("dockerImages", {}) for stack, m in manifests.items()} == {
        stack: {} for stack in STACKS}
    shared = outputs.NETWORK_STORAGE_STACK
    one(codebuild_synth.resources(shared, "AWS::CodeBuild::Project"))
    one(codebuild_synth.resources(shared, BUILD_TYPE))
    one(codebuild_synth.resources(shared, "AWS::ECR::Repository"))
    for stack in TRAINING_STACKS:
        for kind in ("AWS::CodeBuild::Project", BUILD_TYPE, "AWS::ECR::Repository"):
            assert codebuild_synth.resources(stack, kind) == {}, (stack, kind)


def test_codebuild_builds_the_uploaded_build_context_tagged_with_its_hash(codebuild_synth):
    """The build reads the build context as a zip file asset, and the tag is that context's hash
    (the key of the uploaded zip), so a change of what the Dockerfile copies makes a new image."""
    shared = outputs.NETWORK_STORAGE_STACK
    _, build = one(codebuild_synth.resources(shared, BUILD_TYPE))
    tag = build["Properties"]["imageTag"]
    from infra.constructs.training_image import build_context_hash
    assert tag == build_context_hash()
    files = asset_manifests(codebuild_synth.outdir)[shared]["files"]
    assert files[tag]["source"] == {"path": f"asset.{tag}", "packaging": "zip"}
    staged = codebuild_synth.outdir / f"asset.{tag}"
    assert (staged / "docker" / "Dockerfile").is_file()
    assert not (staged / "infra" / "stacks").exists()       # only what the Dockerfile copies
    assert build["Properties"]["sourceS3Url"]["Fn::Sub"].endswith(f"/{tag}.zip")
    assert "--platform linux/amd64" in build["Properties"]["buildCommand"]
    assert "--file docker/Dockerfile" in build["Properties"]["buildCommand"]


def image_uri(synth, stack: str):
    return synth.templates[stack]["Outputs"][outputs.TRAINING_IMAGE_URI]["Value"]


def test_codebuild_one_image_uri_for_the_cluster_and_sagemaker(codebuild_synth):
    """Both training stacks name the image the build pushes: the repository the build writes to,
    with the build's tag, and the cluster's nodes get that same URI."""
    shared = outputs.NETWORK_STORAGE_STACK
    repository_id, _ = one(codebuild_synth.resources(shared, "AWS::ECR::Repository"))
    _, build = one(codebuild_synth.resources(shared, BUILD_TYPE))
    tag = build["Properties"]["imageTag"]

    cluster_uri, sagemaker_uri = (image_uri(codebuild_synth, s) for s in TRAINING_STACKS)
    assert cluster_uri == sagemaker_uri
    parts = cluster_uri["Fn::Join"][1]
    exports = {o["Export"]["Name"]: o["Value"]
               for o in codebuild_synth.templates[shared]["Outputs"].values() if "Export" in o}

    def resolve_imports(node):
        if isinstance(node, dict):
            if "Fn::ImportValue" in node:
                return exports[node["Fn::ImportValue"]]
            return {key: resolve_imports(value) for key, value in node.items()}
        if isinstance(node, list):
            return [resolve_imports(value) for value in node]
        return node

    # With the imports replaced by what the shared stack exports: the build's repository URI,
    # then ":" and the build's tag.
    assert resolve_imports(parts) == [*build["Properties"]["repositoryUri"]["Fn::Join"][1],
                                      f":{tag}"]
    assert repository_id in json.dumps(build["Properties"]["repositoryUri"])
    # The nodes' user data carries the same expression.
    user_data = json.dumps(codebuild_synth.resources(
        outputs.EFS_CLUSTER_STACK, "AWS::EC2::LaunchTemplate"))
    assert f'TRAINING_IMAGE_URI=", {json.dumps(parts[:-1])[1:-1]}, "{parts[-1]}' in user_data


def test_codebuild_shared_exports_never_change_with_the_image(codebuild_synth):
    """CloudFormation refuses to change an export another stack imports ("You can't modify or
    remove an output value that is referenced by another stack", AWS CloudFormation User Guide,
    Fn::ImportValue). So no export carries the tag or the build resource's attribute: the tag is
    text in the training stacks' templates."""
    shared = outputs.NETWORK_STORAGE_STACK
    build_id, build = one(codebuild_synth.resources(shared, BUILD_TYPE))
    tag = build["Properties"]["imageTag"]
    exported = json.dumps([o for o in codebuild_synth.templates[shared]["Outputs"].values()
                           if "Export" in o])
    assert tag not in exported and build_id not in exported


def policy_statements(template: dict, role_id: str) -> list[dict]:
    statements = []
    for resource in template["Resources"].values():
        if resource["Type"] == "AWS::IAM::Policy" and {"Ref": role_id} in resource[
                "Properties"]["Roles"]:
            statements += resource["Properties"]["PolicyDocument"]["Statement"]
    return statements


def actions(statement: dict) -> list[str]:
    return statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]


def test_codebuild_project_permissions_are_scoped(codebuild_synth):
    """The build role pushes only to its repository, reads only the CDK assets bucket, writes only
    its own log group and report groups; '*' only for ecr:GetAuthorizationToken, which IAM
    cannot scope ("ecr:GetAuthorizationToken ... Resource: *", Amazon ECR User Guide, private
    repository policies). The trigger may start this one project and nothing else."""
    shared = outputs.NETWORK_STORAGE_STACK
    template = codebuild_synth.templates[shared]
    project_id, project = one(codebuild_synth.resources(shared, "AWS::CodeBuild::Project"))
    repository_id, _ = one(codebuild_synth.resources(shared, "AWS::ECR::Repository"))
    role_id = project["Properties"]["ServiceRole"]["Fn::GetAtt"][0]
    statements = policy_statements(template, role_id)
    assert all(s["Effect"] == "Allow" for s in statements)
    for statement in statements:
        names = actions(statement)
        assert not any(a == "*" or a.endswith(":*") for a in names), names
        resources = json.dumps(statement["Resource"])
        service = {a.split(":")[0] for a in names}
        assert len(service) == 1, names
        if statement["Resource"] == "*":
            assert names == ["ecr:GetAuthorizationToken"]
        elif service == {"ecr"}:
            assert resources == json.dumps({"Fn::GetAtt": [repository_id, "Arn"]})
        elif service == {"s3"}:
            assert all(a.startswith(("s3:Get", "s3:List")) for a in names), names
            assert "cdk-hnb659fds-assets-" in resources
        elif service == {"logs"}:
            assert f":log-group:/aws/codebuild/\", {{\"Ref\": \"{project_id}\"}}" in resources
        else:
            assert service == {"codebuild"} and ":report-group/" in resources
    pushes = [s for s in statements if "ecr:PutImage" in actions(s)]
    assert len(pushes) == 1
    roles = {lid: r for lid, r in template["Resources"].items() if r["Type"] == "AWS::IAM::Role"}
    assert roles[role_id]["Properties"]["AssumeRolePolicyDocument"]["Statement"][0][
        "Principal"] == {"Service": "codebuild.amazonaws.com"}

    _, handler = one({lid: r for lid, r in codebuild_synth.resources(
        shared, "AWS::Lambda::Function").items() if "DeployTimeBuild" in lid})
    handler_statements = policy_statements(template, handler["Properties"]["Role"]["Fn::GetAtt"][0])
    assert handler_statements == [{"Action": "codebuild:StartBuild", "Effect": "Allow",
                                   "Resource": {"Fn::GetAtt": [project_id, "Arn"]}}]


def test_codebuild_project_builds_on_a_codebuild_image_with_room_for_cuda(codebuild_synth):
    _, project = one(codebuild_synth.resources(outputs.NETWORK_STORAGE_STACK,
                                               "AWS::CodeBuild::Project"))
    environment = project["Properties"]["Environment"]
    assert environment["ComputeType"] == "BUILD_GENERAL1_LARGE"   # 8 vCPUs, 15 GB
    assert environment["Image"].startswith("aws/codebuild/")   # CodeBuild's own image
    assert environment["PrivilegedMode"] is True                # Docker inside the build
    assert project["Properties"]["Artifacts"] == {"Type": "NO_ARTIFACTS"}


def test_codebuild_training_roles_only_pull_from_the_repository(codebuild_synth):
    """The cluster nodes and SageMaker's job role pull the image; none of them may push."""
    for stack in TRAINING_STACKS:
        template = codebuild_synth.templates[stack]
        pulls = [s for r in template["Resources"].values() if r["Type"] == "AWS::IAM::Policy"
                 for s in r["Properties"]["PolicyDocument"]["Statement"]
                 if "ecr:BatchGetImage" in actions(s)]
        assert pulls, stack
        for statement in pulls:
            assert not {"ecr:PutImage", "ecr:InitiateLayerUpload"} & set(actions(statement))
            assert "Fn::ImportValue" in json.dumps(statement["Resource"])


def test_codebuild_repository_scans_and_expires_old_images(codebuild_synth):
    _, repository = one(codebuild_synth.resources(outputs.NETWORK_STORAGE_STACK,
                                                  "AWS::ECR::Repository"))
    properties = repository["Properties"]
    assert properties["ImageScanningConfiguration"] == {"ScanOnPush": True}
    assert properties["EmptyOnDelete"] is True and repository["DeletionPolicy"] == "Delete"
    policy = json.loads(properties["LifecyclePolicy"]["LifecyclePolicyText"])
    (rule,) = policy["rules"]
    assert rule["selection"]["countType"] == "imageCountMoreThan"
    assert rule["action"] == {"type": "expire"}


@pytest.mark.parametrize("synth_fixture", ["codebuild_synth", "codebuild_variant_synth"])
def test_codebuild_synth_is_nag_clean(request, synth_fixture):
    synth = request.getfixturevalue(synth_fixture)    # synth itself fails on a finding
    assert failing_reports(synth.outdir) == []


@pytest.mark.parametrize("synth_fixture", ["codebuild_synth", "codebuild_variant_synth"])
@pytest.mark.parametrize("stack", STACKS)
def test_codebuild_templates_pass_cfn_lint(request, synth_fixture, stack):
    synth = request.getfixturevalue(synth_fixture)
    assert cfn_lint_problems(synth.templates[stack]) == []


@pytest.mark.parametrize("stack", STACKS)
def test_codebuild_template_snapshot(codebuild_synth, snapshot, stack):
    """The templates with image_build=codebuild, asset hashes (the tag, the uploaded context, the
    library's handler code) normalised as in test_infra_snapshots.py."""
    text = re.sub(r"\b[0-9a-f]{64}\b", "<asset-hash>", json.dumps(codebuild_synth.templates[stack]))
    assert json.loads(text) == snapshot.use_extension(JSONSnapshotExtension)


# --- local ----------------------------------------------------------------------------------

def test_local_builds_one_docker_asset_for_both_training_stacks(default_synth):
    """image_build=local (what the shared fixtures use): each training stack holds the Docker
    image asset, the same one (same content hash, same destination), and nothing is built in the
    account."""
    assert default_synth.context["image_build"] == "local"
    manifests = asset_manifests(default_synth.outdir)
    images = {stack: manifests[stack].get("dockerImages", {}) for stack in TRAINING_STACKS}
    assert manifests[outputs.NETWORK_STORAGE_STACK].get("dockerImages", {}) == {}
    (cluster_hash,), (sagemaker_hash,) = (list(i) for i in images.values())
    assert cluster_hash == sagemaker_hash
    cluster_image, sagemaker_image = (i[cluster_hash] for i in images.values())
    assert cluster_image["source"] == sagemaker_image["source"]
    assert cluster_image["source"]["dockerFile"] == "docker/Dockerfile"
    assert cluster_image["source"]["platform"] == "linux/amd64"
    assert image_uri(default_synth, outputs.EFS_CLUSTER_STACK) == image_uri(
        default_synth, outputs.SAGEMAKER_STACK)
    for stack in STACKS:
        for kind in ("AWS::CodeBuild::Project", BUILD_TYPE):
            assert default_synth.resources(stack, kind) == {}


# --- auto -----------------------------------------------------------------------------------

def fake_docker(directory: Path, info_status: int, calls: Path) -> Path:
    """A `docker` command whose `info` exits with `info_status` (this machine has no Docker engine
    to answer); each call is appended to `calls`."""
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "docker"
    script.write_text(f'#!/bin/sh\necho "$*" >> "{calls}"\n'
                      f'[ "$1" = info ] && exit {info_status}\nexit 0\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return directory


def path_without_docker() -> str:
    """PATH with every directory that holds a `docker` command left out."""
    return os.pathsep.join(d for d in os.environ["PATH"].split(os.pathsep)
                           if d and not (Path(d) / "docker").exists())


def build_app(tmp_path: Path, overrides: dict | None = None):
    """The real app built (not synthesized) with the default settings, as `cdk synth` runs it."""
    import aws_cdk as cdk

    from infra import settings

    context = {**cdk_json_context(), "settings_file": settings.NO_FILE,
               **(overrides or {})}
    return load_app_module().build(cdk.App(context=context, outdir=str(tmp_path / "out")))


def built_mode(stacks) -> str:
    """Which path the built app took: the build in the shared stack, or an asset per stack."""
    shared = stacks.shared.training_image is not None
    per_stack = [s.node.try_find_child("TrainingImage") is not None
                 for s in (stacks.efs_cluster, stacks.sagemaker)]
    assert per_stack in ([False, False], [True, True]) and per_stack[0] != shared
    return "codebuild" if shared else "local"


def test_auto_is_the_default():
    from infra.config import SETTINGS
    assert SETTINGS["image_build"].default == "auto"


def test_auto_without_a_docker_command_builds_in_codebuild(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", path_without_docker())
    monkeypatch.delenv("CDK_DOCKER", raising=False)
    assert built_mode(build_app(tmp_path)) == "codebuild"
    assert "image_build=auto: no 'docker' command on PATH" in capsys.readouterr().err


@pytest.mark.parametrize("info_status, mode, said", [
    (1, "codebuild", "`docker info` failed"),     # a client with no engine running
    (0, "local", "image_build=local"),            # the synth note says how to keep the choice
])
def test_auto_asks_docker_info_whether_to_build_locally(tmp_path, monkeypatch, capsys, info_status, mode, said):
    calls = tmp_path / "calls"
    bin_dir = fake_docker(tmp_path / "bin", info_status, calls)
    monkeypatch.setenv("PATH", os.pathsep.join([str(bin_dir), path_without_docker()]))
    monkeypatch.delenv("CDK_DOCKER", raising=False)
    assert built_mode(build_app(tmp_path)) == mode
    assert calls.read_text() == "info\n"
    assert said in capsys.readouterr().err


def test_auto_asks_the_command_cdk_builds_with(tmp_path, monkeypatch):
    """CDK builds image assets with the command named by CDK_DOCKER when it is set; that is the
    one whose engine must answer."""
    calls = tmp_path / "calls"
    fake_docker(tmp_path / "bin", 0, calls).joinpath("docker").rename(tmp_path / "bin" / "podman")
    monkeypatch.setenv("PATH", os.pathsep.join([str(tmp_path / "bin"), path_without_docker()]))
    monkeypatch.setenv("CDK_DOCKER", "podman")
    assert image_build.resolve("auto")[0] == "local"
    assert calls.read_text() == "info\n"


@pytest.mark.parametrize("explicit", ["local", "codebuild"])
@pytest.mark.parametrize("info_status", [0, 1])
def test_an_explicit_setting_wins_without_asking_docker(tmp_path, monkeypatch, capsys,
                                                        explicit, info_status):
    calls = tmp_path / "calls"
    bin_dir = fake_docker(tmp_path / "bin", info_status, calls)
    monkeypatch.setenv("PATH", os.pathsep.join([str(bin_dir), path_without_docker()]))
    assert image_build.resolve(explicit) == (explicit, None)
    assert not calls.exists()


def test_a_bad_image_build_value_is_refused_before_any_construct(tmp_path):
    from infra.config import ConfigError
    with pytest.raises(ConfigError, match="image_build.*allowed: auto, local, codebuild"):
        build_app(tmp_path, {"image_build": "docker"})
