"""The EFS file system both training paths share (COCO staged once serves both), with its mount
targets in the private subnets and a security group that admits NFS only from named groups."""
from __future__ import annotations

from aws_cdk import Duration, RemovalPolicy, Stack
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cloudwatch_actions
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_efs as efs
from aws_cdk import aws_iam as iam
from aws_cdk import aws_sns as sns
from aws_cdk import aws_ssm as ssm
from constructs import Construct

NFS_PORT = 2049

# Bursting mode: a small file system (COCO is ~25 GB) has a baseline of ~1.25 MiB/s and bursts to
# 100 MiB/s on credits, starting with 2.1 TiB of them. Reading at the burst rate, 0.5 TiB lasts
# about 1.5 hours: the alarm leaves time to switch to elastic throughput before reads slow to
# the baseline (the original setup's failure: training stalled on data loading).
BURST_CREDIT_ALARM_BYTES = 512 * 1024**3

_THROUGHPUT_MODES = {
    # Elastic scales with the workload: bursting mode's credits run out mid-training on a small
    # file system read by many GPUs (a known failure of the original setup).
    "elastic": efs.ThroughputMode.ELASTIC,
    "bursting": efs.ThroughputMode.BURSTING,
}


class SharedFileSystem(Construct):
    """A new encrypted file system, or an existing one (by id) given mount targets in this VPC.

    An existing file system must not have mount targets in another VPC: EFS allows mount targets
    in one VPC at a time. Either way the security group starts with no ingress; consumers add
    their own NFS rule with `allow_nfs_from`, in their own stack.
    """

    def __init__(self, scope: Construct, id: str, *, vpc: ec2.IVpc,
                 subnets: list[ec2.ISubnet], throughput_mode: str = "elastic",
                 existing_file_system_id: str | None = None,
                 alarm_topic: sns.ITopic | None = None) -> None:
        super().__init__(scope, id)
        self.security_group = ec2.SecurityGroup(
            self, "SecurityGroup", vpc=vpc, allow_all_outbound=False,
            description="EFS mount targets: NFS only from the cluster, notebook and training-job "
                        "security groups")
        if existing_file_system_id:
            self.file_system: efs.IFileSystem = efs.FileSystem.from_file_system_attributes(
                self, "FileSystem", file_system_id=existing_file_system_id,
                security_group=self.security_group)
            for index, subnet in enumerate(subnets, start=1):
                efs.CfnMountTarget(
                    self, f"MountTarget{index}", file_system_id=existing_file_system_id,
                    subnet_id=subnet.subnet_id,
                    security_groups=[self.security_group.security_group_id])
        else:
            self.file_system = efs.FileSystem(
                self, "FileSystem",
                vpc=vpc, vpc_subnets=ec2.SubnetSelection(subnets=subnets),
                security_group=self.security_group,
                encrypted=True,
                throughput_mode=_THROUGHPUT_MODES[throughput_mode],
                performance_mode=efs.PerformanceMode.GENERAL_PURPOSE,
                removal_policy=RemovalPolicy.RETAIN,
                # SageMaker's EFS data channels and the NFS fallback mount as anonymous NFS
                # clients; access is controlled at the network level, by the security group.
                allow_anonymous_access=True,
            )
        self.file_system_id: str = self.file_system.file_system_id
        # Other stacks read the id from this parameter at deploy time instead of importing an
        # export: CloudFormation refuses to change or remove an export another stack imports,
        # so switching to (or between) existing_file_system_id would fail while a training
        # stack exists. The parameter just changes; the training stacks take the new id at
        # their next deploy (the CDK CLI never skips a stack with SSM parameters).
        stack = Stack.of(self)
        # A literal name (a Ref to the parameter would itself be an export).
        self.id_parameter_name = f"/maskrcnn/{stack.stack_name}/file-system-id"
        self.id_parameter = ssm.StringParameter(
            self, "IdParameter", parameter_name=self.id_parameter_name,
            string_value=self.file_system_id,
            description="Id of the shared EFS file system, read by the training stacks")
        if not existing_file_system_id:
            # CloudFormation refuses to drop an export that a deployed stack imports: training
            # stacks whose templates import the id (rather than read its parameter) keep working.
            stack.export_value(self.file_system_id)
        self.burst_credit_alarm: cloudwatch.Alarm | None = None
        if throughput_mode == "bursting":
            self.burst_credit_alarm = self._burst_credit_alarm(alarm_topic)

    def _burst_credit_alarm(self, topic: sns.ITopic | None) -> cloudwatch.Alarm:
        credits = cloudwatch.Metric(
            namespace="AWS/EFS", metric_name="BurstCreditBalance",
            dimensions_map={"FileSystemId": self.file_system_id},
            statistic="Minimum", period=Duration.minutes(5))
        alarm = credits.create_alarm(
            self, "BurstCreditAlarm", threshold=BURST_CREDIT_ALARM_BYTES, evaluation_periods=1,
            comparison_operator=cloudwatch.ComparisonOperator.LESS_THAN_THRESHOLD,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            alarm_description="EFS burst credits below 0.5 TiB: reads fall to the baseline "
                              "throughput when they run out. Switch the file system to elastic "
                              "throughput (docs/infra.md).")
        if topic is not None:
            alarm.add_alarm_action(cloudwatch_actions.SnsAction(topic))
        return alarm

    def id_in(self, scope: Construct) -> str:
        """The file system's id as `scope`'s stack may use it: the id itself in this stack, the
        SSM parameter's value (resolved at deploy) in any other."""
        stack = Stack.of(scope)
        if stack is Stack.of(self):
            return self.file_system_id
        stack.add_stack_dependency(Stack.of(self), "reads the file system id parameter")
        return ssm.StringParameter.value_for_string_parameter(stack, self.id_parameter_name)

    def grant_client_access(self, grantee: iam.IGrantable) -> None:
        """Mount and write, for clients that mount with IAM authorization (efs-utils `iam`).
        The ARN is built in the grantee's stack from the id as that stack reads it."""
        stack = Stack.of(grantee)
        arn = stack.format_arn(service="elasticfilesystem", resource="file-system",
                               resource_name=self.id_in(stack))
        iam.Grant.add_to_principal(
            grantee=grantee, resource_arns=[arn],
            actions=["elasticfilesystem:ClientMount", "elasticfilesystem:ClientWrite"])


def allow_nfs_from(scope: Construct, id: str, *, file_system: SharedFileSystem,
                   peer: ec2.ISecurityGroup, description: str) -> None:
    """Admits NFS from `peer` to the file system, declaring the rule in `scope`'s stack.

    The file system lives in another stack than its clients. Adding the rule on the file system's
    own security group object would put it in that stack, referencing the client's group: a
    dependency back onto the client's stack, hence a cycle. Importing the group by id here keeps
    the rule with the client.
    """
    group = ec2.SecurityGroup.from_security_group_id(
        scope, id, file_system.security_group.security_group_id,
        mutable=True, allow_all_outbound=False)
    group.add_ingress_rule(peer, ec2.Port.tcp(NFS_PORT), description)
