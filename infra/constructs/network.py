"""The VPC both training paths share: public and private subnets, NAT, an S3 gateway endpoint and
flow logs."""
from __future__ import annotations

from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_s3 as s3
from constructs import Construct

VPC_CIDR = "10.0.0.0/16"


class Network(Construct):
    """Two availability zones (SageMaker jobs get capacity in either; the EC2 cluster uses the
    first, since a cluster placement group lives in one zone), one NAT gateway (the largest fixed
    cost here; one per zone would add ~$33/month each for zone-failure tolerance a training
    environment does not need) and an S3 gateway endpoint so dataset and checkpoint traffic skips
    the NAT's per-GB charge."""

    def __init__(self, scope: Construct, id: str, *, flow_log_bucket: s3.IBucket,
                 max_azs: int = 2, nat_gateways: int = 1) -> None:
        super().__init__(scope, id)
        self.vpc = ec2.Vpc(
            self, "Vpc",
            ip_addresses=ec2.IpAddresses.cidr(VPC_CIDR),
            max_azs=max_azs,
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
