"""Each synthesized template, created with CloudFormation's create_stack in a moto server on
127.0.0.1, reaches CREATE_COMPLETE: the shared stack first, then the two stacks that import its
exports, as `cdk deploy` orders them."""
from __future__ import annotations

import json

import boto3
import pytest

from infra import outputs

BOOTSTRAP_VERSION_PARAMETER = "/cdk-bootstrap/hnb659fds/version"
# moto reserves /aws/service/ (AWS's public parameters) and does not hold the Deep Learning AMI's,
# and it resolves a parameter's Default even when a value is passed: so the AMI parameter's
# Default is pointed at a stand-in that holds an image moto knows. Nothing else is changed.
AMI_PARAMETER_STAND_IN = "/maskrcnn-tests/deep-learning-ami-id"
AMI_PARAMETER_TYPE = "AWS::SSM::Parameter::Value<AWS::EC2::Image::Id>"


def _deploy(cloudformation, name: str, template: dict) -> dict:
    template = json.loads(json.dumps(template))
    for spec in template.get("Parameters", {}).values():
        if spec["Type"] == AMI_PARAMETER_TYPE:
            assert spec["Default"].startswith("/aws/service/deeplearning/")
            spec["Default"] = AMI_PARAMETER_STAND_IN
    cloudformation.create_stack(StackName=name, TemplateBody=json.dumps(template),
                                Capabilities=["CAPABILITY_IAM", "CAPABILITY_NAMED_IAM"])
    (stack,) = cloudformation.describe_stacks(StackName=name)["Stacks"]
    return stack


def _prepare_account() -> None:
    """What a bootstrapped account has: the CDK bootstrap version, and an AMI parameter."""
    ssm = boto3.client("ssm")
    ssm.put_parameter(Name=BOOTSTRAP_VERSION_PARAMETER, Value="30", Type="String")
    image_id = boto3.client("ec2").describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    ssm.put_parameter(Name=AMI_PARAMETER_STAND_IN, Value=image_id, Type="String")


@pytest.mark.slow
@pytest.mark.parametrize("synth_fixture", ["default_synth", "variant_synth"])
def test_all_stacks_reach_create_complete_in_moto(request, aws_env, synth_fixture):
    synth = request.getfixturevalue(synth_fixture)
    _prepare_account()
    if synth.context.get("existing_file_system_id"):
        # The file system the user names must exist (moto assigns its own id: use that one).
        fs_id = boto3.client("efs").create_file_system(CreationToken="existing")["FileSystemId"]
        templates = json.loads(json.dumps(synth.templates).replace(
            synth.context["existing_file_system_id"], fs_id))
    else:
        templates = synth.templates
    cloudformation = boto3.client("cloudformation")

    created = {}
    for name in (outputs.NETWORK_STORAGE_STACK, outputs.EFS_CLUSTER_STACK,
                 outputs.SAGEMAKER_STACK):
        stack = _deploy(cloudformation, name, templates[name])
        assert stack["StackStatus"] == "CREATE_COMPLETE", (name, stack.get("StackStatusReason"))
        created[name] = {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}

    # The outputs a launcher reads resolve to the resources that were created.
    cluster = created[outputs.EFS_CLUSTER_STACK]
    sagemaker = created[outputs.SAGEMAKER_STACK]
    file_systems = {fs["FileSystemId"] for fs in
                    boto3.client("efs").describe_file_systems()["FileSystems"]}
    assert cluster[outputs.FILE_SYSTEM_ID] == sagemaker[outputs.FILE_SYSTEM_ID]
    assert cluster[outputs.FILE_SYSTEM_ID] in file_systems
    buckets = {b["Name"] for b in boto3.client("s3").list_buckets()["Buckets"]}
    assert sagemaker[outputs.BUCKET_NAME] in buckets
    subnets = sagemaker[outputs.PRIVATE_SUBNET_IDS].split(",")
    described = boto3.client("ec2").describe_subnets(SubnetIds=subnets)["Subnets"]
    assert len(described) == 2 and not any(s["MapPublicIpOnLaunch"] for s in described)

    groups = boto3.client("autoscaling").describe_auto_scaling_groups(
        AutoScalingGroupNames=[cluster[outputs.MASTER_ASG_NAME],
                               cluster[outputs.WORKER_ASG_NAME]])["AutoScalingGroups"]
    sizes = {g["AutoScalingGroupName"]: g["DesiredCapacity"] for g in groups}
    assert sizes == {cluster[outputs.MASTER_ASG_NAME]: 1,
                     cluster[outputs.WORKER_ASG_NAME]: int(synth.context["worker_count"])}

    notebook = boto3.client("sagemaker").describe_notebook_instance(
        NotebookInstanceName=sagemaker[outputs.NOTEBOOK_NAME])
    # moto's CloudFormation keeps only a notebook's type and role (the template assertions in
    # test_infra_stacks.py cover its network and encryption settings).
    assert notebook["RoleArn"] == sagemaker[outputs.NOTEBOOK_ROLE_ARN]
    assert notebook["InstanceType"] == synth.context["notebook_instance_type"]
    roles = {r["Arn"] for r in boto3.client("iam").list_roles()["Roles"]}
    assert sagemaker[outputs.TRAINING_ROLE_ARN] in roles
