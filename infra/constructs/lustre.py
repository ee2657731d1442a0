"""The optional FSx for Lustre file system: a fast, S3-linked read cache of the dataset for the EC2
cluster (mounted at /fsx) and SageMaker jobs (an FSxLustre train channel).

AWS's DLAMI cluster example (awslabs/deeplearning-cfn) measured about 10 minutes for what took 46 on EFS when the data is read from Lustre. The
file system lives in one zone (the cluster's), in a private subnet, and shows the objects under
s3://<data bucket>/<LUSTRE_IMPORT_PREFIX>/ as files, loading each one from S3 on first read.
"""
from __future__ import annotations

from aws_cdk import RemovalPolicy, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_fsx as fsx
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_ssm as ssm
from constructs import Construct

from infra.outputs import LUSTRE_IMPORT_PREFIX

# Lustre clients talk to the file servers on 988 and 1018-1023 (FSx for Lustre user guide, "File
# system access control with Amazon VPC"); the servers also talk among themselves on those ports.
LUSTRE_PORTS = (ec2.Port.tcp(988), ec2.Port.tcp_range(1018, 1023))


class LustreCache(Construct):
    """A SCRATCH_2 file system linked to the data bucket (when `storage_gib` > 0), its security
    group (always), and the SSM parameters other stacks read.

    The security group exists whether or not the file system does: the training stacks add rules
    that reference it, and EC2 refuses to delete a group that another group's rules still name.
    `cdk deploy` updates this stack before the training stacks, so turning FSx off would otherwise
    fail on the group while the old rules exist. An empty group costs nothing.

    SCRATCH_2, not PERSISTENT_2: the data's copy of record is the bucket (and EFS), so the cheaper
    type whose servers do not replicate is enough; a lost file server costs a re-read from S3.
    For the same reason it is destroyed with the stack, not retained: nothing on it is unique
    (checkpoints and logs stay on EFS; the import path is read-only in that direction: no export
    path is set, so nothing written to /fsx reaches the bucket).
    """

    def __init__(self, scope: Construct, id: str, *, vpc: ec2.IVpc, subnet: ec2.ISubnet,
                 storage_gib: int, data_bucket: s3.IBucket) -> None:
        super().__init__(scope, id)
        self.security_group = ec2.SecurityGroup(
            self, "SecurityGroup", vpc=vpc, allow_all_outbound=False,
            description="FSx for Lustre: Lustre ports only from the cluster and training-job "
                        "security groups, and between the file servers")
        # Between the file servers: LustreFileSystem admits 988-1023 from the group itself
        # (inbound); the outbound half is added here, as allow_all_outbound=False keeps the
        # group from reaching anything else.
        for port in LUSTRE_PORTS:
            self.security_group.add_egress_rule(self.security_group, port,
                                                "Lustre between the file servers")
        self.subnet = subnet
        prefix = f"/maskrcnn/{Stack.of(self).stack_name}/lustre"
        self.parameter_names = {
            "file_system_id": f"{prefix}/file-system-id",
            "dns_name": f"{prefix}/dns-name",
            "mount_name": f"{prefix}/mount-name",
            "security_group_id": f"{prefix}/security-group-id",
        }
        self._add_parameter("security_group_id", self.security_group.security_group_id)
        self.file_system: fsx.LustreFileSystem | None = None
        if not storage_gib:
            return
        self.file_system = fsx.LustreFileSystem(
            self, "FileSystem", vpc=vpc, vpc_subnet=subnet, storage_capacity_gib=storage_gib,
            security_group=self.security_group,
            # FSx's default is Lustre 2.10, which AWS no longer recommends for new file systems.
            # Changing the version replaces the file system (here: a fresh cache, reloaded from
            # the bucket).
            file_system_type_version=fsx.FileSystemTypeVersion.V_2_15,
            lustre_configuration=fsx.LustreConfiguration(
                deployment_type=fsx.LustreDeploymentType.SCRATCH_2,
                import_path=f"s3://{data_bucket.bucket_name}/{LUSTRE_IMPORT_PREFIX}",
                # Objects uploaded after creation (`maskrcnn data upload`) appear without a
                # manual import task.
                auto_import_policy=fsx.LustreAutoImportPolicy.NEW_CHANGED_DELETED),
            removal_policy=RemovalPolicy.DESTROY)
        # Read by the training stacks at deploy time (as the EFS id is, see file_system.py):
        # CloudFormation refuses to remove an export another stack imports, so with exports the
        # option could not be switched off while a training stack exists.
        for key in ("file_system_id", "dns_name", "mount_name"):
            self._add_parameter(key, getattr(self.file_system, key))

    @property
    def enabled(self) -> bool:
        return self.file_system is not None

    def _add_parameter(self, key: str, value: str) -> None:
        ssm.StringParameter(
            self, "".join(part.title() for part in key.split("_")) + "Parameter",
            parameter_name=self.parameter_names[key], string_value=value,
            description=f"FSx for Lustre {key.replace('_', ' ')}, read by the training stacks")

    def value_in(self, scope: Construct, key: str) -> str:
        """A value ('file_system_id', 'dns_name', 'mount_name', 'security_group_id') as `scope`'s
        stack may use it: from the SSM parameter, resolved at deploy."""
        stack = Stack.of(scope)
        if stack is Stack.of(self):
            raise ValueError("read the attributes directly within the file system's own stack")
        stack.add_stack_dependency(Stack.of(self), "reads the Lustre file system's parameters")
        return ssm.StringParameter.value_for_string_parameter(stack, self.parameter_names[key])


def allow_lustre_from(scope: Construct, id: str, *, cache: LustreCache,
                      peer: ec2.ISecurityGroup, clients: str) -> None:
    """Lustre traffic between the file system and the clients in `peer`, both ways, declared in
    `scope`'s stack (the client's), for the same reason as file_system.allow_nfs_from: no
    dependency cycle.

    Lustre servers also open connections to their clients: the FSx for Lustre user guide ("File
    system access control with Amazon VPC") asks for the Lustre ports inbound and outbound on
    both the file system's and the clients' groups. The client groups allow all outbound traffic
    already (cluster nodes, training jobs) and all traffic among their own members.
    """
    group = ec2.SecurityGroup.from_security_group_id(
        scope, id, cache.value_in(scope, "security_group_id"), mutable=True,
        allow_all_outbound=False)
    for port in LUSTRE_PORTS:
        tcp = f"TCP {port.to_string()}"
        group.add_ingress_rule(peer, port, f"Lustre from {clients} ({tcp})")
        group.add_egress_rule(peer, port, f"Lustre to {clients} ({tcp})")
        peer.add_ingress_rule(group, port, f"Lustre file servers to {clients} ({tcp})")
