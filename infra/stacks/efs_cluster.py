"""EfsClusterStack: the EC2 Deep Learning AMI cluster (master + N workers) on the shared VPC and
EFS, running the training image; one command on the master starts training (launch/)."""
from __future__ import annotations

from aws_cdk import Aws, CfnOutput, Fn, Stack
from constructs import Construct

from infra import outputs
from infra.config import AppConfig
from infra.constructs.cluster import LOGIN_USER, GpuCluster, LustreMount, NodeSpec
from infra.constructs.file_system import allow_nfs_from
from infra.constructs.lustre import allow_lustre_from
from infra.constructs.machine_image import cluster_machine_image
from infra.constructs.training_image import TrainingImage
from infra.stacks.common_outputs import add_shared_outputs
from infra.stacks.network_storage import NetworkStorageStack


class EfsClusterStack(Stack):
    def __init__(self, scope: Construct, id: str, *, shared: NetworkStorageStack,
                 config: AppConfig, **kwargs) -> None:
        super().__init__(scope, id, description="Mask R-CNN training: EC2 GPU cluster "
                         "(Deep Learning AMI, EFS at /efs, training image)", **kwargs)
        vpc = shared.network.vpc
        image = TrainingImage(self, "TrainingImage")
        machine_image = cluster_machine_image(ssm_parameter=config.dlami_ssm_parameter,
                                              ami_id=config.ami_id)
        self.cluster = GpuCluster(
            self, "Cluster",
            vpc=vpc,
            # Same zone for both groups: a cluster placement group lives in one zone.
            master_subnet=shared.network.public_subnets[config.cluster_zone_index],
            worker_subnet=shared.network.private_subnets[config.cluster_zone_index],
            machine_image=machine_image,
            node=NodeSpec(instance_type=config.instance_type,
                          ebs_volume_size_gib=config.ebs_volume_size_gib, efa=config.efa),
            worker_count=config.worker_count,
            file_system_id=shared.file_system.id_in(self),
            bucket_name=shared.data_bucket.bucket.bucket_name,
            training_image_uri=image.image_uri,
            notification_topic=shared.notifications.topic,
            ssh_cidr=config.ssh_cidr,
            key_pair_name=config.key_pair_name,
            lustre=(None if shared.lustre is None else LustreMount(
                dns_name=shared.lustre.value_in(self, "dns_name"),
                mount_name=shared.lustre.value_in(self, "mount_name"))),
        )

        allow_nfs_from(self, "FileSystemAccessFromCluster", file_system=shared.file_system,
                       peer=self.cluster.security_group, description="NFS from the cluster nodes")
        if shared.lustre is not None:
            allow_lustre_from(self, "LustreAccessFromCluster", cache=shared.lustre,
                              peer=self.cluster.security_group,
                              clients="the cluster nodes")
        for role in self.cluster.roles:
            shared.data_bucket.grant_data_access(role)
            shared.file_system.grant_client_access(role)
            image.grant_pull(role)

        address = self.cluster.master_address.ref
        CfnOutput(self, outputs.MASTER_ADDRESS, value=address,
                  description="Public IP of the master (an Elastic IP the master attaches at boot)")
        if config.ssh_cidr:
            connect = Fn.join("", [f"ssh -i ~/.ssh/{config.key_pair_name}.pem {LOGIN_USER}@",
                                   address])
        else:
            connect = Fn.join("", [
                "aws ssm start-session --region ", Aws.REGION, " --target $(aws autoscaling "
                "describe-auto-scaling-groups --region ", Aws.REGION,
                f" --auto-scaling-group-names {self.cluster.master_group_name} --query "
                "'AutoScalingGroups[0].Instances[0].InstanceId' --output text)"])
        CfnOutput(self, outputs.CONNECT_COMMAND, value=connect,
                  description="Opens a shell on the master")
        CfnOutput(self, outputs.CLUSTER_AMI_ID, value=machine_image.get_image(self).image_id,
                  description="AMI of the cluster nodes; pin it with -c ami_id=... so that "
                              "replacement nodes run the same drivers (docs/infra.md)")
        CfnOutput(self, outputs.MASTER_ASG_NAME, value=self.cluster.master_group_name)
        CfnOutput(self, outputs.WORKER_ASG_NAME, value=self.cluster.worker_group_name)
        add_shared_outputs(self, shared=shared, image=image)

