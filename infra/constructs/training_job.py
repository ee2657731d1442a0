"""What a SageMaker training job runs with: its security group and its execution role."""
from __future__ import annotations

from aws_cdk import ArnFormat, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from constructs import Construct

from infra.constructs.acknowledge import acknowledge
from infra.constructs.network import allow_all_traffic_within

TRAINING_LOG_GROUP = "/aws/sagemaker/TrainingJobs"
ENDPOINT_LOG_GROUP_PATTERN = "/aws/sagemaker/Endpoints/*"     # one group per endpoint
TRANSFORM_LOG_GROUP = "/aws/sagemaker/TransformJobs"
TRAINING_METRICS_NAMESPACE = "/aws/sagemaker/TrainingJobs"


class TrainingJobAccess(Construct):
    """The security group admits all traffic among a job's own instances (MPI, NCCL) and nothing
    else; outbound traffic is open for ECR, S3 and CloudWatch. The role is what the notebook may
    pass to SageMaker, and the only role it may pass."""

    def __init__(self, scope: Construct, id: str, *, vpc: ec2.IVpc,
                 private_subnets: list[ec2.ISubnet]) -> None:
        super().__init__(scope, id)
        stack = Stack.of(self)
        self.security_group = ec2.SecurityGroup(
            self, "SecurityGroup", vpc=vpc,
            allow_all_outbound=True,   # AWS APIs, ECR, S3; the group itself: see below
            description="SageMaker training jobs: all traffic among the instances of a job")
        allow_all_traffic_within(self.security_group,
                                 "the instances of a training job (MPI, NCCL, EFA)")

        self.role = iam.Role(
            self, "Role", description="Execution role of the Mask R-CNN SageMaker training jobs",
            assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com"))

        # What SageMaker does on the job's behalf to place it in this VPC.
        self.role.add_to_policy(iam.PolicyStatement(
            sid="DescribeNetwork",
            actions=["ec2:DescribeNetworkInterfaces", "ec2:DescribeVpcs",
                     "ec2:DescribeDhcpOptions", "ec2:DescribeSubnets",
                     "ec2:DescribeSecurityGroups"],
            resources=["*"]))
        self.role.add_to_policy(iam.PolicyStatement(
            sid="ManageJobNetworkInterfaces",
            actions=["ec2:CreateNetworkInterface", "ec2:CreateNetworkInterfacePermission",
                     "ec2:DeleteNetworkInterface", "ec2:DeleteNetworkInterfacePermission"],
            resources=[
                stack.format_arn(service="ec2", resource="network-interface", resource_name="*"),
                *(stack.format_arn(service="ec2", resource="subnet", resource_name=s.subnet_id)
                  for s in private_subnets),
                stack.format_arn(service="ec2", resource="security-group",
                                 resource_name=self.security_group.security_group_id),
            ],
            # Only network interfaces in this VPC.
            conditions={"ArnEquals": {"ec2:Vpc": stack.format_arn(
                service="ec2", resource="vpc", resource_name=vpc.vpc_id)}}))
        log_group_arn = stack.format_arn(
            service="logs", resource="log-group", resource_name=TRAINING_LOG_GROUP,
            arn_format=ArnFormat.COLON_RESOURCE_NAME)
        self.role.add_to_policy(iam.PolicyStatement(
            sid="WriteJobLogs",
            actions=["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents",
                     "logs:DescribeLogStreams"],
            resources=[log_group_arn, f"{log_group_arn}:log-stream:*"]))
        # The same role runs the trained model (launch/sagemaker/endpoint.py): endpoints and batch
        # transform jobs log to SageMaker's own groups for them.
        serving_log_groups = [stack.format_arn(service="logs", resource="log-group", resource_name=name,
                                               arn_format=ArnFormat.COLON_RESOURCE_NAME)
                              for name in (ENDPOINT_LOG_GROUP_PATTERN, TRANSFORM_LOG_GROUP)]
        self.role.add_to_policy(iam.PolicyStatement(
            sid="WriteServingLogs",
            actions=["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents",
                     "logs:DescribeLogStreams"],
            resources=[*serving_log_groups, *(f"{arn}:log-stream:*" for arn in serving_log_groups)]))
        self.role.add_to_policy(iam.PolicyStatement(
            sid="WriteJobMetrics", actions=["cloudwatch:PutMetricData"], resources=["*"],
            conditions={"StringEquals": {"cloudwatch:namespace": TRAINING_METRICS_NAMESPACE}}))
        acknowledge(
            self.role, "AwsSolutions-IAM5[Resource::*]",
            "Resource '*' only where AWS offers no resource-level scoping: the ec2:Describe* "
            "calls SageMaker makes to place a job in the VPC, ecr:GetAuthorizationToken, and "
            "cloudwatch:PutMetricData (limited by condition to the training-jobs namespace).")
        acknowledge(
            self.role, "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:ec2:<AWS::Region>:"
                       "<AWS::AccountId>:network-interface/*]",
            "SageMaker creates and deletes a job's network interfaces, whose ids do not exist "
            "beforehand; the statement is limited by condition to this VPC.")
        acknowledge(
            self.role, "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:logs:<AWS::Region>:"
                       "<AWS::AccountId>:log-group:/aws/sagemaker/TrainingJobs:log-stream:*]",
            "Each job writes log streams named after the job, inside SageMaker's fixed "
            "training-jobs log group.")
        for resource in (f"log-group:{ENDPOINT_LOG_GROUP_PATTERN}", f"log-group:{ENDPOINT_LOG_GROUP_PATTERN}:log-stream:*",
                         f"log-group:{TRANSFORM_LOG_GROUP}:log-stream:*"):
            acknowledge(
                self.role, f"AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:logs:<AWS::Region>:"
                           f"<AWS::AccountId>:{resource}]",
                "A model's endpoint or batch transform job writes to SageMaker's fixed log groups for "
                "them (one per endpoint, named after it), in streams named after its instances.")
