"""Each synthesized template, created with CloudFormation's create_stack in a moto server on
127.0.0.1, reaches CREATE_COMPLETE: the shared stack first, then the two stacks that import its
exports, as `cdk deploy` orders them."""
from __future__ import annotations

import json

import boto3
import pytest

from infra import outputs

from cdk_synth import deploy_to_moto, prepare_moto_account


@pytest.mark.slow
@pytest.mark.parametrize("synth_fixture", ["default_synth", "variant_synth"])
def test_all_stacks_reach_create_complete_in_moto(request, aws_env, synth_fixture):
    synth = request.getfixturevalue(synth_fixture)
    image_id = prepare_moto_account()
    text = json.dumps(synth.templates)
    if synth.context.get("existing_file_system_id"):
        # The file system the user names must exist (moto assigns its own id: use that one).
        fs_id = boto3.client("efs").create_file_system(CreationToken="existing")["FileSystemId"]
        text = text.replace(synth.context["existing_file_system_id"], fs_id)
    if synth.context.get("ami_id"):
        text = text.replace(synth.context["ami_id"], image_id)   # a pinned AMI moto knows
    templates = json.loads(text)
    cloudformation = boto3.client("cloudformation")

    created = {}
    for name in (outputs.NETWORK_STORAGE_STACK, outputs.EFS_CLUSTER_STACK,
                 outputs.SAGEMAKER_STACK):
        # With name_prefix the CloudFormation names differ from the ids `cdk deploy` takes.
        stack = deploy_to_moto(cloudformation, synth.stack_names[name], templates[name])
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
    # Created without DesiredCapacity: "If you do not specify a desired capacity, the default is
    # the minimum size of the group" (0); `maskrcnn cluster resume` starts them.
    sizes = {g["AutoScalingGroupName"]: (g["DesiredCapacity"], g["MinSize"], g["MaxSize"]) for g in groups}
    assert sizes == {cluster[outputs.MASTER_ASG_NAME]: (0, 0, 1),
                     cluster[outputs.WORKER_ASG_NAME]: (0, 0, int(synth.context["worker_count"]))}

    notebook = boto3.client("sagemaker").describe_notebook_instance(
        NotebookInstanceName=sagemaker[outputs.NOTEBOOK_NAME])
    # moto's CloudFormation keeps only a notebook's type and role (the template assertions in
    # test_infra_stacks.py cover its network and encryption settings).
    assert notebook["RoleArn"] == sagemaker[outputs.NOTEBOOK_ROLE_ARN]
    assert notebook["InstanceType"] == synth.context["notebook_instance_type"]
    roles = {r["Arn"] for r in boto3.client("iam").list_roles()["Roles"]}
    assert sagemaker[outputs.TRAINING_ROLE_ARN] in roles
