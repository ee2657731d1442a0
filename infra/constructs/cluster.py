"""The EC2 GPU cluster: a master auto-scaling group (1 node, public subnet) and a worker group
(N nodes, private subnet) in one cluster placement group, booted by infra/userdata/cluster_node.sh.

What each node gets (the contract the launcher in launch/ builds on, see docs/infra.md):
/etc/maskrcnn/cluster.env, EFS at /efs, the cluster SSH key in /etc/maskrcnn/ssh/, the hostfile
/etc/maskrcnn/hostfile and the training image running as the container `maskrcnn`.
"""
from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import ArnFormat, Aws, Duration, Stack, Tags
from aws_cdk import aws_autoscaling as autoscaling
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_secretsmanager as secretsmanager
from aws_cdk import aws_sns as sns
from constructs import Construct

from infra.constructs.acknowledge import acknowledge
from infra.constructs.network import allow_all_traffic_within
from infra.userdata import CLUSTER_NODE_SCRIPT, script_body

EFS_MOUNT = "/efs"
# The FSx for Lustre file system, when the app has one (the DLAMI cluster example's run.sh looked here first).
FSX_MOUNT = "/fsx"
# Where the Deep Learning AMI mounts the instance-store NVMe (g5, p4d, p5 have it): a local copy
# of the dataset there takes the reads off EFS during training.
NVME_MOUNT = "/opt/dlami/nvme"
SSH_PORT = 2222
# Ubuntu-based Deep Learning AMIs boot from /dev/sda1 (an AL2 image would use /dev/xvda).
ROOT_DEVICE = "/dev/sda1"
LOGIN_USER = "ubuntu"
# Covers a cold boot, an image pull of several GB and the master waiting for its workers.
BOOT_TIMEOUT = Duration.minutes(45)


@dataclass(frozen=True)
class LustreMount:
    """What a node needs to mount the FSx for Lustre file system at FSX_MOUNT."""
    dns_name: str
    mount_name: str


@dataclass(frozen=True)
class NodeSpec:
    instance_type: str
    ebs_volume_size_gib: int
    efa: bool


class GpuCluster(Construct):
    """Master and worker groups with their launch templates, roles, security groups, placement
    group, the cluster key's secret and the master's Elastic IP.

    Grants to shared resources (EFS, bucket, image) are wired by the stack, on `self.roles` and
    `self.security_group`. Launch and terminate failures of either group go to
    `notification_topic`.
    """

    def __init__(self, scope: Construct, id: str, *, vpc: ec2.IVpc,
                 master_subnet: ec2.ISubnet, worker_subnet: ec2.ISubnet,
                 machine_image: ec2.IMachineImage, node: NodeSpec, worker_count: int,
                 file_system_id: str, bucket_name: str, training_image_uri: str,
                 notification_topic: sns.ITopic,
                 ssh_cidr: str | None = None, key_pair_name: str | None = None,
                 lustre: LustreMount | None = None) -> None:
        super().__init__(scope, id)
        stack = Stack.of(self)
        # Fixed names (derived from the stack name) because every node's user data names both
        # groups; a Ref would make each launch template depend on the group that uses it.
        self.master_group_name = f"{stack.stack_name}-master"
        self.worker_group_name = f"{stack.stack_name}-worker"

        self.security_group = ec2.SecurityGroup(
            self, "NodeSecurityGroup", vpc=vpc,
            allow_all_outbound=True,   # AWS APIs, ECR, S3; the group itself: see below
            description="Cluster nodes: all traffic between nodes (MPI, NCCL, SSH on 2222)")
        allow_all_traffic_within(self.security_group, "cluster nodes (MPI, NCCL, EFA, SSH)")
        master_groups = [self.security_group]
        if ssh_cidr:
            ssh_group = ec2.SecurityGroup(
                self, "MasterSshSecurityGroup", vpc=vpc, allow_all_outbound=False,
                description="SSH to the master from the configured ssh_cidr only")
            ssh_group.add_ingress_rule(ec2.Peer.ipv4(ssh_cidr), ec2.Port.tcp(22),
                                       "SSH from ssh_cidr")
            master_groups.append(ssh_group)

        # A fixed name, so the node roles can name the secret without referencing the resource
        # (`<name>-??????` matches exactly this name plus the suffix Secrets Manager appends).
        # CloudFormation deletes secrets without a recovery window, so the name is free again
        # as soon as the stack is gone.
        self.cluster_key_name = f"{stack.stack_name}-cluster-key"
        self.cluster_key = secretsmanager.Secret(
            self, "ClusterKey", secret_name=self.cluster_key_name,
            description="SSH private key shared by the cluster nodes. CloudFormation fills it with "
                        "a random placeholder; the master replaces it with a key it generates "
                        "on first boot.")
        acknowledge(
            self.cluster_key, "AwsSolutions-SMG4",
            "The key never leaves the VPC (authorized_keys admits it only from the VPC "
            "CIDR) and lives as long as the cluster; rotating it means redeploying the "
            "stack, which creates a new secret and key.")
        cluster_key_arn = stack.format_arn(
            service="secretsmanager", resource="secret",
            resource_name=f"{self.cluster_key_name}-??????",
            arn_format=ArnFormat.COLON_RESOURCE_NAME)

        self.master_address = ec2.CfnEIP(self, "MasterAddress", domain="vpc")
        # One zone, low-latency network between all nodes (master and workers).
        self.placement_group = ec2.CfnPlacementGroup(self, "PlacementGroup", strategy="cluster")

        self.master_role = self._node_role("MasterRole", "Cluster master node")
        self.worker_role = self._node_role("WorkerRole", "Cluster worker node")
        for role in (self.master_role, self.worker_role):
            role.add_to_policy(iam.PolicyStatement(
                sid="ReadClusterKey", actions=["secretsmanager:GetSecretValue"],
                resources=[cluster_key_arn]))
        self.master_role.add_to_policy(iam.PolicyStatement(
            sid="PublishClusterKey", actions=["secretsmanager:PutSecretValue"],
            resources=[cluster_key_arn]))
        for role, group_name in ((self.master_role, self.master_group_name),
                                 (self.worker_role, self.worker_group_name)):
            self._allow_reporting_unhealthy(role, group_name)
        self._allow_address_association(self.master_role)

        common_env = {
            "STACK_NAME": Aws.STACK_NAME,
            "AWS_REGION": Aws.REGION,
            "FILE_SYSTEM_ID": file_system_id,
            "BUCKET_NAME": bucket_name,
            "TRAINING_IMAGE_URI": training_image_uri,
            "MASTER_ASG_NAME": self.master_group_name,
            "WORKER_ASG_NAME": self.worker_group_name,
            "CLUSTER_KEY_SECRET_ARN": self.cluster_key.secret_arn,
            "EFS_MOUNT": EFS_MOUNT,
            "NVME_MOUNT": NVME_MOUNT,
            "SSH_PORT": str(SSH_PORT),
            "VPC_CIDR": vpc.vpc_cidr_block,
        }
        if lustre is not None:
            # Absent without the option: the boot script then mounts nothing at /fsx.
            common_env.update({"FSX_MOUNT": FSX_MOUNT, "FSX_DNS_NAME": lustre.dns_name,
                               "FSX_MOUNT_NAME": lustre.mount_name})
        key_pair = (ec2.KeyPair.from_key_pair_name(self, "KeyPair", key_pair_name)
                    if key_pair_name else None)

        self.notification_topic = notification_topic
        self.master_group = self._node_group(
            "Master", vpc=vpc, role=self.master_role, groups=master_groups, subnet=master_subnet,
            size=1, public=True, node=node, machine_image=machine_image, key_pair=key_pair,
            env={**common_env, "ROLE": "master",
                 "EIP_ALLOCATION_ID": self.master_address.attr_allocation_id},
            group_name=self.master_group_name)
        self.worker_group = self._node_group(
            "Worker", vpc=vpc, role=self.worker_role, groups=[self.security_group],
            subnet=worker_subnet, size=worker_count, public=False, node=node,
            machine_image=machine_image, key_pair=key_pair,
            env={**common_env, "ROLE": "worker"}, group_name=self.worker_group_name)

        self.roles: tuple[iam.IRole, ...] = (self.master_role, self.worker_role)

    # --- roles -------------------------------------------------------------------------------

    def _node_role(self, id: str, description: str) -> iam.Role:
        role = iam.Role(
            self, id, description=description,
            assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"),
            managed_policies=[iam.ManagedPolicy.from_aws_managed_policy_name(
                "AmazonSSMManagedInstanceCore")])
        acknowledge(
            role, "AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/"
                  "AmazonSSMManagedInstanceCore]",
            "SSM Session Manager is how users reach the nodes when no ssh_cidr is set. AWS "
            "maintains this policy as the minimum the SSM agent needs; a copy would drift from "
            "the agent's requirements.")
        # Node discovery for the hostfile (boot script and launch/cluster in the container):
        # these Describe calls have no resource-level scoping.
        role.add_to_policy(iam.PolicyStatement(
            sid="DiscoverClusterNodes",
            actions=["autoscaling:DescribeAutoScalingGroups", "ec2:DescribeInstances",
                     "ec2:DescribeInstanceTypes"],
            resources=["*"]))
        # The boot script reports success or failure to CloudFormation (the groups' creation
        # policy), so `cdk deploy` finishes only when the nodes are ready.
        role.add_to_policy(iam.PolicyStatement(
            sid="SignalBootResult", actions=["cloudformation:SignalResource"],
            resources=[Aws.STACK_ID]))
        # launch/ on the nodes reads this stack's outputs (bucket, file system, image).
        role.add_to_policy(iam.PolicyStatement(
            sid="ReadOwnStackOutputs", actions=["cloudformation:DescribeStacks"],
            resources=[Aws.STACK_ID]))
        acknowledge(
            role, "AwsSolutions-IAM5[Resource::*]",
            "Resource '*' only where AWS offers no resource-level scoping: "
            "autoscaling:DescribeAutoScalingGroups, ec2:DescribeInstances and "
            "ec2:DescribeInstanceTypes (hostfile discovery) and ecr:GetAuthorizationToken "
            "(docker login). Image pull itself is scoped to the assets repository.")
        return role

    def _allow_reporting_unhealthy(self, role: iam.Role, group_name: str) -> None:
        """A node whose boot fails marks itself unhealthy, so its group replaces it."""
        role.add_to_policy(iam.PolicyStatement(
            sid="ReportOwnBootFailure", actions=["autoscaling:SetInstanceHealth"],
            # The group's ARN holds a UUID assigned at creation; its name is fixed.
            resources=[Stack.of(self).format_arn(
                service="autoscaling", resource="autoScalingGroup",
                resource_name=f"*:autoScalingGroupName/{group_name}",
                arn_format=ArnFormat.COLON_RESOURCE_NAME)]))
        acknowledge(
            role, f"AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:autoscaling:<AWS::Region>:"
                  f"<AWS::AccountId>:autoScalingGroup:*:autoScalingGroupName/{group_name}]",
            "Only the node's own auto-scaling group, by name: the UUID in a group's ARN is "
            "assigned when the group is created.")

    def _allow_address_association(self, role: iam.Role) -> None:
        stack = Stack.of(self)
        role.add_to_policy(iam.PolicyStatement(
            sid="AttachMasterAddress", actions=["ec2:AssociateAddress"],
            resources=[stack.format_arn(service="ec2", resource="elastic-ip",
                                        resource_name=self.master_address.attr_allocation_id)]))
        # The instance id is assigned by the auto-scaling group at launch; the group tags its
        # instances with its name, so only a master-group instance can receive the address.
        role.add_to_policy(iam.PolicyStatement(
            sid="AttachMasterAddressToMasterOnly", actions=["ec2:AssociateAddress"],
            resources=[stack.format_arn(service="ec2", resource="instance", resource_name="*")],
            conditions={"StringEquals": {
                "aws:ResourceTag/aws:autoscaling:groupName": self.master_group_name}}))
        acknowledge(
            role, "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:ec2:<AWS::Region>:"
                  "<AWS::AccountId>:instance/*]",
            "The master attaches its Elastic IP to itself; its instance id is assigned by the "
            "auto-scaling group at launch, so the statement allows instances by the "
            "aws:autoscaling:groupName tag of the master group only.")

    # --- groups ------------------------------------------------------------------------------

    def _node_group(self, prefix: str, *, vpc: ec2.IVpc, role: iam.IRole,
                    groups: list[ec2.ISecurityGroup], subnet: ec2.ISubnet, size: int,
                    public: bool, node: NodeSpec, machine_image: ec2.IMachineImage,
                    key_pair: ec2.IKeyPair | None, env: dict[str, str],
                    group_name: str) -> autoscaling.AutoScalingGroup:
        user_data = ec2.UserData.for_linux()
        template = ec2.LaunchTemplate(
            self, f"{prefix}LaunchTemplate",
            instance_type=ec2.InstanceType(node.instance_type),
            machine_image=machine_image,
            role=role,
            security_group=groups[0],
            # Set for both: the master needs a public address to reach AWS APIs from the public
            # subnet (no NAT route there); workers must never get one.
            associate_public_ip_address=public,
            user_data=user_data,
            require_imdsv2=True,
            block_devices=[ec2.BlockDevice(
                device_name=ROOT_DEVICE,
                volume=ec2.BlockDeviceVolume.ebs(
                    node.ebs_volume_size_gib, encrypted=True, delete_on_termination=True,
                    volume_type=ec2.EbsDeviceVolumeType.GP3))],
            key_pair=key_pair,
        )
        # By Ref (which is the group's name), set on the L1 resource: CDK's `placement_group`
        # would use Fn::GetAtt, which the local CloudFormation emulator used in the tests lacks.
        template.node.default_child.add_property_override(
            "LaunchTemplateData.Placement.GroupName", self.placement_group.ref)
        for extra in groups[1:]:
            template.add_security_group(extra)
        if node.efa:
            # One EFA interface, on network card 0 (where the master's public address goes).
            template.node.default_child.add_property_override(
                "LaunchTemplateData.NetworkInterfaces.0.InterfaceType", "efa")

        group = autoscaling.AutoScalingGroup(
            self, f"{prefix}Group",
            vpc=vpc,
            vpc_subnets=ec2.SubnetSelection(subnets=[subnet]),
            launch_template=template,
            min_capacity=size, max_capacity=size,
            auto_scaling_group_name=group_name,
            # `cdk deploy` completes only when every node's boot script has succeeded.
            signals=autoscaling.Signals.wait_for_all(timeout=BOOT_TIMEOUT) if size else None,
            # A replacement node that fails its boot marks itself unhealthy; the group then
            # terminates and relaunches it. Errors in doing so reach the user by SNS.
            notifications=[autoscaling.NotificationConfiguration(
                topic=self.notification_topic, scaling_events=autoscaling.ScalingEvents.ERRORS)],
        )
        Tags.of(group).add("Name", group_name)
        acknowledge(
            group, "AwsSolutions-AS3",
            "Launch and terminate errors are notified (the SNS topic); successful launches "
            "and terminations of a fixed-size group are the user's own deploys and destroys, "
            "visible in the group's activity history.")

        # The logical id is known only once the group exists; the user data is rendered at synth.
        env = {**env, "ASG_LOGICAL_ID": Stack.of(self).get_logical_id(group.node.default_child)}
        user_data.add_commands(
            "mkdir -p /etc/maskrcnn",
            "cat > /etc/maskrcnn/cluster.env <<'EOF'",
            *(f"{key}={value}" for key, value in env.items()),
            "EOF",
            script_body(CLUSTER_NODE_SCRIPT),
        )
        return group

