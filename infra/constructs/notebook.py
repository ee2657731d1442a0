"""The SageMaker notebook from which users stage data and launch training jobs: private subnet,
no direct internet access, KMS-encrypted volume, no root access, EFS mounted at ~/efs, and a stop
after notebook_idle_minutes without activity."""
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
from infra.userdata import NOTEBOOK_ON_START_SCRIPT, USERDATA_DIR, script_body

# Amazon Linux 2023 (JupyterLab 4). SageMaker stopped creating and restarting Amazon Linux 2
# notebooks (notebook-al2-*) on 2026-07-01. The lifecycle script relies only on what AL2023 keeps:
# the ec2-user account, /home/ec2-user, and the NFS client (mount -t nfs4).
NOTEBOOK_PLATFORM = "notebook-al2023-v1"
_IMDS_V2_ONLY = sagemaker.CfnNotebookInstance.InstanceMetadataServiceConfigurationProperty(
    minimum_instance_metadata_service_version="2")
# The idle check the on-start script installs (docs/infra.md, "Notebook auto-stop").
IDLE_STOP_SCRIPT = USERDATA_DIR / "notebook_idle_stop.py"
_IDLE_STOP_END = "IDLE_STOP_PY"


def on_start_script(*, file_system_id: str, region: str, project_code_url: str, stack_name: str,
                    idle_minutes: int) -> list[str]:
    """The on-start lifecycle script, as the parts of an Fn::Join (the first four arguments may
    be tokens): the settings, the idle check's source unless `idle_minutes` is 0, then
    notebook_on_start.sh."""
    parts = ["#!/bin/bash\n",
             "export FILE_SYSTEM_ID=", file_system_id, "\n",
             "export AWS_REGION=", region, "\n",
             "export STACK_NAME=", stack_name, "\n",
             "export PROJECT_CODE_URL=", project_code_url, "\n",
             f"export NOTEBOOK_IDLE_MINUTES={idle_minutes}\n"]
    if idle_minutes:
        # Inline: the project's copy in the Jupyter root is the user's to edit, and the check
        # must run as deployed.
        source = IDLE_STOP_SCRIPT.read_text()
        if f"\n{_IDLE_STOP_END}\n" in source:
            raise ValueError(f"{IDLE_STOP_SCRIPT.name} contains the here-document's end line")
        parts.append(f"IFS= read -r -d '' IDLE_STOP_SOURCE <<'{_IDLE_STOP_END}' || true\n"
                     f"{source}{_IDLE_STOP_END}\n")
    return parts + [script_body(NOTEBOOK_ON_START_SCRIPT)]


# What the notebook may create to serve a model (launch/sagemaker/endpoint.py).
SERVING_RESOURCES = ("model", "endpoint-config", "endpoint", "transform-job")

class Notebook(Construct):
    """A notebook instance whose role may run training jobs with `training_role` and nothing
    broader: create training jobs only in `training_subnets` with `training_security_group`,
    describe, stop and list them, read their logs, read this stack's outputs, and pass only the
    training role, only to SageMaker; and, with the idle stop, describe and stop itself."""

    def __init__(self, scope: Construct, id: str, *, vpc: ec2.IVpc, subnet: ec2.ISubnet,
                 instance_type: str, volume_size_gib: int, file_system_id: str,
                 training_role: iam.IRole, training_subnets: list[ec2.ISubnet],
                 training_security_group: ec2.ISecurityGroup, idle_minutes: int) -> None:
        """The lifecycle script mounts EFS at ~/efs (linked as `efs` in the Jupyter root),
        unpacks the project (code, docs, walkthrough notebook) into ~/SageMaker/maskrcnn-on-aws
        on the first start and, unless `idle_minutes` is 0, has the notebook stop itself after
        that many minutes without kernel or terminal activity."""
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
        # Serving a trained model (launch/sagemaker/endpoint.py): a model runs as the training role,
        # the only role the notebook may pass.
        serving_arns = [stack.format_arn(service="sagemaker", resource=kind, resource_name="*")
                        for kind in SERVING_RESOURCES]
        self.role.add_to_policy(iam.PolicyStatement(
            sid="ServeModels",
            actions=["sagemaker:CreateModel", "sagemaker:DescribeModel", "sagemaker:DeleteModel",
                     "sagemaker:CreateEndpointConfig", "sagemaker:DescribeEndpointConfig",
                     "sagemaker:DeleteEndpointConfig", "sagemaker:CreateEndpoint", "sagemaker:DescribeEndpoint",
                     "sagemaker:DeleteEndpoint", "sagemaker:InvokeEndpoint", "sagemaker:CreateTransformJob",
                     "sagemaker:DescribeTransformJob", "sagemaker:StopTransformJob", "sagemaker:AddTags"],
            resources=serving_arns))
        self.role.add_to_policy(iam.PolicyStatement(
            # Search: whether a run name is taken (launch/sagemaker/launcher.py finds a run's jobs by tag).
            sid="ListTrainingJobs", actions=["sagemaker:ListTrainingJobs", "sagemaker:Search"], resources=["*"]))
        self.role.add_to_policy(iam.PolicyStatement(
            # A finished job's cost line prices an ml.* type infra/instance_types.py has no price for
            # from AWS's public Price List (launch/price_list.py).
            sid="ReadPrices", actions=["pricing:GetProducts"], resources=["*"]))
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
            "Only sagemaker:ListTrainingJobs, sagemaker:Search and pricing:GetProducts (AWS's public "
            "prices), which have no resource-level scoping.")
        acknowledge(
            self.role, "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:sagemaker:"
                       "<AWS::Region>:<AWS::AccountId>:training-job/*]",
            "The notebook creates training jobs whose names are chosen at launch; it can pass "
            "them only the training role.")
        for kind in SERVING_RESOURCES:
            acknowledge(
                self.role, f"AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:sagemaker:<AWS::Region>:"
                           f"<AWS::AccountId>:{kind}/*]",
                "The notebook deploys trained models as endpoints and batch transform jobs named at "
                "launch; they run as the training role, the only role it may pass.")
        acknowledge(
            self.role, "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:logs:<AWS::Region>:"
                       "<AWS::AccountId>:log-group:/aws/sagemaker/TrainingJobs:log-stream:*]",
            "Reads the log streams of its training jobs (named after each job) in SageMaker's "
            "fixed training-jobs log group.")

        self.project_code = ProjectCode(self, "ProjectCode")
        self.project_code.grant_download(self.role)
        on_start = Fn.join("", on_start_script(
            file_system_id=file_system_id, region=Aws.REGION, stack_name=Aws.STACK_NAME,
            project_code_url=self.project_code.s3_url, idle_minutes=idle_minutes))
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
        # The instance's first start runs the lifecycle script with the role's permissions
        # (download the project, mount EFS): CloudFormation must create the role's policy
        # first. The role ARN orders the instance after the role, not after its policy. Every
        # statement added to the role (here and by the stack's grants) lands in its default
        # policy; the idle stop's policy names the instance, so it cannot come first.
        self.instance.node.add_dependency(self.role.node.find_child("DefaultPolicy"))
        self.notebook_name: str = self.instance.attr_notebook_instance_name

        if idle_minutes:
            # The idle check stops this notebook and no other. The ARN as SageMaker reports it
            # (Ref): SageMaker may write the name in lower case there, which an ARN built from
            # the name would not match. A policy of its own: the default one must not wait for
            # the instance, whose first start downloads the project with it.
            notebook_arn = self.instance.notebook_instance_ref.notebook_instance_arn
            iam.Policy(self, "IdleStopPolicy", roles=[self.role], statements=[
                iam.PolicyStatement(
                    sid="StopThisNotebookWhenIdle",
                    actions=["sagemaker:DescribeNotebookInstance",
                             "sagemaker:StopNotebookInstance"],
                    resources=[notebook_arn])])
