"""The EC2 GPU cluster: a master auto-scaling group (1 node; in the public subnet with an Elastic
IP, or in the private subnet when each node has several network interfaces) and a worker group
(N nodes, private subnet), placed together (one cluster placement group, or the capacity
reservation's placement), booted by infra/userdata/cluster_node.sh.

What each node gets (the contract launch/cluster builds on, see docs/infra.md):
/etc/maskrcnn/cluster.env, EFS at /efs, the munge key in /etc/maskrcnn/munge.key, the hostfile
/etc/maskrcnn/hostfile and the training image running as the container `maskrcnn` (the Slurm
daemons).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aws_cdk import ArnFormat, Aws, Stack, Tags
from aws_cdk import aws_autoscaling as autoscaling
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import Fn, RemovalPolicy
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3_assets as s3_assets
from aws_cdk import aws_ssm as ssm
from aws_cdk import aws_secretsmanager as secretsmanager
from aws_cdk import aws_sns as sns
from constructs import Construct

from infra.constructs.acknowledge import acknowledge
from infra.constructs.network import allow_all_traffic_within
from infra.instance_types import efa_only_beyond_card0
from infra.node_contract import CLUSTER_DIR, CLUSTER_ENV, EFS_MOUNT, FSX_MOUNT, NVME_MOUNT
from infra.userdata import CLUSTER_NODE_BOOTSTRAP, CLUSTER_NODE_SCRIPT, script_body, sha256_of

# Ubuntu-based Deep Learning AMIs boot from /dev/sda1 (an AL2 image would use /dev/xvda).
ROOT_DEVICE = "/dev/sda1"
LOGIN_USER = "ubuntu"
# What the SSM agent on a node needs for Session Manager and Run Command, by statement id.
# Session Manager: AWS's minimal instance policy ("Step 2: Verify or add instance permissions for
# Session Manager"): ssm:UpdateInstanceInformation and the four ssmmessages channel actions.
# Run Command (launch/smoke.py sends AWS-RunShellScript to the master): the agent's ec2messages
# actions. ssm:ListInstanceAssociations: the agent asks for its associations at every start
# and logs an access error without it.
SSM_AGENT_STATEMENTS = {
    "SessionManagerChannels": (
        "ssm:UpdateInstanceInformation", "ssm:ListInstanceAssociations",
        "ssmmessages:CreateControlChannel", "ssmmessages:CreateDataChannel",
        "ssmmessages:OpenControlChannel", "ssmmessages:OpenDataChannel"),
    "RunCommandMessages": (
        "ec2messages:AcknowledgeMessage", "ec2messages:DeleteMessage", "ec2messages:FailMessage",
        "ec2messages:GetEndpoint", "ec2messages:GetMessages", "ec2messages:SendReply"),
}


@dataclass(frozen=True)
class LustreMount:
    """What a node needs to mount the FSx for Lustre file system at FSX_MOUNT."""
    dns_name: str
    mount_name: str


@dataclass(frozen=True)
class NodeSpec:
    instance_type: str
    ebs_volume_size_gib: int
    # EFA interfaces per node, one per EFA-capable network card (AppConfig.efa_interfaces); 0: a
    # single ordinary interface.
    efa_interfaces: int = 0
    # A capacity reservation or Capacity Block id (cr-...) or a Capacity Reservation resource
    # group ARN that every node launches into; None: open on-demand capacity.
    capacity_reservation: str | None = None
    # capacity_reservation is a Capacity Block for ML (launched with market type capacity-block).
    capacity_block: bool = False
    # The workers are Spot Instances (the master stays On-Demand); spot_max_price: USD per hour,
    # None for the current Spot price. Never together with capacity_reservation (AppConfig).
    worker_spot: bool = False
    spot_max_price: str | None = None


def network_interfaces(groups: list[str], *, efa_interfaces: int, public: bool,
                       efa_only: bool = False) -> list[dict[str, Any]]:
    """A launch template's NetworkInterfaces (CloudFormation's property names).

    With EFA, one EFA interface per network card: card 0 carries the primary interface, EFA with
    ENA (device index 0). Every other card carries EFA with ENA at device index 1, or, with
    `efa_only` (p5, p5e), an EFA-only interface at device index 0: AWS's "Maximize network
    bandwidth on Amazon EC2 instances with multiple network cards" puts EFA-only interfaces at
    device index 0 and ENA interfaces at device index 1 of the additional cards. An EFA-only
    interface has no ENA device and no IP address, so the node has one addressed interface (card
    0's), which MPI and NCCL's socket bootstrap use. Every interface carries the node's security
    groups: with NetworkInterfaces in a launch template, the groups belong on the interfaces, not
    in a template-level SecurityGroupIds. A public address is requested only with a single
    interface: AWS assigns no public IPv4 address to an instance launched with several.
    """
    if public and efa_interfaces > 1:
        raise ValueError(f"{efa_interfaces} network interfaces: AWS assigns no public IPv4 "
                         "address to such an instance")
    interfaces: list[dict[str, Any]] = []
    for card in range(max(efa_interfaces, 1)):
        only = efa_only and card > 0
        interface: dict[str, Any] = {"DeviceIndex": 0 if card == 0 or only else 1, "Groups": groups,
                                     "DeleteOnTermination": True}
        if efa_interfaces:
            interface.update({"NetworkCardIndex": card, "InterfaceType": "efa-only" if only else "efa"})
        if efa_interfaces <= 1:
            # Set for both groups: a public master needs its address to reach AWS APIs from the
            # public subnet (no NAT route there); workers must never get one.
            interface["AssociatePublicIpAddress"] = public
        interfaces.append(interface)
    return interfaces


def capacity_overrides(node: NodeSpec) -> dict[str, Any]:
    """LaunchTemplateData properties that launch every node into node.capacity_reservation."""
    if not node.capacity_reservation:
        return {}
    key = ("CapacityReservationResourceGroupArn" if node.capacity_reservation.startswith("arn:")
           else "CapacityReservationId")
    overrides: dict[str, Any] = {
        "CapacityReservationSpecification": {
            "CapacityReservationTarget": {key: node.capacity_reservation}}}
    if node.capacity_block:
        # EC2 launches into a Capacity Block only with this market type and the block's id.
        overrides["InstanceMarketOptions"] = {"MarketType": "capacity-block"}
    return overrides


def spot_overrides(node: NodeSpec) -> dict[str, Any]:
    """LaunchTemplateData properties that make a worker a Spot Instance (with node.worker_spot)."""
    if not node.worker_spot:
        return {}
    if node.capacity_reservation:
        raise ValueError("a Spot Instance cannot launch into a capacity reservation or Capacity "
                         "Block: unset capacity_reservation or worker_spot")
    options: dict[str, Any] = {
        # The auto-scaling group requests each replacement itself: AWS asks for one-time
        # requests in a group (a persistent one would relaunch outside the group's control).
        "SpotInstanceType": "one-time",
        # A Spot Instance set to stop or hibernate cannot launch into a placement group; a
        # terminated worker is replaced by the group, and training resumes from its checkpoint.
        "InstanceInterruptionBehavior": "terminate",
    }
    if node.spot_max_price:
        options["MaxPrice"] = node.spot_max_price
    return {"InstanceMarketOptions": {"MarketType": "spot", "SpotOptions": options}}


class GpuCluster(Construct):
    """Master and worker groups with their launch templates, roles, security groups, the
    munge key's secret, the cluster placement group (without a capacity reservation) and the
    master's Elastic IP (when `master_public`).

    `master_public`: the master runs in `master_subnet` (a public one) with a public address and
    attaches an Elastic IP at boot; otherwise `master_subnet` is private, as the workers' is, and
    the master has no public address (several network interfaces per node rule one out).

    Grants to shared resources (EFS, bucket, image) are wired by the stack, on `self.roles` and
    `self.security_group`. Launch and terminate failures of either group go to
    `notification_topic`.
    """

    def __init__(self, scope: Construct, id: str, *, vpc: ec2.IVpc,
                 master_subnet: ec2.ISubnet, worker_subnet: ec2.ISubnet, master_public: bool,
                 machine_image: ec2.IMachineImage, node: NodeSpec, worker_count: int,
                 file_system_id: str, bucket_name: str, training_image_uri: str,
                 notification_topic: sns.ITopic,
                 ssh_cidr: str | None = None, key_pair_name: str | None = None,
                 lustre: LustreMount | None = None, idle_scaledown_minutes: int = 0,
                 boot_failure_limit: int, log_retention_days: int) -> None:
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

        # Slurm's authentication key (munge), the same on every node: random from Secrets Manager
        # at creation, written to /etc/maskrcnn/munge.key by each node's boot. A fixed name, so
        # the node roles can name the secret without referencing the resource (`<name>-??????`
        # matches exactly this name plus the suffix Secrets Manager appends). CloudFormation
        # deletes secrets without a recovery window, so the name is free again as soon as the
        # stack is gone.
        self.munge_key_name = f"{stack.stack_name}-munge-key"
        self.munge_key = secretsmanager.Secret(
            self, "MungeKey", secret_name=self.munge_key_name,
            description="munge key of the cluster's Slurm daemons",
            generate_secret_string=secretsmanager.SecretStringGenerator(
                password_length=128, exclude_punctuation=True))
        acknowledge(
            self.munge_key, "AwsSolutions-SMG4",
            "munge authenticates the Slurm daemons inside the VPC for the cluster's lifetime; "
            "rotating it means restarting every node's daemons, i.e. redeploying the stack.")
        munge_key_arn = stack.format_arn(
            service="secretsmanager", resource="secret",
            resource_name=f"{self.munge_key_name}-??????",
            arn_format=ArnFormat.COLON_RESOURCE_NAME)

        self.master_address = (ec2.CfnEIP(self, "MasterAddress", domain="vpc")
                               if master_public else None)
        # One zone, low-latency network between all nodes (master and workers). With a capacity
        # reservation the reservation decides where the nodes go: a Capacity Block's instances
        # are placed together by EC2, and a reservation made in a cluster placement group places
        # its instances in that group (one this stack creates cannot hold a reservation made
        # before the deploy). A second placement constraint, this stack's own group, could refuse
        # launches the reservation has room for: AWS ParallelCluster warns of exactly that for
        # Capacity Blocks and for reservations outside the chosen placement group.
        self.placement_group = (None if node.capacity_reservation else
                                ec2.CfnPlacementGroup(self, "PlacementGroup", strategy="cluster"))

        self.master_role = self._node_role("MasterRole", "Cluster master node")
        self.worker_role = self._node_role("WorkerRole", "Cluster worker node")
        for role in (self.master_role, self.worker_role):
            role.add_to_policy(iam.PolicyStatement(
                sid="ReadMungeKey", actions=["secretsmanager:GetSecretValue"],
                resources=[munge_key_arn]))
        for role, group_name in ((self.master_role, self.master_group_name),
                                 (self.worker_role, self.worker_group_name)):
            self._allow_reporting_unhealthy(role, group_name)
        self._allow_scaling_workers(self.master_role)
        # `maskrcnn job` on the master prices a run of a type infra/instance_types.py has no price
        # for (p5e, p5en, p6-b200) from AWS's Price List (launch/price_list.py).
        self.master_role.add_to_policy(iam.PolicyStatement(
            sid="ReadPrices", actions=["pricing:GetProducts"], resources=["*"]))
        if self.master_address is not None:
            self._allow_address_association(self.master_role, self.master_address)

        common_env = {
            "STACK_NAME": Aws.STACK_NAME,
            "AWS_REGION": Aws.REGION,
            "FILE_SYSTEM_ID": file_system_id,
            "BUCKET_NAME": bucket_name,
            "TRAINING_IMAGE_URI": training_image_uri,
            "MASTER_ASG_NAME": self.master_group_name,
            "WORKER_ASG_NAME": self.worker_group_name,
            "MUNGE_KEY_SECRET_NAME": self.munge_key_name,
            "WORKER_COUNT": str(worker_count),
            # EFA interfaces per node: the job's mpirun routes NCCL over EFA when there are any
            # (launch/cluster/jobs.py), its all-reduce check then holds the EFA floor (0: TCP
            # sockets, no floor), and the node's health check counts the EFA devices.
            "EFA_INTERFACES": str(node.efa_interfaces),
            "EFS_MOUNT": EFS_MOUNT,
            "NVME_MOUNT": NVME_MOUNT,
            "VPC_CIDR": vpc.vpc_cidr_block,
            # The master's idle check (launch/cluster/idle.py) scales the workers to 0 after this
            # many minutes without a training job; 0: never.
            "IDLE_SCALEDOWN_MINUTES": str(idle_scaledown_minutes),
        }
        if lustre is not None:
            # Absent without the option: the boot script then mounts nothing at /fsx.
            common_env.update({"FSX_MOUNT": FSX_MOUNT, "FSX_DNS_NAME": lustre.dns_name,
                               "FSX_MOUNT_NAME": lustre.mount_name})
        key_pair = (ec2.KeyPair.from_key_pair_name(self, "KeyPair", key_pair_name)
                    if key_pair_name else None)

        self.notification_topic = notification_topic
        self._boot_reporting(boot_failure_limit, log_retention_days)
        master_env = {**common_env, "ROLE": "master"}
        if self.master_address is not None:
            # Absent on a private master: the boot script then attaches no address.
            master_env["EIP_ALLOCATION_ID"] = self.master_address.attr_allocation_id
        self.master_group = self._node_group(
            "Master", vpc=vpc, role=self.master_role, groups=master_groups, subnet=master_subnet,
            size=1, public=master_public, node=node, machine_image=machine_image,
            key_pair=key_pair, env=master_env, group_name=self.master_group_name)
        self.worker_group = self._node_group(
            "Worker", vpc=vpc, role=self.worker_role, groups=[self.security_group],
            subnet=worker_subnet, size=worker_count, public=False, node=node,
            machine_image=machine_image, key_pair=key_pair,
            env={**common_env, "ROLE": "worker"}, group_name=self.worker_group_name)

        self.roles: tuple[iam.IRole, ...] = (self.master_role, self.worker_role)

    # --- roles -------------------------------------------------------------------------------

    def _node_role(self, id: str, description: str) -> iam.Role:
        role = iam.Role(self, id, description=description,
                        assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"))
        # SSM Session Manager (how users reach the nodes without ssh_cidr) and Run Command, and
        # nothing else of Systems Manager: AmazonSSMManagedInstanceCore would also let every
        # process on the node, user containers on the host network included, read every SSM
        # parameter of the account. The only parameter a node reads is its group's boot-failure
        # count, allowed on its ARN (_boot_failure_guard).
        for sid, actions in SSM_AGENT_STATEMENTS.items():
            role.add_to_policy(iam.PolicyStatement(sid=sid, actions=list(actions), resources=["*"]))
        # Node discovery (the boot script's node registry, Slurm node names, the idle check):
        # these Describe calls have no resource-level scoping.
        role.add_to_policy(iam.PolicyStatement(
            sid="DiscoverClusterNodes",
            # DescribeAutoScalingInstances: a node claims a dead node's Slurm name only once that
            # instance has left its group; DescribeCapacityReservations: a Capacity Block's end.
            actions=["autoscaling:DescribeAutoScalingGroups", "autoscaling:DescribeAutoScalingInstances",
                     "ec2:DescribeInstances", "ec2:DescribeInstanceTypes",
                     "ec2:DescribeCapacityReservations"],
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
            "Resource '*' only for the SSM agent's Session Manager and Run Command actions "
            "(ssmmessages, ec2messages, ssm:UpdateInstanceInformation, "
            "ssm:ListInstanceAssociations: the node's own channels, on '*' as in AWS's minimal "
            "Session Manager instance policy) and where AWS offers no resource-level scoping: "
            "autoscaling:DescribeAutoScalingGroups, autoscaling:DescribeAutoScalingInstances, "
            "ec2:DescribeInstances, ec2:DescribeInstanceTypes and ec2:DescribeCapacityReservations "
            "(node discovery, Slurm node names, a Capacity Block's end) and ecr:GetAuthorizationToken "
            "(docker login), and on the master pricing:GetProducts (AWS's public prices, for a "
            "run's cost line). Image pull itself is scoped to the assets repository.")
        return role

    def _allow_reporting_unhealthy(self, role: iam.Role, group_name: str) -> None:
        """A node whose boot fails marks itself unhealthy, so its group replaces it."""
        role.add_to_policy(iam.PolicyStatement(
            sid="ReportOwnBootFailure", actions=["autoscaling:SetInstanceHealth"],
            resources=[self._group_arn(group_name)]))
        acknowledge(
            role, self._group_arn_finding(group_name),
            "Only the node's own auto-scaling group, by name: the UUID in a group's ARN is "
            "assigned when the group is created.")

    def _group_arn(self, group_name: str) -> str:
        """A group's ARN by its fixed name, with a wildcard for the UUID the group gets when it is
        created (a Ref would make each launch template depend on the group that uses it)."""
        return Stack.of(self).format_arn(
            service="autoscaling", resource="autoScalingGroup",
            resource_name=f"*:autoScalingGroupName/{group_name}",
            arn_format=ArnFormat.COLON_RESOURCE_NAME)

    @staticmethod
    def _group_arn_finding(group_name: str) -> str:
        """cdk-nag's wildcard finding for `_group_arn(group_name)`."""
        return ("AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:autoscaling:<AWS::Region>:"
                f"<AWS::AccountId>:autoScalingGroup:*:autoScalingGroupName/{group_name}]")

    def _allow_scaling_workers(self, role: iam.Role) -> None:
        """The master scales the worker group back to its MaxSize for a run, and its idle check
        pauses the cluster: both groups to 0 (launch/cluster/idle.py)."""
        role.add_to_policy(iam.PolicyStatement(
            sid="ScaleClusterGroups", actions=["autoscaling:SetDesiredCapacity"],
            resources=[self._group_arn(self.worker_group_name),
                       self._group_arn(self.master_group_name)]))
        acknowledge(
            role, self._group_arn_finding(self.worker_group_name),
            "Only the worker group, by name (the UUID in a group's ARN is assigned when the group "
            "is created): a training run scales it back to its MaxSize and the idle check to zero.")
        # The master group's ARN is acknowledged with ReportOwnBootFailure (same resource).

    def _allow_address_association(self, role: iam.Role, address: ec2.CfnEIP) -> None:
        stack = Stack.of(self)
        role.add_to_policy(iam.PolicyStatement(
            sid="AttachMasterAddress", actions=["ec2:AssociateAddress"],
            resources=[stack.format_arn(service="ec2", resource="elastic-ip",
                                        resource_name=address.attr_allocation_id)]))
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

    # --- boot logs and boot failures -----------------------------------------------------------

    def _boot_reporting(self, boot_failure_limit: int, log_retention_days: int) -> None:
        """The deployment's log group, which each node's CloudWatch agent fills with its boot
        logs, and the boot steps as an S3 asset: the user data only fetches them, so it stays far
        below EC2's 16 KB limit however they grow (docs/infra.md, "Boot logs")."""
        stack = Stack.of(self)
        self.boot_failure_limit = boot_failure_limit
        # Retained when the stack is deleted: the logs are what explains a failure afterwards.
        # Hence unique per stack (its id's UUID): a fixed name would make the next deployment of
        # the same stack fail to create the group the last one left behind.
        self.node_log_group = logs.CfnLogGroup(
            self, "NodeLogs", retention_in_days=log_retention_days,
            log_group_name=Fn.join("", [f"/maskrcnn/{stack.stack_name}/nodes-",
                                        Fn.select(2, Fn.split("/", Aws.STACK_ID))]))
        self.node_log_group.apply_removal_policy(RemovalPolicy.RETAIN)
        self.boot_steps = s3_assets.Asset(self, "BootSteps", path=str(CLUSTER_NODE_SCRIPT))
        # A node runs the object only if it is what was synthesized: whoever may write to the CDK
        # assets bucket could otherwise change what every node runs as root.
        self.boot_steps_sha256 = sha256_of(CLUSTER_NODE_SCRIPT)

    def _boot_failure_guard(self, prefix: str, role: iam.IRole,
                            group_name: str) -> dict[str, str]:
        """The group's count of consecutive failed boots, and the statements a node of the group
        needs to report its boot: count (ssm), stop its own group launching at the limit
        (autoscaling), tell the alerts topic (sns), ship its boot logs (logs), fetch the boot
        steps (s3). Returns the cluster.env lines that name them (cluster_node_bootstrap.sh)."""
        stack = Stack.of(self)
        name = f"/maskrcnn/{stack.stack_name}/boot-failures/{prefix.lower()}"
        # Not retained: a count of this deployment's boots means nothing to the next one.
        ssm.StringParameter(
            self, f"{prefix}BootFailures", parameter_name=name, string_value="0",
            description=f"Consecutive failed node boots of {group_name}; at "
                        f"{self.boot_failure_limit} the group stops launching")
        role.add_to_principal_policy(iam.PolicyStatement(
            sid="CountOwnBootFailures", actions=["ssm:GetParameter", "ssm:PutParameter"],
            resources=[stack.format_arn(service="ssm", resource="parameter",
                                        resource_name=name.lstrip("/"))]))
        # Same resource as ReportOwnBootFailure (acknowledged there): the group, by name.
        role.add_to_principal_policy(iam.PolicyStatement(
            sid="StopOwnGroupLaunching", actions=["autoscaling:SuspendProcesses"],
            resources=[self._group_arn(group_name)]))
        role.add_to_principal_policy(iam.PolicyStatement(
            sid="AlertBootFailures", actions=["sns:Publish"],
            resources=[self.notification_topic.topic_arn]))
        # The group's ARN ends in ":*", which covers its streams (PutLogEvents is on a stream).
        role.add_to_principal_policy(iam.PolicyStatement(
            sid="ShipBootLogs",
            actions=["logs:CreateLogStream", "logs:DescribeLogStreams", "logs:PutLogEvents"],
            resources=[self.node_log_group.attr_arn]))
        role.add_to_principal_policy(iam.PolicyStatement(
            sid="FetchBootSteps", actions=["s3:GetObject"],
            resources=[self.boot_steps.bucket.arn_for_objects(self.boot_steps.s3_object_key)]))
        return {
            "ASG_NAME": group_name,
            "BOOT_FAILURES_PARAMETER": name,
            "BOOT_FAILURE_LIMIT": str(self.boot_failure_limit),
            "ALERTS_TOPIC_ARN": self.notification_topic.topic_arn,
            "LOG_GROUP": self.node_log_group.ref,
            "BOOT_SCRIPT_URL": self.boot_steps.s3_object_url,
            "BOOT_SCRIPT_SHA256": self.boot_steps_sha256,
        }

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
            # Security groups and the public address are set on the network interfaces below.
            user_data=user_data,
            require_imdsv2=True,
            block_devices=[ec2.BlockDevice(
                device_name=ROOT_DEVICE,
                volume=ec2.BlockDeviceVolume.ebs(
                    node.ebs_volume_size_gib, encrypted=True, delete_on_termination=True,
                    volume_type=ec2.EbsDeviceVolumeType.GP3))],
            key_pair=key_pair,
        )
        launch_template_data = template.node.default_child
        # CDK's LaunchTemplate builds at most one interface: the whole list is set on the L1.
        launch_template_data.add_property_override(
            "LaunchTemplateData.NetworkInterfaces",
            network_interfaces([g.security_group_id for g in groups],
                               efa_interfaces=node.efa_interfaces, public=public,
                               efa_only=efa_only_beyond_card0(node.instance_type)))
        if self.placement_group is not None:
            # By Ref (which is the group's name), set on the L1 resource: CDK's `placement_group`
            # would use Fn::GetAtt, which the local CloudFormation emulator used in the tests
            # lacks.
            launch_template_data.add_property_override(
                "LaunchTemplateData.Placement.GroupName", self.placement_group.ref)
        for key, value in capacity_overrides(node).items():
            launch_template_data.add_property_override(f"LaunchTemplateData.{key}", value)
        # Spot applies to the workers only: losing a worker costs a run its last steps, losing the
        # master (rank 0, slurmctld and its queue) would stop the cluster.
        for key, value in (spot_overrides(node) if prefix == "Worker" else {}).items():
            launch_template_data.add_property_override(f"LaunchTemplateData.{key}", value)

        group = autoscaling.AutoScalingGroup(
            self, f"{prefix}Group",
            vpc=vpc,
            vpc_subnets=ec2.SubnetSelection(subnets=[subnet]),
            launch_template=template,
            # No DesiredCapacity: CloudFormation sets a group's size properties to the template's
            # values whenever it updates the group (a new image tag alone gives a new launch
            # template version), and the update policy that could stop it,
            # IgnoreUnmodifiedGroupSizeProperties, applies only to groups with a scheduled action.
            # So the template holds only what pause, resume and the idle check never change:
            # MinSize 0 and MaxSize, the configured size. The group starts at MinSize (0 nodes);
            # `maskrcnn cluster resume` sets it to MaxSize, and a redeploy leaves the running size
            # as it is (docs/infra.md, "Pause, resume and idle scale-down").
            min_capacity=0, max_capacity=size,
            auto_scaling_group_name=group_name,
            # A replacement node that fails its boot marks itself unhealthy; the group then
            # terminates and relaunches it. Errors in doing so reach the user by SNS.
            notifications=[autoscaling.NotificationConfiguration(
                topic=self.notification_topic, scaling_events=autoscaling.ScalingEvents.ERRORS)],
        )
        Tags.of(group).add("Name", group_name)
        acknowledge(
            group, "AwsSolutions-AS3",
            "Launch and terminate errors are notified (the SNS topic); successful launches "
            "and terminations are the user's own resumes, pauses and destroys, the "
            "master's idle scale-down and a run's scale-up, visible in the group's activity "
            "history.")

        # The logical id is known only once the group exists; the user data is rendered at synth.
        env = {**env, "ASG_LOGICAL_ID": Stack.of(self).get_logical_id(group.node.default_child),
               **self._boot_failure_guard(prefix, role, group_name)}
        # The boot steps (cluster_node.sh) are not in the user data: the bootstrap fetches them.
        user_data.add_commands(
            f"mkdir -p {CLUSTER_DIR}",
            f"cat > {CLUSTER_ENV} <<'EOF'",
            *(f"{key}={value}" for key, value in env.items()),
            "EOF",
            script_body(CLUSTER_NODE_BOOTSTRAP),
        )
        return group

