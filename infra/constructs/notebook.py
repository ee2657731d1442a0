"""The SageMaker notebook from which users stage data and launch training jobs: private subnet,
no direct internet access, KMS-encrypted volume, no root access, EFS mounted at ~/efs."""
from __future__ import annotations

from aws_cdk import Aws, ArnFormat, Duration, Fn, RemovalPolicy, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sagemaker as sagemaker
from constructs import Construct

from infra.constructs.acknowledge import acknowledge
from infra.constructs.project_code import ProjectCode
from infra.constructs.training_job import TRAINING_LOG_GROUP
from infra.userdata import NOTEBOOK_ON_START_SCRIPT, script_body

# Amazon Linux 2023 (JupyterLab 4). SageMaker stopped creating and restarting Amazon Linux 2
# notebooks (notebook-al2-*) on 2026-07-01. The lifecycle script relies only on what AL2023 keeps:
# the ec2-user account, /home/ec2-user, and the NFS client (mount -t nfs4).
NOTEBOOK_PLATFORM = "notebook-al2023-v1"
_IMDS_V2_ONLY = sagemaker.CfnNotebookInstance.InstanceMetadataServiceConfigurationProperty(
    minimum_instance_metadata_service_version="2")


class Notebook(Construct):
    """A notebook instance whose role may run training jobs with `training_role` and nothing
    broader: create training jobs only in `training_subnets` with `training_security_group`,
    describe, stop and list them, read their logs, read this stack's outputs, and pass only the
    training role, only to SageMaker."""

    def __init__(self, scope: Construct, id: str, *, vpc: ec2.IVpc, subnet: ec2.ISubnet,
                 instance_type: str, volume_size_gib: int, file_system_id: str,
                 training_role: iam.IRole, training_subnets: list[ec2.ISubnet],
                 training_security_group: ec2.ISecurityGroup) -> None:
        """The lifecycle script mounts EFS at ~/efs (linked as `efs` in the Jupyter root) and
        unpacks the project (code, docs, walkthrough notebook) into ~/SageMaker/maskrcnn-on-aws
        on the first start."""
        super().__init__(scope, id)
        stack = Stack.of(self)

        self.security_group = ec2.SecurityGroup(
            self, "SecurityGroup", vpc=vpc, allow_all_outbound=True,
            description="SageMaker notebook: no inbound; outbound for EFS, S3 and AWS APIs")
        self.volume_key = kms.Key(
            self, "VolumeKey", enable_key_rotation=True,
            description="Encrypts the SageMaker notebook's storage volume",
            # The volume goes with the notebook; a retained key would only cost money.
            removal_policy=RemovalPolicy.DESTROY, pending_window=Duration.days(7))

        self.role = iam.Role(
            self, "Role", description="Execution role of the Mask R-CNN SageMaker notebook",
            assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com"))
        training_job_arn = stack.format_arn(service="sagemaker", resource="training-job",
                                            resource_name="*")
        # Jobs only in this stack's private subnets with its training group: a job outside them
        # (or with no VPC) would not reach the EFS and would bypass the network controls. The
        # Null condition makes the VPC mandatory (ForAllValues alone holds for a missing key).
        self.role.add_to_policy(iam.PolicyStatement(
            sid="CreateTrainingJobsInTheStackVpc", actions=["sagemaker:CreateTrainingJob"],
            resources=[training_job_arn],
            conditions={
                "ForAllValues:StringEquals": {
                    "sagemaker:VpcSubnets": [s.subnet_id for s in training_subnets],
                    "sagemaker:VpcSecurityGroupIds": [training_security_group.security_group_id],
                },
                "Null": {"sagemaker:VpcSubnets": "false",
                         "sagemaker:VpcSecurityGroupIds": "false"},
            }))
        self.role.add_to_policy(iam.PolicyStatement(
            sid="ManageTrainingJobs",
            actions=["sagemaker:DescribeTrainingJob", "sagemaker:StopTrainingJob",
                     "sagemaker:AddTags"],
            resources=[training_job_arn]))
        self.role.add_to_policy(iam.PolicyStatement(
            sid="ListTrainingJobs", actions=["sagemaker:ListTrainingJobs"], resources=["*"]))
        self.role.add_to_policy(iam.PolicyStatement(
            sid="PassOnlyTheTrainingRole", actions=["iam:PassRole"],
            resources=[training_role.role_arn],
            conditions={"StringEquals": {"iam:PassedToService": "sagemaker.amazonaws.com"}}))
        log_group_arn = stack.format_arn(
            service="logs", resource="log-group", resource_name=TRAINING_LOG_GROUP,
            arn_format=ArnFormat.COLON_RESOURCE_NAME)
        self.role.add_to_policy(iam.PolicyStatement(
            sid="ReadTrainingLogs",
            actions=["logs:DescribeLogStreams", "logs:GetLogEvents", "logs:FilterLogEvents"],
            resources=[log_group_arn, f"{log_group_arn}:log-stream:*"]))
        self.role.add_to_policy(iam.PolicyStatement(
            sid="ReadOwnStackOutputs", actions=["cloudformation:DescribeStacks"],
            resources=[Aws.STACK_ID]))
        acknowledge(
            self.role, "AwsSolutions-IAM5[Resource::*]",
            "Only sagemaker:ListTrainingJobs, which has no resource-level scoping.")
        acknowledge(
            self.role, "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:sagemaker:"
                       "<AWS::Region>:<AWS::AccountId>:training-job/*]",
            "The notebook creates training jobs whose names are chosen at launch; it can pass "
            "them only the training role.")
        acknowledge(
            self.role, "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:logs:<AWS::Region>:"
                       "<AWS::AccountId>:log-group:/aws/sagemaker/TrainingJobs:log-stream:*]",
            "Reads the log streams of its training jobs (named after each job) in SageMaker's "
            "fixed training-jobs log group.")

        self.project_code = ProjectCode(self, "ProjectCode")
        self.project_code.grant_download(self.role)
        on_start = Fn.join("", [
            "#!/bin/bash\n",
            "export FILE_SYSTEM_ID=", file_system_id, "\n",
            "export AWS_REGION=", Aws.REGION, "\n",
            "export PROJECT_CODE_URL=", self.project_code.s3_url, "\n",
            script_body(NOTEBOOK_ON_START_SCRIPT),
        ])
        self.lifecycle_config = sagemaker.CfnNotebookInstanceLifecycleConfig(
            self, "LifecycleConfig",
            on_start=[sagemaker.CfnNotebookInstanceLifecycleConfig.
                      NotebookInstanceLifecycleHookProperty(content=Fn.base64(on_start))])
        self.instance = sagemaker.CfnNotebookInstance(
            self, "Instance",
            instance_type=instance_type,
            role_arn=self.role.role_arn,
            subnet_id=subnet.subnet_id,
            security_group_ids=[self.security_group.security_group_id],
            direct_internet_access="Disabled",
            root_access="Disabled",
            kms_key_id=self.volume_key.key_id,
            volume_size_in_gb=volume_size_gib,
            lifecycle_config_name=(
                self.lifecycle_config.attr_notebook_instance_lifecycle_config_name),
            platform_identifier=NOTEBOOK_PLATFORM,
            # The notebook's credentials come from its metadata service: no IMDSv1 requests.
            instance_metadata_service_configuration=_IMDS_V2_ONLY,
        )
        self.notebook_name: str = self.instance.attr_notebook_instance_name

