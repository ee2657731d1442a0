"""Assertions on the synthesized templates, for every property the infrastructure issue lists:
encryption, IMDSv2, security-group rules, retain policies, placement group, launch templates
(no launch configurations), least-privilege statements and outputs."""
from __future__ import annotations

import base64
import fnmatch
import json
import re

import pytest
from aws_cdk.assertions import Match

from infra import outputs
from infra.constructs.training_image import dockerfile_copy_sources
from infra.userdata import CLUSTER_NODE_SCRIPT

from cdk_synth import REPO_ROOT, SSH_CONTEXT, VARIANT_CONTEXT, cdk_json_context

SHARED = outputs.NETWORK_STORAGE_STACK
CLUSTER = outputs.EFS_CLUSTER_STACK
SAGEMAKER = outputs.SAGEMAKER_STACK
ALL_STACKS = (SHARED, CLUSTER, SAGEMAKER)


def statements(synth, stack: str) -> list[dict]:
    """Every IAM statement in a stack's inline policies, with the policy's logical id."""
    found = []
    for logical_id, policy in synth.resources(stack, "AWS::IAM::Policy").items():
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            found.append({**statement, "_policy": logical_id})
    return found


def policy_of(synth, stack: str, role_prefix: str) -> list[dict]:
    return [s for s in statements(synth, stack) if s["_policy"].startswith(role_prefix)]


def actions(statement: dict) -> list[str]:
    value = statement["Action"]
    return [value] if isinstance(value, str) else value


def user_data(synth, stack: str, launch_template_prefix: str) -> str:
    """A launch template's user data with CloudFormation expressions rendered as <...>."""
    (template,) = [r for lid, r in synth.resources(stack, "AWS::EC2::LaunchTemplate").items()
                   if lid.startswith(launch_template_prefix)]
    parts = template["Properties"]["LaunchTemplateData"]["UserData"]["Fn::Base64"]["Fn::Join"][1]
    return "".join(p if isinstance(p, str) else f"<{json.dumps(p)}>" for p in parts)


def import_of(value) -> str:
    return value["Fn::ImportValue"]


# --- shared network and storage -----------------------------------------------------------------

def test_vpc_has_public_and_private_subnets_nat_s3_endpoint_and_flow_logs(default_synth):
    template = default_synth.template(SHARED)
    subnets = default_synth.resources(SHARED, "AWS::EC2::Subnet").values()
    public = [s for s in subnets if s["Properties"].get("MapPublicIpOnLaunch")]
    assert len(public) == 2 and len(subnets) == 4
    template.resource_count_is("AWS::EC2::NatGateway", 1)
    template.has_resource_properties("AWS::EC2::VPCEndpoint", {
        "VpcEndpointType": "Gateway",
        "ServiceName": Match.object_like({"Fn::Join": ["", Match.array_with([".s3"])]}),
    })
    template.has_resource_properties("AWS::EC2::FlowLog", {
        "ResourceType": "VPC", "TrafficType": "ALL", "LogDestinationType": "s3"})


def test_file_system_is_encrypted_elastic_retained_with_mount_targets_in_private_subnets(default_synth):
    template = default_synth.template(SHARED)
    template.has_resource("AWS::EFS::FileSystem", {
        "Properties": Match.object_like({"Encrypted": True, "ThroughputMode": "elastic",
                                         "PerformanceMode": "generalPurpose"}),
        "DeletionPolicy": "Retain", "UpdateReplacePolicy": "Retain"})
    private = {lid for lid, s in default_synth.resources(SHARED, "AWS::EC2::Subnet").items()
               if not s["Properties"].get("MapPublicIpOnLaunch")}
    targets = default_synth.resources(SHARED, "AWS::EFS::MountTarget").values()
    assert {t["Properties"]["SubnetId"]["Ref"] for t in targets} == private


def test_file_system_admits_nfs_only_from_cluster_notebook_and_training_groups(default_synth):
    (efs_group,) = [group for lid, group in
                    default_synth.resources(SHARED, "AWS::EC2::SecurityGroup").items()
                    if lid.startswith("FileSystem")]
    assert "SecurityGroupIngress" not in efs_group["Properties"]  # no rule of its own
    sources = {}
    for stack in ALL_STACKS:
        for rule in default_synth.resources(stack, "AWS::EC2::SecurityGroupIngress").values():
            props = rule["Properties"]
            if props.get("FromPort") == 2049:
                assert "CidrIp" not in props and props["IpProtocol"] == "tcp"
                assert "FileSystemSecurityGroup" in import_of(props["GroupId"])
                sources[stack] = sources.get(stack, []) + [props["SourceSecurityGroupId"]]
    assert sorted(len(v) for v in sources.values()) == [1, 2]
    assert set(sources) == {CLUSTER, SAGEMAKER}


def test_vpc_zones_can_be_named(default_synth, variant_synth):
    zones = {s["Properties"]["AvailabilityZone"] for s in
             variant_synth.resources(SHARED, "AWS::EC2::Subnet").values()}
    assert zones == {"us-east-1a", "us-east-1b"}
    for subnet in default_synth.resources(SHARED, "AWS::EC2::Subnet").values():
        assert "Fn::GetAZs" in json.dumps(subnet["Properties"]["AvailabilityZone"])


def test_existing_file_system_is_reused_with_new_mount_targets(variant_synth):
    template = variant_synth.template(SHARED)
    template.resource_count_is("AWS::EFS::FileSystem", 0)
    targets = variant_synth.resources(SHARED, "AWS::EFS::MountTarget").values()
    assert len(targets) == 2
    assert {t["Properties"]["FileSystemId"] for t in targets} == {"fs-0123456789abcdef0"}
    (parameter,) = [p for p in variant_synth.resources(SHARED, "AWS::SSM::Parameter").values()
                    if p["Properties"]["Name"].endswith("/file-system-id")
                    and "/lustre/" not in p["Properties"]["Name"]]
    assert parameter["Properties"]["Value"] == "fs-0123456789abcdef0"
    cluster = variant_synth.templates[CLUSTER]
    reference = cluster["Outputs"][outputs.FILE_SYSTEM_ID]["Value"]["Ref"]
    assert cluster["Parameters"][reference] == {
        "Type": "AWS::SSM::Parameter::Value<String>",
        "Default": f"/maskrcnn/team-a-{SHARED}/file-system-id"}
    assert parameter["Properties"]["Name"] == cluster["Parameters"][reference]["Default"]


def test_training_stacks_import_nothing_that_depends_on_the_file_system(default_synth,
                                                                        variant_synth):
    """CloudFormation refuses to change or remove an export that another stack imports: if the
    training stacks imported the file system's id, changing existing_file_system_id (or switching
    between a created and an existing file system) would fail while they exist. They read it
    from an SSM parameter at deploy time instead."""
    for synth in (default_synth, variant_synth):
        exports = {o["Export"]["Name"]: o["Value"]
                   for o in synth.templates[SHARED]["Outputs"].values() if "Export" in o}
        for stack in (CLUSTER, SAGEMAKER):
            imported = set(re.findall(r'"Fn::ImportValue": "([^"]+)"',
                                      json.dumps(synth.templates[stack])))
            assert imported and imported <= set(exports)
            for name in imported:
                value = json.dumps(exports[name])
                assert "FileSystem" not in value.replace("FileSystemSecurityGroup", ""), name


# --- FSx for Lustre (fsx_lustre_storage_gib) ------------------------------------------------------

def test_lustre_is_scratch_linked_to_the_data_bucket_in_the_cluster_zone(default_synth,
                                                                         variant_synth):
    assert default_synth.resources(SHARED, "AWS::FSx::FileSystem") == {}
    for stack in ALL_STACKS:
        template = default_synth.templates[stack]
        # Without FSx only its security group (and the parameter naming it) exists: turning the
        # option off must not delete a group the training stacks' rules still reference.
        assert not [name for name in [*template["Resources"], *template.get("Outputs", {}),
                                      *template.get("Parameters", {})]
                    if "lustre" in name.lower() and not name.startswith("LustreSecurityGroup")], stack
    ((logical_id, lustre),) = variant_synth.resources(SHARED, "AWS::FSx::FileSystem").items()
    props = lustre["Properties"]
    assert props["FileSystemType"] == "LUSTRE"
    assert props["StorageCapacity"] == int(VARIANT_CONTEXT["fsx_lustre_storage_gib"])
    (bucket_id,) = [lid for lid in variant_synth.resources(SHARED, "AWS::S3::Bucket")
                    if lid.startswith("DataBucket")]
    assert props["LustreConfiguration"] == {
        "DeploymentType": "SCRATCH_2", "AutoImportPolicy": "NEW_CHANGED_DELETED",
        "ImportPath": {"Fn::Join": ["", ["s3://", {"Ref": bucket_id},
                                         f"/{outputs.LUSTRE_IMPORT_PREFIX}"]]}}
    # A cache of the bucket: destroyed with the stack (nothing on it is unique).
    assert lustre["DeletionPolicy"] == "Delete"
    # One private subnet: the one in the cluster's zone (us-east-1b, the VPC's second).
    (subnet_ref,) = props["SubnetIds"]
    subnet = variant_synth.templates[SHARED]["Resources"][subnet_ref["Ref"]]
    assert subnet["Properties"]["AvailabilityZone"] == VARIANT_CONTEXT["cluster_availability_zone"]
    assert subnet["Properties"]["MapPublicIpOnLaunch"] is False
    # Jobs reading it run in that subnet: the launchers read it from the outputs.
    for stack in (CLUSTER, SAGEMAKER):
        out = variant_synth.templates[stack]["Outputs"]
        assert {outputs.LUSTRE_FILE_SYSTEM_ID, outputs.LUSTRE_MOUNT_NAME,
                outputs.LUSTRE_SUBNET_ID} <= set(out)
        assert subnet_ref["Ref"] in import_of(out[outputs.LUSTRE_SUBNET_ID]["Value"])


def test_lustre_admits_its_ports_only_from_the_cluster_and_training_groups(variant_synth):
    shared = variant_synth.templates[SHARED]["Resources"]
    (lustre,) = variant_synth.resources(SHARED, "AWS::FSx::FileSystem").values()
    (group_ref,) = lustre["Properties"]["SecurityGroupIds"]
    group_id = group_ref["Fn::GetAtt"][0]
    assert "SecurityGroupIngress" not in shared[group_id]["Properties"]
    parameter = [p["Properties"]["Name"] for p in shared.values()
                 if p["Type"] == "AWS::SSM::Parameter" and p["Properties"]["Value"] == group_ref]
    assert parameter == [f"/maskrcnn/team-a-{SHARED}/lustre/security-group-id"]
    client_groups = {CLUSTER: "ClusterNodeSecurityGroup", SAGEMAKER: "TrainingJobSecurityGroup"}
    for stack in ALL_STACKS:
        template = variant_synth.templates[stack]
        ports = set()
        for rule in variant_synth.resources(stack, "AWS::EC2::SecurityGroupIngress").values():
            props = rule["Properties"]
            if stack == SHARED:
                if props["GroupId"] == group_ref:    # only between the file servers
                    assert props["SourceSecurityGroupId"] == group_ref
                    assert (props["FromPort"], props["ToPort"]) == (988, 1023)
                continue
            if props.get("FromPort") not in (988, 1018) or "Ref" not in props["GroupId"]:
                continue   # (the client group's rules from the servers: below)
            # Into the Lustre group (its id read from the SSM parameter), from the client group.
            assert template["Parameters"][props["GroupId"]["Ref"]]["Default"] == parameter[0]
            assert props["SourceSecurityGroupId"]["Fn::GetAtt"][0].startswith(client_groups[stack])
            assert "CidrIp" not in props and props["IpProtocol"] == "tcp"
            ports.add((props["FromPort"], props["ToPort"]))
        if stack != SHARED:
            assert ports == {(988, 988), (1018, 1023)}, stack
    # The servers open connections too (FSx user guide): the Lustre ports outbound from the
    # Lustre group to itself and to each client group, and inbound on the client groups from it.
    egress = [r["Properties"] for r in shared.values() if r["Type"] == "AWS::EC2::SecurityGroupEgress"
              and r["Properties"]["GroupId"] == group_ref]
    assert sorted((e["FromPort"], e["ToPort"]) for e in egress) == [(988, 988), (1018, 1023)]
    assert all(e["DestinationSecurityGroupId"] == group_ref for e in egress)
    for stack, client in client_groups.items():
        resources = variant_synth.templates[stack]["Resources"]
        lustre_group = {"Ref": next(ref for ref, spec in variant_synth.templates[stack]["Parameters"].items()
                                    if spec.get("Default") == parameter[0])}
        to_clients = sorted((r["Properties"]["FromPort"], r["Properties"]["ToPort"]) for r in resources.values()
                            if r["Type"] == "AWS::EC2::SecurityGroupEgress"
                            and r["Properties"]["GroupId"] == lustre_group
                            and r["Properties"]["DestinationSecurityGroupId"]["Fn::GetAtt"][0].startswith(client))
        from_servers = sorted((r["Properties"]["FromPort"], r["Properties"]["ToPort"]) for r in resources.values()
                              if r["Type"] == "AWS::EC2::SecurityGroupIngress"
                              and r["Properties"].get("SourceSecurityGroupId") == lustre_group)
        assert to_clients == from_servers == [(988, 988), (1018, 1023)], stack
        # Only the Lustre group's rules refer to it: nothing else opens to or from it.
        assert sum(json.dumps(r).count(lustre_group["Ref"]) for r in resources.values()) == 6, stack


@pytest.mark.parametrize("prefix", ["ClusterMaster", "ClusterWorker"])
def test_nodes_are_told_where_lustre_is_only_when_there_is_one(default_synth, variant_synth,
                                                                prefix):
    def env(synth):
        text = user_data(synth, CLUSTER, prefix)
        block = text.split("cat > /etc/maskrcnn/cluster.env <<'EOF'\n", 1)[1].split("\nEOF\n")[0]
        return dict(line.split("=", 1) for line in block.splitlines())

    assert not {"FSX_MOUNT", "FSX_DNS_NAME", "FSX_MOUNT_NAME"} & set(env(default_synth))
    variant = env(variant_synth)
    assert variant["FSX_MOUNT"] == "/fsx"
    # The variant's p4d.24xlarge nodes have an EFA interface on each of their 4 network cards
    # (AWS's instance specifications); the default's g5.48xlarge nodes get EFA, on by default where
    # the type has it, on their one network card. The job reads this to choose its transport.
    assert (variant["EFA_INTERFACES"], env(default_synth)["EFA_INTERFACES"]) == ("4", "1")
    parameters = variant_synth.templates[CLUSTER]["Parameters"]
    for key, name in (("FSX_DNS_NAME", "dns-name"), ("FSX_MOUNT_NAME", "mount-name")):
        ref = json.loads(variant[key].strip("<>"))["Ref"]
        assert parameters[ref]["Default"] == f"/maskrcnn/team-a-{SHARED}/lustre/{name}"
    # The boot steps the user data fetches (test_infra_boot_failures.py checks it is this file).
    assert "lustre-client-modules-$(uname -r)" in CLUSTER_NODE_SCRIPT.read_text()


def test_burst_credit_alarm_only_in_bursting_mode(default_synth, variant_synth):
    assert default_synth.resources(SHARED, "AWS::CloudWatch::Alarm") == {}
    (alarm,) = variant_synth.resources(SHARED, "AWS::CloudWatch::Alarm").values()
    props = alarm["Properties"]
    assert (props["Namespace"], props["MetricName"], props["Statistic"]) == (
        "AWS/EFS", "BurstCreditBalance", "Minimum")
    assert props["Dimensions"] == [{"Name": "FileSystemId", "Value": "fs-0123456789abcdef0"}]
    assert props["ComparisonOperator"] == "LessThanThreshold"
    assert props["Threshold"] == 512 * 1024**3
    (topic_id,) = variant_synth.resources(SHARED, "AWS::SNS::Topic")
    assert props["AlarmActions"] == [{"Ref": topic_id}]


def test_bursting_throughput_is_an_option():
    import aws_cdk as cdk
    from aws_cdk import aws_ec2 as ec2
    from aws_cdk.assertions import Template

    from infra.constructs.file_system import SharedFileSystem

    stack = cdk.Stack(cdk.App(context=cdk_json_context()), "FileSystemOnly")
    vpc = ec2.Vpc(stack, "Vpc", max_azs=1)
    SharedFileSystem(stack, "FileSystem", vpc=vpc, subnets=vpc.private_subnets,
                     throughput_mode="bursting")
    Template.from_stack(stack).has_resource_properties(
        "AWS::EFS::FileSystem", {"ThroughputMode": "bursting", "Encrypted": True})


def test_buckets_are_encrypted_private_tls_only_and_retained(default_synth):
    template = default_synth.template(SHARED)
    buckets = default_synth.resources(SHARED, "AWS::S3::Bucket")
    assert len(buckets) == 2
    for bucket in buckets.values():
        assert bucket["DeletionPolicy"] == "Retain"
        props = bucket["Properties"]
        assert props["BucketEncryption"]["ServerSideEncryptionConfiguration"][0][
            "ServerSideEncryptionByDefault"]["SSEAlgorithm"] == "AES256"
        assert props["PublicAccessBlockConfiguration"] == {
            "BlockPublicAcls": True, "BlockPublicPolicy": True,
            "IgnorePublicAcls": True, "RestrictPublicBuckets": True}
    for policy in default_synth.resources(SHARED, "AWS::S3::BucketPolicy").values():
        denies = [s for s in policy["Properties"]["PolicyDocument"]["Statement"]
                  if s["Effect"] == "Deny"]
        assert any(s["Condition"] == {"Bool": {"aws:SecureTransport": "false"}} for s in denies)
    template.has_resource_properties("AWS::S3::Bucket", {
        "LoggingConfiguration": Match.object_like({"LogFilePrefix": "data-bucket/"})})


def test_stateful_resources_keep_their_logical_ids(default_synth):
    """Renaming these would make CloudFormation replace them: a new, empty file system/bucket."""
    shared = default_synth.templates[SHARED]["Resources"]
    assert shared["FileSystem0A147049"]["Type"] == "AWS::EFS::FileSystem"
    assert shared["DataBucketBD860FE1"]["Type"] == "AWS::S3::Bucket"
    assert shared["LogBucket7273C8DB"]["Type"] == "AWS::S3::Bucket"


# --- training image -----------------------------------------------------------------------------

@pytest.mark.parametrize("stack", [CLUSTER, SAGEMAKER])
def test_training_image_is_a_docker_asset_from_the_repo_root(default_synth, stack):
    manifest = json.loads((default_synth.outdir / f"{stack}.assets.json").read_text())
    (image,) = manifest["dockerImages"].values()
    assert image["source"]["dockerFile"] == "docker/Dockerfile"
    context_dir = default_synth.outdir / image["source"]["directory"]
    staged = {p.name for p in context_dir.iterdir()}
    assert {"constraints.txt", "training", "launch", "docker"} <= staged
    assert not staged & {".venv", "node_modules", "cdk.out", ".git", "tests", "data", "runs",
                         "bench", "docs", "notebooks"}
    assert not list(context_dir.rglob("__pycache__"))
    uri = default_synth.templates[stack]["Outputs"][outputs.TRAINING_IMAGE_URI]["Value"]["Fn::Sub"]
    assert "container-assets" in uri and uri.endswith(image["destinations"][next(
        iter(image["destinations"]))]["imageTag"])


def test_every_dockerfile_copy_source_is_in_the_staged_build_context(default_synth):
    """The excludes must not drop anything docker/Dockerfile copies (it builds at deploy time,
    from the context staged here)."""
    manifest = json.loads((default_synth.outdir / f"{CLUSTER}.assets.json").read_text())
    (image,) = manifest["dockerImages"].values()
    context_dir = default_synth.outdir / image["source"]["directory"]
    dockerfile = (context_dir / image["source"]["dockerFile"]).read_text()
    sources = []
    for line in dockerfile.replace("\\\n", " ").splitlines():
        words = line.split()
        if words and words[0].upper() == "COPY" and not any(w.startswith("--from") for w in words):
            sources += [w for w in words[1:-1] if not w.startswith("--")]
    assert sources, "no COPY instruction found"
    missing = [src for src in sources if not (context_dir / src).exists()]
    assert missing == []


def test_both_stacks_share_one_image_tag(default_synth):
    tags = {default_synth.templates[s]["Outputs"][outputs.TRAINING_IMAGE_URI]["Value"]["Fn::Sub"]
            for s in (CLUSTER, SAGEMAKER)}
    assert len(tags) == 1


def test_image_tag_depends_only_on_what_the_dockerfile_copies(tmp_path):
    """The tag is in every node's user data: if editing infra/ or a README changed it, a
    replacement node would pull an image whose code differs from the running nodes'."""
    import shutil

    import aws_cdk as cdk

    from infra.constructs.training_image import DOCKERFILE, TrainingImage

    def tag(directory):
        stack = cdk.Stack(cdk.App(context=cdk_json_context()), "ImageOnly")
        return TrainingImage(stack, "Image", directory=directory).asset.asset_hash

    repo = tmp_path / "repo"
    copied = dockerfile_copy_sources(REPO_ROOT / DOCKERFILE)
    assert {"training", "launch", "constraints.txt", "docker/entrypoint.sh"} <= set(copied)
    for relative in (DOCKERFILE, *copied, "README.md", "infra/constructs/cluster.py",
                     "infra/userdata/cluster_node.sh", "docs/infra.md", "notebooks"):
        source, target = REPO_ROOT / relative, repo / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, target)
    original = tag(repo)
    assert original == tag(REPO_ROOT)   # nothing else in the repository counts
    for relative in ("README.md", "infra/constructs/cluster.py", "infra/userdata/cluster_node.sh",
                     "docs/infra.md"):
        with (repo / relative).open("a") as file:
            file.write("\n# edited\n")
    (repo / "infra" / "new_module.py").write_text("x = 1\n")
    assert tag(repo) == original
    with (repo / "training" / "__init__.py").open("a") as file:
        file.write("\n# edited\n")
    assert tag(repo) != original


# --- IAM across the app ---------------------------------------------------------------------------

def test_no_full_access_managed_policies_and_no_bucket_wildcards(default_synth, variant_synth):
    for synth in (default_synth, variant_synth):
        for stack, template in synth.templates.items():
            text = json.dumps(template)
            assert "FullAccess" not in text, stack
            assert "arn:aws:s3:::*" not in text and ":s3:::*" not in text, stack
            for statement in statements(synth, stack):
                assert statement["Effect"] == "Allow"
                assert not any(a == "*" or a.endswith(":*") for a in actions(statement)), statement
            for role in synth.resources(stack, "AWS::IAM::Role").values():
                # Every permission is in the template, where these tests can read it.
                assert "ManagedPolicyArns" not in role["Properties"], role


# Systems Manager user guide, "Step 2: Verify or add instance permissions for Session Manager"
# (custom instance policy with minimal Session Manager permissions): ssm:UpdateInstanceInformation
# and the ssmmessages channel actions, on "*".
SESSION_MANAGER_ACTIONS = {"ssm:UpdateInstanceInformation", "ssmmessages:CreateControlChannel",
                           "ssmmessages:CreateDataChannel", "ssmmessages:OpenControlChannel",
                           "ssmmessages:OpenDataChannel"}
# Run Command (launch/smoke.py runs its checks on the master with AWS-RunShellScript): the agent's
# ec2messages actions, as AWS's AmazonSSMManagedInstanceCore grants them.
RUN_COMMAND_ACTIONS = {"ec2messages:AcknowledgeMessage", "ec2messages:DeleteMessage",
                       "ec2messages:FailMessage", "ec2messages:GetEndpoint",
                       "ec2messages:GetMessages", "ec2messages:SendReply"}
PARAMETER_READS = ("ssm:GetParameter", "ssm:GetParameters", "ssm:GetParametersByPath",
                   "ssm:GetParameterHistory")


@pytest.mark.parametrize("synth_fixture", ["default_synth", "variant_synth"])
def test_node_roles_reach_session_manager_but_read_only_their_own_parameter(request, synth_fixture):
    """The nodes run user containers on the host network: their role must not read the account's
    SSM parameters. Session Manager and Run Command get what AWS documents as their minimum;
    the one parameter a node reads is its group's boot-failure count."""
    synth = request.getfixturevalue(synth_fixture)
    stack = synth.stack_names[CLUSTER]
    roles = {lid: r for lid, r in synth.resources(CLUSTER, "AWS::IAM::Role").items()
             if lid.startswith(("ClusterMasterRole", "ClusterWorkerRole"))}
    assert len(roles) == 2
    for logical_id, role in roles.items():
        assert "ManagedPolicyArns" not in role["Properties"], logical_id
        granted = [s for p in synth.resources(CLUSTER, "AWS::IAM::Policy").values()
                   if {"Ref": logical_id} in p["Properties"]["Roles"]
                   for s in p["Properties"]["PolicyDocument"]["Statement"]]
        on_anything = {a for s in granted if s["Resource"] == "*" for a in actions(s)}
        assert SESSION_MANAGER_ACTIONS | RUN_COMMAND_ACTIONS <= on_anything, logical_id
        reads = [s for s in granted
                 if any(fnmatch.fnmatchcase(read, a) for a in actions(s) for read in PARAMETER_READS)]
        group = "master" if logical_id.startswith("ClusterMasterRole") else "worker"
        assert reads, logical_id
        for statement in reads:
            assert statement["Resource"] != "*" and "Condition" not in statement, statement
            arn = "".join(p if isinstance(p, str) else f"<{p['Ref']}>"
                          for p in statement["Resource"]["Fn::Join"][1])
            assert arn == (f"arn:<AWS::Partition>:ssm:<AWS::Region>:<AWS::AccountId>:parameter/"
                           f"maskrcnn/{stack}/boot-failures/{group}"), statement


def test_s3_access_is_scoped_to_the_data_bucket(default_synth):
    for stack in (CLUSTER, SAGEMAKER):
        for statement in statements(default_synth, stack):
            if statement.get("Sid") in (None, "FetchBootSteps") and \
                    actions(statement) == ["s3:GetObject"] and \
                    "cdk-hnb659fds-assets" in json.dumps(statement["Resource"]):
                continue   # one asset object: the notebook's project code, the nodes' boot steps
            if any(a.startswith("s3:") for a in actions(statement)):
                resources = statement["Resource"]
                resources = resources if isinstance(resources, list) else [resources]
                rendered = json.dumps(resources)
                assert "NetworkStorageStack-DataBucketArn" in rendered, statement
                assert '"*"' not in rendered


# --- EfsClusterStack ----------------------------------------------------------------------------

def test_offline_the_cluster_ami_is_the_deep_learning_ami_ssm_parameter(default_synth):
    """Without an account (no credentials) synth needs no lookup; with one the AMI is looked up
    once and kept: test_infra_ami.py."""
    template = default_synth.templates[CLUSTER]
    params = [p for p in template["Parameters"].values()
              if p["Type"] == "AWS::SSM::Parameter::Value<AWS::EC2::Image::Id>"]
    assert [p["Default"] for p in params] == [default_synth.context["dlami_ssm_parameter"]]
    assert "deeplearning" in params[0]["Default"]


def test_cluster_ami_can_be_pinned_and_the_ami_in_use_is_an_output(default_synth, variant_synth):
    """The ami_id setting replaces the parameter (offline) as it replaces the kept lookup
    (test_infra_ami.py)."""
    (parameter,) = [lid for lid, p in default_synth.templates[CLUSTER]["Parameters"].items()
                    if p["Type"] == "AWS::SSM::Parameter::Value<AWS::EC2::Image::Id>"]
    assert default_synth.templates[CLUSTER]["Outputs"][outputs.CLUSTER_AMI_ID]["Value"] == {
        "Ref": parameter}
    pinned = variant_synth.templates[CLUSTER]
    assert not [p for p in pinned.get("Parameters", {}).values()
                if p["Type"] == "AWS::SSM::Parameter::Value<AWS::EC2::Image::Id>"]
    assert pinned["Outputs"][outputs.CLUSTER_AMI_ID]["Value"] == VARIANT_CONTEXT["ami_id"]
    for lt in variant_synth.resources(CLUSTER, "AWS::EC2::LaunchTemplate").values():
        assert lt["Properties"]["LaunchTemplateData"]["ImageId"] == VARIANT_CONTEXT["ami_id"]


def test_groups_use_launch_templates_with_imdsv2_encrypted_gp3_and_placement(default_synth):
    template = default_synth.template(CLUSTER)
    template.resource_count_is("AWS::AutoScaling::LaunchConfiguration", 0)
    template.has_resource_properties("AWS::EC2::PlacementGroup", {"Strategy": "cluster"})
    launch_templates = default_synth.resources(CLUSTER, "AWS::EC2::LaunchTemplate")
    assert len(launch_templates) == 2
    for lt in launch_templates.values():
        data = lt["Properties"]["LaunchTemplateData"]
        assert data["MetadataOptions"]["HttpTokens"] == "required"
        assert data["InstanceType"] == default_synth.context["instance_type"]
        (device,) = data["BlockDeviceMappings"]
        assert device["Ebs"] == {"DeleteOnTermination": True, "Encrypted": True,
                                 "VolumeSize": default_synth.context["ebs_volume_size_gib"],
                                 "VolumeType": "gp3"}
        assert "GroupName" in data["Placement"]
        assert "KeyName" not in data
    for group in default_synth.resources(CLUSTER, "AWS::AutoScaling::AutoScalingGroup").values():
        assert "LaunchTemplate" in group["Properties"]
        assert "LaunchConfigurationName" not in group["Properties"]


def test_master_is_one_node_public_unless_multi_card_and_workers_are_private(default_synth,
                                                                             variant_synth):
    # The variant's p4d nodes have an EFA interface on each of 4 network cards: AWS gives such an
    # instance no public address, so its master runs in the private subnet too.
    for synth, workers, zone, master_subnet in ((default_synth, 1, 1, "Public"),
                                                (variant_synth, 3, 2, "Private")):
        groups = synth.resources(CLUSTER, "AWS::AutoScaling::AutoScalingGroup")
        by_name = {g["Properties"]["AutoScalingGroupName"]: g for g in groups.values()}
        master = by_name[f"{synth.stack_names[CLUSTER]}-master"]["Properties"]
        worker = by_name[f"{synth.stack_names[CLUSTER]}-worker"]["Properties"]
        # The configured sizes (MinSize and DesiredCapacity are the cost controls' business).
        assert (master["MaxSize"], worker["MaxSize"]) == ("1", str(workers))
        # One zone for both (cluster_availability_zone picks it: the second one in the variant)
        assert f"{master_subnet}Subnet{zone}" in import_of(master["VPCZoneIdentifier"][0])
        assert f"PrivateSubnet{zone}" in import_of(worker["VPCZoneIdentifier"][0])
    interfaces = {lid: lt["Properties"]["LaunchTemplateData"]["NetworkInterfaces"][0]
                  for lid, lt in default_synth.resources(CLUSTER, "AWS::EC2::LaunchTemplate").items()}
    assert {lid.startswith("ClusterMaster"): ni["AssociatePublicIpAddress"]
            for lid, ni in interfaces.items()} == {True: True, False: False}
    for lt in variant_synth.resources(CLUSTER, "AWS::EC2::LaunchTemplate").values():
        assert not [ni for ni in lt["Properties"]["LaunchTemplateData"]["NetworkInterfaces"]
                    if ni.get("AssociatePublicIpAddress")]


def test_no_ssh_ingress_by_default_nodes_talk_to_each_other(default_synth):
    rules = default_synth.resources(CLUSTER, "AWS::EC2::SecurityGroupIngress").values()
    assert not [r for r in rules if r["Properties"].get("FromPort") == 22]
    for group in default_synth.resources(CLUSTER, "AWS::EC2::SecurityGroup").values():
        assert "SecurityGroupIngress" not in group["Properties"]
    self_rules = [r["Properties"] for r in rules if r["Properties"]["IpProtocol"] == "-1"]
    assert len(self_rules) == 1
    assert self_rules[0]["GroupId"] == self_rules[0]["SourceSecurityGroupId"]


@pytest.mark.parametrize("stack, group_prefix", [(CLUSTER, "ClusterNodeSecurityGroup"),
                                                 (SAGEMAKER, "TrainingJobSecurityGroup")])
def test_efa_groups_allow_all_traffic_to_themselves_in_both_directions(default_synth, stack,
                                                                       group_prefix):
    """EFA is not IP traffic: an outbound 0.0.0.0/0 rule does not cover it; AWS requires an
    outbound rule to the group itself (and CDK drops egress rules on allow_all_outbound groups)."""
    (group_id,) = [lid for lid in default_synth.resources(stack, "AWS::EC2::SecurityGroup")
                   if lid.startswith(group_prefix)]
    to_self = [r["Properties"] for r in
               default_synth.resources(stack, "AWS::EC2::SecurityGroupEgress").values()
               if r["Properties"]["GroupId"] == {"Fn::GetAtt": [group_id, "GroupId"]}]
    assert [(r["IpProtocol"], r["DestinationSecurityGroupId"]) for r in to_self] == [
        ("-1", {"Fn::GetAtt": [group_id, "GroupId"]})]
    from_self = [r["Properties"] for r in
                 default_synth.resources(stack, "AWS::EC2::SecurityGroupIngress").values()
                 if r["Properties"]["GroupId"] == {"Fn::GetAtt": [group_id, "GroupId"]}
                 and r["Properties"]["IpProtocol"] == "-1"]
    assert [r["SourceSecurityGroupId"] for r in from_self] == [{"Fn::GetAtt": [group_id, "GroupId"]}]
    egress = default_synth.resources(stack, "AWS::EC2::SecurityGroup")[group_id][
        "Properties"]["SecurityGroupEgress"]
    assert [(r["CidrIp"], r["IpProtocol"]) for r in egress] == [("0.0.0.0/0", "-1")]


def test_ssh_only_from_the_configured_cidr_and_only_to_the_master(ssh_synth):
    groups = ssh_synth.resources(CLUSTER, "AWS::EC2::SecurityGroup")
    ssh = {lid: g for lid, g in groups.items() if "SecurityGroupIngress" in g["Properties"]}
    assert len(ssh) == 1
    (ssh_id, ssh_group), = ssh.items()
    assert ssh_group["Properties"]["SecurityGroupIngress"] == [{
        "CidrIp": SSH_CONTEXT["ssh_cidr"], "Description": "SSH from ssh_cidr",
        "FromPort": 22, "IpProtocol": "tcp", "ToPort": 22}]
    for lid, lt in ssh_synth.resources(CLUSTER, "AWS::EC2::LaunchTemplate").items():
        data = lt["Properties"]["LaunchTemplateData"]
        groups_of_lt = json.dumps(data["NetworkInterfaces"][0]["Groups"])
        assert (ssh_id in groups_of_lt) == lid.startswith("ClusterMaster")
        assert data["KeyName"] == SSH_CONTEXT["key_pair_name"]


def test_efa_interfaces_when_enabled(default_synth, variant_synth):
    # Per card and device index: test_infra_capacity.py.
    for lt in variant_synth.resources(CLUSTER, "AWS::EC2::LaunchTemplate").values():
        data = lt["Properties"]["LaunchTemplateData"]
        assert [ni["InterfaceType"] for ni in data["NetworkInterfaces"]] == ["efa"] * 4
        assert data["InstanceType"] == "p4d.24xlarge"
        assert data["BlockDeviceMappings"][0]["Ebs"]["VolumeSize"] == 500
    # The default type, g5.48xlarge, has one network card with EFA: EFA is on by default there.
    for lt in default_synth.resources(CLUSTER, "AWS::EC2::LaunchTemplate").values():
        (interface,) = lt["Properties"]["LaunchTemplateData"]["NetworkInterfaces"]
        assert (interface["InterfaceType"], interface["NetworkCardIndex"], interface["DeviceIndex"]) == (
            "efa", 0, 0)


@pytest.mark.parametrize("prefix, role", [("ClusterMaster", "master"), ("ClusterWorker", "worker")])
def test_user_data_writes_the_node_contract(default_synth, prefix, role):
    text = user_data(default_synth, CLUSTER, prefix)
    env_block = text.split("cat > /etc/maskrcnn/cluster.env <<'EOF'\n", 1)[1].split("\nEOF\n", 1)[0]
    env = dict(line.split("=", 1) for line in env_block.splitlines())
    assert {"STACK_NAME", "AWS_REGION", "ROLE", "FILE_SYSTEM_ID", "BUCKET_NAME",
            "TRAINING_IMAGE_URI", "MASTER_ASG_NAME", "WORKER_ASG_NAME", "MUNGE_KEY_SECRET_NAME",
            "EFS_MOUNT"} <= set(env)
    assert (env["ROLE"], env["EFS_MOUNT"]) == (role, "/efs")
    # No SSH between the nodes: jobs start their ranks through Slurm.
    assert not {"SSH_PORT", "CLUSTER_KEY_SECRET_ARN"} & set(env)
    assert env["NVME_MOUNT"] == "/opt/dlami/nvme"   # where the Deep Learning AMI mounts NVMe
    assert (env["MASTER_ASG_NAME"], env["WORKER_ASG_NAME"]) == (f"{CLUSTER}-master",
                                                                f"{CLUSTER}-worker")
    # The boot steps (infra/userdata/cluster_node.sh, fetched by the user data: see
    # test_infra_boot_failures.py) follow the environment.
    text = CLUSTER_NODE_SCRIPT.read_text()
    for fragment in ("aws ecr get-login-password", "docker login --username AWS",
                     "--name maskrcnn --restart unless-stopped", "--network host --ipc host",
                     '-v /etc/maskrcnn:/etc/maskrcnn:ro', "cluster-node", "nvidia-smi -L",
                     "/etc/maskrcnn/hostfile", "secretsmanager",
                     "nfsvers=4.1,rsize=1048576,wsize=1048576,hard,timeo=600,retrans=2",
                     "/etc/fstab", "/usr/local/bin/maskrcnn",
                     "maskrcnn-entrypoint maskrcnn", "MUNGE_KEY_SECRET_NAME", "/etc/maskrcnn/munge.key"):
        assert fragment in text, fragment
    assert "aws ecr get-login " not in text and "ForwardAgent" not in text


def test_nodes_may_mark_only_their_own_group_unhealthy(default_synth):
    """A replacement node's failed boot signal is ignored after creation: the node marks itself
    unhealthy so that its group replaces it."""
    for prefix, group in (("ClusterMasterRole", "master"), ("ClusterWorkerRole", "worker")):
        (statement,) = [s for s in policy_of(default_synth, CLUSTER, prefix)
                        if "autoscaling:SetInstanceHealth" in actions(s)]
        assert actions(statement) == ["autoscaling:SetInstanceHealth"]
        assert json.dumps(statement["Resource"]).endswith(
            f':autoScalingGroup:*:autoScalingGroupName/{CLUSTER}-{group}"]]}}')
    text = user_data(default_synth, CLUSTER, "ClusterWorker")
    assert ("aws autoscaling set-instance-health --instance-id \"$INSTANCE_ID\" "
            "--health-status Unhealthy" in text)


def test_group_launch_and_terminate_failures_are_notified(default_synth, variant_synth):
    (topic_id,) = default_synth.resources(SHARED, "AWS::SNS::Topic")
    for synth in (default_synth, variant_synth):
        for group in synth.resources(CLUSTER, "AWS::AutoScaling::AutoScalingGroup").values():
            (config,) = group["Properties"]["NotificationConfigurations"]
            assert sorted(config["NotificationTypes"]) == [
                "autoscaling:EC2_INSTANCE_LAUNCH_ERROR", "autoscaling:EC2_INSTANCE_TERMINATE_ERROR"]
            assert topic_id in import_of(config["TopicARN"])
    # TLS only, and an email subscription only when notification_email is set.
    (policy,) = default_synth.resources(SHARED, "AWS::SNS::TopicPolicy").values()
    topic_statements = policy["Properties"]["PolicyDocument"]["Statement"]
    assert any(s["Effect"] == "Deny" and s["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
               for s in topic_statements)
    # A topic policy replaces SNS's default one: the account's alarms need their own statement.
    (alarms,) = [s for s in topic_statements if s["Effect"] == "Allow"]
    assert alarms["Principal"] == {"Service": "cloudwatch.amazonaws.com"}
    assert alarms["Action"] == "sns:Publish"
    assert alarms["Condition"] == {"StringEquals": {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}}
    assert default_synth.resources(SHARED, "AWS::SNS::Subscription") == {}
    (subscription,) = variant_synth.resources(SHARED, "AWS::SNS::Subscription").values()
    assert (subscription["Properties"]["Protocol"], subscription["Properties"]["Endpoint"]) == (
        "email", VARIANT_CONTEXT["notification_email"])


def test_only_the_master_may_read_prices_for_a_run_s_cost_line(default_synth):
    (prices,) = [s for s in policy_of(default_synth, CLUSTER, "ClusterMasterRole")
                 if "pricing:GetProducts" in actions(s)]
    assert (actions(prices), prices["Resource"]) == (["pricing:GetProducts"], "*")
    assert not [s for s in policy_of(default_synth, CLUSTER, "ClusterWorkerRole")
                if any(a.startswith("pricing:") for a in actions(s))]


def test_master_may_attach_its_address_only_to_a_master_group_instance(default_synth):
    statements_ = [s for s in policy_of(default_synth, CLUSTER, "ClusterMasterRole")
                   if "ec2:AssociateAddress" in actions(s)]
    assert not [s for s in policy_of(default_synth, CLUSTER, "ClusterWorkerRole")
                if "ec2:AssociateAddress" in actions(s)]
    on_instances = [s for s in statements_ if ":instance/" in json.dumps(s["Resource"])]
    (statement,) = on_instances
    assert statement["Condition"] == {"StringEquals": {
        "aws:ResourceTag/aws:autoscaling:groupName": f"{CLUSTER}-master"}}
    assert ":instance/" not in json.dumps([s["Resource"] for s in statements_
                                           if s is not statement])


def test_name_prefix_separates_a_second_deployment(default_synth, variant_synth):
    """Two deployments in one account and region must not collide on stack, group, secret or
    export names."""
    assert default_synth.stack_names == {s: s for s in ALL_STACKS}
    assert variant_synth.stack_names == {s: f"team-a-{s}" for s in ALL_STACKS}
    cluster = variant_synth.templates[CLUSTER]
    names = {g["Properties"]["AutoScalingGroupName"]
             for g in variant_synth.resources(CLUSTER, "AWS::AutoScaling::AutoScalingGroup").values()}
    assert names == {f"team-a-{CLUSTER}-master", f"team-a-{CLUSTER}-worker"}
    named = {s["Properties"]["Name"]
             for s in variant_synth.resources(CLUSTER, "AWS::SecretsManager::Secret").values()}
    assert named == {f"team-a-{CLUSTER}-munge-key"}
    imports = re.findall(r'"Fn::ImportValue": "([^"]+)"', json.dumps(cluster))
    assert imports and all(name.startswith(f"team-a-{SHARED}") for name in imports)
    exports = [o["Export"]["Name"] for o in variant_synth.templates[SHARED]["Outputs"].values()
               if "Export" in o]
    assert exports and all(name.startswith(f"team-a-{SHARED}") for name in exports)


def test_every_node_may_read_the_munge_key_and_no_other_secret(default_synth):
    (name,) = {s["Properties"]["Name"]
               for s in default_synth.resources(CLUSTER, "AWS::SecretsManager::Secret").values()}
    assert name == f"{CLUSTER}-munge-key"
    for prefix in ("ClusterMasterRole", "ClusterWorkerRole"):
        policy = policy_of(default_synth, CLUSTER, prefix)
        (on_secret,) = [s for s in policy if any(a.startswith("secretsmanager:") for a in actions(s))]
        assert set(actions(on_secret)) == {"secretsmanager:GetSecretValue"}
        # Exactly this secret: its name plus the 6-character suffix Secrets Manager appends.
        assert json.dumps(on_secret["Resource"]).endswith(f':secret:{name}-??????"]]}}')


def test_cluster_outputs(default_synth, ssh_synth):
    expected = {outputs.MASTER_ADDRESS, outputs.CONNECT_COMMAND, outputs.MASTER_ASG_NAME,
                outputs.WORKER_ASG_NAME, outputs.FILE_SYSTEM_ID, outputs.BUCKET_NAME,
                outputs.TRAINING_IMAGE_URI, outputs.PRIVATE_SUBNET_IDS}
    default_outputs = default_synth.templates[CLUSTER]["Outputs"]
    assert expected <= set(default_outputs)
    assert "aws ssm start-session" in json.dumps(default_outputs[outputs.CONNECT_COMMAND])
    variant_connect = json.dumps(ssh_synth.templates[CLUSTER]["Outputs"][outputs.CONNECT_COMMAND])
    assert "ssh -i ~/.ssh/research-key.pem ubuntu@" in variant_connect
    assert "-A" not in variant_connect  # no agent forwarding
    subnets = default_outputs[outputs.PRIVATE_SUBNET_IDS]["Value"]["Fn::Join"]
    assert subnets[0] == "," and len(subnets[1]) == 2


# --- SageMakerStack -----------------------------------------------------------------------------

def test_notebook_is_private_encrypted_without_internet_or_root(default_synth):
    template = default_synth.template(SAGEMAKER)
    (notebook,) = default_synth.resources(SAGEMAKER, "AWS::SageMaker::NotebookInstance").values()
    props = notebook["Properties"]
    assert props["DirectInternetAccess"] == "Disabled"
    assert props["RootAccess"] == "Disabled"
    assert "PrivateSubnet1" in import_of(props["SubnetId"])
    assert props["KmsKeyId"] == {"Ref": next(iter(default_synth.resources(SAGEMAKER, "AWS::KMS::Key")))}
    assert props["InstanceType"] == default_synth.context["notebook_instance_type"]
    template.has_resource_properties("AWS::KMS::Key", {"EnableKeyRotation": True})


def test_notebook_starts_only_once_its_role_has_its_policies(default_synth):
    """CloudFormation orders resources by references and DependsOn only: the instance names its
    role (RoleArn), not the role's policy, so without DependsOn its first start (the lifecycle
    script downloads the project, mounts EFS) could run before the policy exists."""
    (notebook,) = default_synth.resources(SAGEMAKER, "AWS::SageMaker::NotebookInstance").values()
    role = notebook["Properties"]["RoleArn"]["Fn::GetAtt"][0]
    policies = [lid for lid, p in default_synth.resources(SAGEMAKER, "AWS::IAM::Policy").items()
                if {"Ref": role} in p["Properties"]["Roles"]
                and "StopThisNotebookWhenIdle" not in json.dumps(p)]   # that one names the instance
    assert policies
    assert set(policies) <= set(notebook.get("DependsOn", []))


def test_notebook_runs_amazon_linux_2023_with_imdsv2_only(default_synth):
    """SageMaker refuses to create or restart Amazon Linux 2 notebooks since 2026-07-01."""
    (notebook,) = default_synth.resources(SAGEMAKER, "AWS::SageMaker::NotebookInstance").values()
    props = notebook["Properties"]
    assert props["PlatformIdentifier"] == "notebook-al2023-v1"
    assert props["InstanceMetadataServiceConfiguration"] == {
        "MinimumInstanceMetadataServiceVersion": "2"}


def test_notebook_lifecycle_config_mounts_efs_at_home_efs(default_synth):
    (config,) = default_synth.resources(SAGEMAKER,
                                        "AWS::SageMaker::NotebookInstanceLifecycleConfig").values()
    parts = config["Properties"]["OnStart"][0]["Content"]["Fn::Base64"]["Fn::Join"][1]
    script = "".join(p if isinstance(p, str) else "<value>" for p in parts)
    assert "export FILE_SYSTEM_ID=<value>" in script
    assert "MOUNT=/home/ec2-user/efs" in script and "mount -t nfs4" in script
    (id_parameter,) = [lid for lid, p in default_synth.templates[SAGEMAKER]["Parameters"].items()
                       if p["Default"] == f"/maskrcnn/{SHARED}/file-system-id"]
    assert {"Ref": id_parameter} in parts


def test_notebook_gets_the_project_code_and_may_read_only_that_object(default_synth):
    """The notebook opens ready to use: its lifecycle script unpacks the project (code, docs,
    walkthrough notebook) from a CDK asset into the Jupyter root."""
    from infra.constructs.project_code import KEEP

    manifest = json.loads((default_synth.outdir / f"{SAGEMAKER}.assets.json").read_text())
    (asset,) = [f for f in manifest["files"].values() if f["source"]["packaging"] == "zip"]
    staged = default_synth.outdir / asset["source"]["path"]
    assert (staged / "notebooks" / "sagemaker_training.ipynb").exists()
    assert (staged / "launch").is_dir() and (staged / "infra" / "outputs.py").exists()
    assert {p.name for p in staged.iterdir()} == {k.split("/")[0] for k in KEEP}
    assert not list(staged.rglob("__pycache__"))
    (key,) = {d["objectKey"] for d in asset["destinations"].values()}
    reads = [s for s in policy_of(default_synth, SAGEMAKER, "NotebookRole")
             if "cdk-hnb659fds-assets" in json.dumps(s["Resource"])]
    assert [actions(s) for s in reads] == [["s3:GetObject"]]
    assert json.dumps(reads[0]["Resource"]).endswith(f'/{key}"]]}}')
    (config,) = default_synth.resources(SAGEMAKER,
                                        "AWS::SageMaker::NotebookInstanceLifecycleConfig").values()
    parts = config["Properties"]["OnStart"][0]["Content"]["Fn::Base64"]["Fn::Join"][1]
    url = parts[parts.index("\nexport PROJECT_CODE_URL=") + 1]["Fn::Sub"]
    assert url.startswith("s3://cdk-hnb659fds-assets-") and url.endswith(f"/{key}")


def test_training_security_group_allows_its_own_instances_only(default_synth):
    rules = [r["Properties"] for r in
             default_synth.resources(SAGEMAKER, "AWS::EC2::SecurityGroupIngress").values()]
    all_traffic = [r for r in rules if r["IpProtocol"] == "-1"]
    assert len(all_traffic) == 1 and all_traffic[0]["GroupId"] == all_traffic[0]["SourceSecurityGroupId"]
    for group in default_synth.resources(SAGEMAKER, "AWS::EC2::SecurityGroup").values():
        assert "SecurityGroupIngress" not in group["Properties"]


def test_notebook_may_run_training_jobs_and_pass_only_the_training_role(default_synth):
    policy = policy_of(default_synth, SAGEMAKER, "NotebookRole")
    all_actions = {a for s in policy for a in actions(s)}
    assert {"sagemaker:CreateTrainingJob", "sagemaker:DescribeTrainingJob",
            "sagemaker:StopTrainingJob", "sagemaker:ListTrainingJobs", "sagemaker:Search",
            "cloudformation:DescribeStacks", "iam:PassRole"} <= all_actions
    (prices,) = [s for s in policy if "pricing:GetProducts" in actions(s)]
    assert (actions(prices), prices["Resource"]) == (["pricing:GetProducts"], "*")
    (pass_role,) = [s for s in policy if "iam:PassRole" in actions(s)]
    training_role = next(lid for lid in default_synth.resources(SAGEMAKER, "AWS::IAM::Role")
                         if lid.startswith("TrainingJobRole"))
    assert pass_role["Resource"] == {"Fn::GetAtt": [training_role, "Arn"]}
    assert pass_role["Condition"] == {
        "StringEquals": {"iam:PassedToService": "sagemaker.amazonaws.com"}}
    (describe,) = [s for s in policy if "cloudformation:DescribeStacks" in actions(s)]
    assert describe["Resource"] == {"Ref": "AWS::StackId"}
    assert not [a for a in all_actions if a.startswith(("ec2:", "ecr:"))]


def test_notebook_may_create_training_jobs_only_in_the_stack_subnets_and_group(default_synth):
    policy = policy_of(default_synth, SAGEMAKER, "NotebookRole")
    (create,) = [s for s in policy if "sagemaker:CreateTrainingJob" in actions(s)]
    assert actions(create) == ["sagemaker:CreateTrainingJob"]
    (group_id,) = [lid for lid in default_synth.resources(SAGEMAKER, "AWS::EC2::SecurityGroup")
                   if lid.startswith("TrainingJobSecurityGroup")]
    allowed = create["Condition"]["ForAllValues:StringEquals"]
    assert allowed["sagemaker:VpcSecurityGroupIds"] == [{"Fn::GetAtt": [group_id, "GroupId"]}]
    subnets = [import_of(s) for s in allowed["sagemaker:VpcSubnets"]]
    assert len(subnets) == 2 and all("PrivateSubnet" in s for s in subnets)
    # Without a VPC config the keys are absent, and ForAllValues alone would allow it.
    assert create["Condition"]["Null"] == {"sagemaker:VpcSubnets": "false",
                                           "sagemaker:VpcSecurityGroupIds": "false"}


def test_training_role_pulls_the_image_reads_data_and_places_jobs_in_the_vpc(default_synth):
    policy = policy_of(default_synth, SAGEMAKER, "TrainingJobRole")
    by_sid = {s.get("Sid"): s for s in policy}
    assert by_sid["ManageJobNetworkInterfaces"]["Condition"]["ArnEquals"]["ec2:Vpc"]
    ecr = [s for s in policy if any(a.startswith("ecr:Batch") for a in actions(s))]
    assert ecr and all("container-assets" in json.dumps(s["Resource"]) for s in ecr)
    efs = [s for s in policy if "elasticfilesystem:ClientMount" in actions(s)]
    assert efs and ":file-system/" in json.dumps(efs[0]["Resource"])
    metrics = by_sid["WriteJobMetrics"]
    assert metrics["Condition"] == {"StringEquals": {"cloudwatch:namespace":
                                                     "/aws/sagemaker/TrainingJobs"}}


def test_sagemaker_outputs(default_synth):
    names = set(default_synth.templates[SAGEMAKER]["Outputs"])
    assert {outputs.FILE_SYSTEM_ID, outputs.BUCKET_NAME, outputs.TRAINING_IMAGE_URI,
            outputs.PRIVATE_SUBNET_IDS, outputs.TRAINING_SECURITY_GROUP_ID,
            outputs.TRAINING_ROLE_ARN, outputs.NOTEBOOK_ROLE_ARN, outputs.NOTEBOOK_NAME} <= names


def test_stacks_depend_only_on_the_shared_stack(default_synth):
    manifest = json.loads((default_synth.outdir / "manifest.json").read_text())
    deps = {name: [d for d in art.get("dependencies", []) if not d.endswith(".assets")]
            for name, art in manifest["artifacts"].items()
            if art["type"] == "aws:cloudformation:stack"}
    assert deps == {SHARED: [], CLUSTER: [SHARED], SAGEMAKER: [SHARED]}
    for name in ALL_STACKS:   # stack tags, which CloudFormation copies to every resource
        assert manifest["artifacts"][name]["properties"]["tags"] == {"project": "maskrcnn-on-aws"}
    assert not re.search(r"ImportValue\W+(EfsCluster|SageMaker)Stack",
                         json.dumps(default_synth.templates[SHARED]))
