"""The VPC both training paths share: public and private subnets, NAT, an S3 gateway endpoint and
flow logs."""
from __future__ import annotations

from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_s3 as s3
from constructs import Construct

VPC_CIDR = "10.0.0.0/16"


class Network(Construct):
    """Two availability zones (SageMaker jobs get capacity in either; the EC2 cluster uses one,
    since a cluster placement group lives in one zone: the first, or the one configured), one NAT
    gateway (the largest fixed cost here; one per zone would add ~$33/month each for
    zone-failure tolerance a training environment does not need) and an S3 gateway endpoint so
    dataset and checkpoint traffic skips the NAT's per-GB charge."""

    def __init__(self, scope: Construct, id: str, *, flow_log_bucket: s3.IBucket,
                 availability_zones: tuple[str, ...] | None = None, max_azs: int = 2,
                 nat_gateways: int = 1) -> None:
        super().__init__(scope, id)
        # Named zones (availability_zones) or the region's first `max_azs`; CDK takes one or
        # the other. Subnets are listed in the zones' order.
        zones = (dict(availability_zones=list(availability_zones)) if availability_zones
                 else dict(max_azs=max_azs))
        self.vpc = ec2.Vpc(
            self, "Vpc",
            ip_addresses=ec2.IpAddresses.cidr(VPC_CIDR),
            **zones,
            nat_gateways=nat_gateways,
            subnet_configuration=[
                ec2.SubnetConfiguration(name="Public", subnet_type=ec2.SubnetType.PUBLIC,
                                        cidr_mask=24),
                # /20: room for many SageMaker job ENIs and cluster nodes per zone.
                ec2.SubnetConfiguration(name="Private",
                                        subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS,
                                        cidr_mask=20),
            ],
            gateway_endpoints={"S3": ec2.GatewayVpcEndpointOptions(
                service=ec2.GatewayVpcEndpointAwsService.S3)},
            # Flow logs to S3 rather than CloudWatch Logs: no IAM role, and a fraction of the
            # ingestion price for what is an audit trail. They land under AWSLogs/ in the bucket.
            flow_logs={"FlowLogs": ec2.FlowLogOptions(
                destination=ec2.FlowLogDestination.to_s3(flow_log_bucket),
                traffic_type=ec2.FlowLogTrafficType.ALL)},
        )

    @property
    def private_subnets(self) -> list[ec2.ISubnet]:
        return self.vpc.private_subnets

    @property
    def public_subnets(self) -> list[ec2.ISubnet]:
        return self.vpc.public_subnets


def allow_all_traffic_within(group: ec2.SecurityGroup, members: str) -> None:
    """All traffic among the members of `group`, in both directions.

    EFA traffic is not IP traffic: AWS requires a rule admitting all traffic from the group itself
    inbound *and* a rule to the group itself outbound (an outbound 0.0.0.0/0 rule does not cover
    it), for EC2 EFA instances and for SageMaker jobs on EFA instance types alike. `group` keeps
    allow_all_outbound=True for AWS APIs; on such a group CDK silently ignores add_egress_rule,
    and it refuses an all-traffic 0.0.0.0/0 egress rule on one without, so the rule to itself is
    declared as its own resource.
    """
    group.add_ingress_rule(group, ec2.Port.all_traffic(), f"All traffic from {members}")
    ec2.CfnSecurityGroupEgress(
        group, "EgressToItself", group_id=group.security_group_id, ip_protocol="-1",
        destination_security_group_id=group.security_group_id,
        description=f"All traffic to {members}")
