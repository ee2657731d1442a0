"""SageMakerStack: a notebook in the shared VPC with EFS at ~/efs, and what its training jobs run
with (security group, execution role, image) on the same EFS and bucket."""
from __future__ import annotations

from aws_cdk import CfnOutput, Stack
from constructs import Construct

from infra import outputs
from infra.config import AppConfig
from infra.constructs.file_system import allow_nfs_from
from infra.constructs.lustre import allow_lustre_from
from infra.constructs.monitoring import SageMakerMonitoring
from infra.constructs.notebook import Notebook
from infra.constructs.training_image import TrainingImage
from infra.constructs.training_job import TrainingJobAccess
from infra.stacks.common_outputs import add_shared_outputs
from infra.stacks.network_storage import NetworkStorageStack


class SageMakerStack(Stack):
    def __init__(self, scope: Construct, id: str, *, shared: NetworkStorageStack,
                 config: AppConfig, **kwargs) -> None:
        super().__init__(scope, id, description="Mask R-CNN training: SageMaker notebook and "
                         "training-job role, security group and image", **kwargs)
        vpc = shared.network.vpc
        image = shared.training_image or TrainingImage(self, "TrainingImage")
        training = TrainingJobAccess(self, "TrainingJob", vpc=vpc,
                                     private_subnets=shared.network.private_subnets)
        notebook = Notebook(
            self, "Notebook", vpc=vpc, subnet=shared.network.private_subnets[0],
            instance_type=config.notebook_instance_type,
            volume_size_gib=config.notebook_volume_size_gib,
            file_system_id=shared.file_system.id_in(self), training_role=training.role,
            training_subnets=shared.network.private_subnets,
            training_security_group=training.security_group,
            idle_minutes=config.notebook_idle_minutes)

        allow_nfs_from(self, "FileSystemAccessFromTrainingJobs", file_system=shared.file_system,
                       peer=training.security_group, description="NFS from training jobs")
        allow_nfs_from(self, "FileSystemAccessFromNotebook", file_system=shared.file_system,
                       peer=notebook.security_group, description="NFS from the notebook")
        if shared.lustre.enabled:
            allow_lustre_from(self, "LustreAccessFromTrainingJobs", cache=shared.lustre,
                              peer=training.security_group,
                              clients="training jobs")
        shared.data_bucket.grant_data_access(training.role)
        shared.data_bucket.grant_data_access(notebook.role)
        shared.file_system.grant_client_access(training.role)
        image.grant_pull(training.role)

        CfnOutput(self, outputs.TRAINING_SECURITY_GROUP_ID,
                  value=training.security_group.security_group_id)
        CfnOutput(self, outputs.TRAINING_ROLE_ARN, value=training.role.role_arn)
        CfnOutput(self, outputs.NOTEBOOK_ROLE_ARN, value=notebook.role.role_arn)
        CfnOutput(self, outputs.NOTEBOOK_NAME, value=notebook.notebook_name)
        add_shared_outputs(self, shared=shared, image=image)

        self.monitoring = SageMakerMonitoring(
            self, "Monitoring", topic=shared.notifications.topic, training_role_arn=training.role.role_arn,
            file_system_id=shared.file_system.id_in(self),
            lustre_file_system_id=(shared.lustre.value_in(self, "file_system_id") if shared.lustre.enabled
                                   else None))
        CfnOutput(self, outputs.DASHBOARD_URL, value=self.monitoring.dashboard_url,
                  description="CloudWatch dashboard of the SageMaker training jobs")
