"""NetworkStorageStack: what both training paths share and must outlive them. The VPC, the EFS
file system (COCO staged once serves the EC2 cluster and SageMaker jobs) and the S3 buckets.

`cdk deploy EfsClusterStack` or `cdk deploy SageMakerStack` deploys this stack first (the CLI
deploys dependencies), so each works on its own; deploying both shares one VPC and one EFS.
"""
from __future__ import annotations

from aws_cdk import CfnOutput, Fn, Stack, Token
from constructs import Construct

from infra import outputs
from infra.constructs.bucket import DataBucket, LogBucket
from infra.constructs.file_system import SharedFileSystem
from infra.constructs.lustre import LustreCache
from infra.constructs.network import Network
from infra.constructs.notifications import Notifications
from infra.constructs.budget import MonthlyBudget
from infra.constructs.training_image import TrainingImageBuild
from infra.image_build import CODEBUILD


class NetworkStorageStack(Stack):
    def __init__(self, scope: Construct, id: str, *, existing_file_system_id: str | None,
                 efs_throughput_mode: str, notification_email: str | None = None,
                 availability_zones: tuple[str, ...] | None = None,
                 lustre_storage_gib: int = 0, lustre_zone_index: int = 0,
                 monthly_budget_usd: int | None = None, image_build: str = "local",
                 **kwargs) -> None:
        super().__init__(scope, id, description="Mask R-CNN training: shared VPC, EFS and S3 "
                         "(stateful resources are retained on delete)", **kwargs)
        self.notifications = Notifications(self, "Notifications", email=notification_email)
        if monthly_budget_usd:
            # The shared stack lives as long as the deployment; it counts the stack tags' spend.
            MonthlyBudget(self, "MonthlyBudget", amount_usd=monthly_budget_usd,
                          notifications=self.notifications, tags=self.tags.tag_values())
        self.log_bucket = LogBucket(self, "LogBucket")
        self.network = Network(self, "Network", flow_log_bucket=self.log_bucket.bucket,
                               availability_zones=availability_zones)
        zones_looked_up = not (Token.is_unresolved(self.account) or Token.is_unresolved(self.region))
        if availability_zones or zones_looked_up:
            # cfn-lint's W3010 warns on zone names written into a template; naming them is what
            # the user asked for (where their instance type is offered or reserved), or CDK's
            # zone lookup, kept in cdk.context.json, wrote them (a stack bound to an account).
            metadata = self.template_options.metadata or {}
            self.template_options.metadata = {**metadata, "cfn-lint": {"config": {
                "ignore_checks": ["W3010"]}}}
        self.file_system = SharedFileSystem(
            self, "FileSystem", vpc=self.network.vpc, subnets=self.network.private_subnets,
            throughput_mode=efs_throughput_mode, existing_file_system_id=existing_file_system_id,
            alarm_topic=self.notifications.topic)
        self.data_bucket = DataBucket(self, "DataBucket",
                                      access_log_bucket=self.log_bucket.bucket)

        # Optional FSx for Lustre, in the cluster's zone (cluster nodes mount it; SageMaker jobs
        # reading it run in that zone's subnet). Its security group exists either way.
        self.lustre = LustreCache(
            self, "Lustre", vpc=self.network.vpc,
            subnet=self.network.private_subnets[lustre_zone_index],
            storage_gib=lustre_storage_gib, data_bucket=self.data_bucket.bucket)

        # Every subnet is exported, not only those a training stack uses today: moving the
        # cluster to the other zone must not remove an export the deployed cluster stack still
        # imports (CloudFormation refuses, and `cdk deploy` updates this stack first).
        for subnet in (*self.network.public_subnets, *self.network.private_subnets):
            self.export_value(subnet.subnet_id)

        # With image_build=codebuild the training image is built here, once for both training
        # stacks (each imports only the repository); otherwise each holds its own Docker asset.
        self.training_image = (TrainingImageBuild(self, "TrainingImage")
                               if image_build == CODEBUILD else None)

        CfnOutput(self, outputs.FILE_SYSTEM_ID, value=self.file_system.file_system_id)
        CfnOutput(self, outputs.BUCKET_NAME, value=self.data_bucket.bucket.bucket_name)
        CfnOutput(self, outputs.PRIVATE_SUBNET_IDS, value=Fn.join(
            ",", [s.subnet_id for s in self.network.private_subnets]))
