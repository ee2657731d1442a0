"""EfsClusterStack: the EC2 Deep Learning AMI cluster (master + N workers) on the shared VPC and
EFS, running the training image; one command on the master starts training (launch/)."""
from __future__ import annotations

from aws_cdk import Aws, CfnOutput, Fn, Stack, Token
from constructs import Construct

from infra import outputs
from infra.config import AppConfig
from infra.constructs.cluster import LOGIN_USER, GpuCluster, LustreMount, NodeSpec
from infra.constructs.file_system import allow_nfs_from
from infra.constructs.lustre import allow_lustre_from
from infra.constructs.machine_image import cluster_machine_image
from infra.constructs.monitoring import ClusterMonitoring
from infra.constructs.training_image import TrainingImage
from infra.stacks.common_outputs import add_shared_outputs
from infra.stacks.network_storage import NetworkStorageStack


class EfsClusterStack(Stack):
    def __init__(self, scope: Construct, id: str, *, shared: NetworkStorageStack,
                 config: AppConfig, **kwargs) -> None:
        super().__init__(scope, id, description="Mask R-CNN training: EC2 GPU cluster "
                         "(Deep Learning AMI, EFS at /efs, training image)", **kwargs)
        vpc = shared.network.vpc
        image = shared.training_image or TrainingImage(self, "TrainingImage")
        # With an account and region (a synth with credentials) the AMI is looked up once and kept
        # in cdk.context.json; offline the template reads the parameter at each deploy.
        environment_known = not (Token.is_unresolved(self.account) or Token.is_unresolved(self.region))
        machine_image = cluster_machine_image(self, ssm_parameter=config.dlami_ssm_parameter,
                                                    ami_id=config.ami_id,
                                                    cached_in_context=environment_known)
        self.cluster = GpuCluster(
            self, "Cluster",
            vpc=vpc,
            # Same zone for both groups: a cluster placement group lives in one zone. A master
            # with several network interfaces gets no public address, so it runs where the
            # workers do and reaches AWS through the NAT gateway.
            master_subnet=(shared.network.public_subnets if config.master_is_public
                           else shared.network.private_subnets)[config.cluster_zone_index],
            worker_subnet=shared.network.private_subnets[config.cluster_zone_index],
            master_public=config.master_is_public,
            machine_image=machine_image,
            node=NodeSpec(instance_type=config.instance_type,
                          ebs_volume_size_gib=config.ebs_volume_size_gib,
                          efa_interfaces=config.efa_interfaces,
                          capacity_reservation=config.capacity_reservation,
                          capacity_block=config.capacity_block,
                          worker_spot=config.worker_spot,
                          spot_max_price=config.spot_max_price),
            worker_count=config.worker_count,
            idle_scaledown_minutes=config.idle_scaledown_minutes,
            file_system_id=shared.file_system.id_in(self),
            bucket_name=shared.data_bucket.bucket.bucket_name,
            training_image_uri=image.image_uri,
            notification_topic=shared.notifications.topic,
            ssh_cidr=config.ssh_cidr,
            key_pair_name=config.key_pair_name,
            lustre=(None if not shared.lustre.enabled else LustreMount(
                dns_name=shared.lustre.value_in(self, "dns_name"),
                mount_name=shared.lustre.value_in(self, "mount_name"))),
            boot_failure_limit=config.boot_failure_limit,
            log_retention_days=config.log_retention_days,
        )

        allow_nfs_from(self, "FileSystemAccessFromCluster", file_system=shared.file_system,
                       peer=self.cluster.security_group, description="NFS from the cluster nodes")
        if shared.lustre.enabled:
            allow_lustre_from(self, "LustreAccessFromCluster", cache=shared.lustre,
                              peer=self.cluster.security_group,
                              clients="the cluster nodes")
        for role in self.cluster.roles:
            shared.data_bucket.grant_data_access(role)
            shared.file_system.grant_client_access(role)
            image.grant_pull(role)

        if self.cluster.master_address is not None:
            CfnOutput(self, outputs.MASTER_ADDRESS, value=self.cluster.master_address.ref,
                      description="Public IP of the master (an Elastic IP the master attaches "
                                  "at boot)")
        if config.ssh_cidr:   # only with a public master (AppConfig refuses it otherwise)
            connect = Fn.join("", [f"ssh -i ~/.ssh/{config.key_pair_name}.pem {LOGIN_USER}@",
                                   self.cluster.master_address.ref])
        else:
            connect = Fn.join("", [
                "aws ssm start-session --region ", Aws.REGION, " --target $(aws autoscaling "
                "describe-auto-scaling-groups --region ", Aws.REGION,
                f" --auto-scaling-group-names {self.cluster.master_group_name} --query "
                "'AutoScalingGroups[0].Instances[0].InstanceId' --output text)"])
        CfnOutput(self, outputs.CONNECT_COMMAND, value=connect,
                  description="Opens a shell on the master")
        CfnOutput(self, outputs.CLUSTER_AMI_ID, value=machine_image.get_image(self).image_id,
                  description="AMI of the cluster nodes (kept in cdk.context.json, or the "
                              "ami_id setting): replacement nodes run the same drivers")
        CfnOutput(self, outputs.MASTER_ASG_NAME, value=self.cluster.master_group_name)
        CfnOutput(self, outputs.WORKER_ASG_NAME, value=self.cluster.worker_group_name)
        add_shared_outputs(self, shared=shared, image=image)

        lustre_id = shared.lustre.value_in(self, "file_system_id") if shared.lustre.enabled else None
        self.monitoring = ClusterMonitoring(
            self, "Monitoring", topic=shared.notifications.topic, node_roles=self.cluster.roles,
            group_names=(self.cluster.master_group_name, self.cluster.worker_group_name),
            file_system_id=shared.file_system.id_in(self), lustre_file_system_id=lustre_id,
            stall_minutes=config.stall_alarm_minutes)
        CfnOutput(self, outputs.DASHBOARD_URL, value=self.monitoring.dashboard_url,
                  description="CloudWatch dashboard of the training runs and the nodes")
