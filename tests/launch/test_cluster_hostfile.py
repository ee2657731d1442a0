"""Hostfile from the auto-scaling groups, against moto EC2 and auto-scaling."""
import boto3
import pytest

from launch.aws import LaunchError
from launch.cluster import hostfile
from launch.cluster.hostfile import discover_nodes, read_cluster_env


def _cluster(session, *, master_type="p4d.24xlarge", worker_type="p4d.24xlarge", workers=2):
    ec2, asg = session.client("ec2"), session.client("autoscaling")
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.1.0/24")["Subnet"]["SubnetId"]
    for name, itype in (("master-lt", master_type), ("worker-lt", worker_type)):
        ec2.create_launch_template(LaunchTemplateName=name,
                                   LaunchTemplateData={"ImageId": "ami-12c6146b", "InstanceType": itype})
    for name, lt, count in (("cluster-master", "master-lt", 1), ("cluster-workers", "worker-lt", workers)):
        asg.create_auto_scaling_group(AutoScalingGroupName=name, LaunchTemplate={"LaunchTemplateName": lt},
                                      MinSize=count, MaxSize=count, DesiredCapacity=count,
                                      VPCZoneIdentifier=subnet)
    return asg


def test_hostfile_lists_master_first_with_gpu_slots(aws_env):
    session = boto3.session.Session()
    _cluster(session, worker_type="g5.12xlarge")
    nodes = discover_nodes(session, master_asg="cluster-master", worker_asg="cluster-workers")
    assert [n.role for n in nodes] == ["master", "worker", "worker"]
    assert [n.gpus for n in nodes] == [8, 4, 4]
    lines = hostfile.hostfile_text([n.as_node() for n in nodes]).splitlines()
    assert lines == [f"{nodes[0].private_ip} slots=8", f"{nodes[1].private_ip} slots=4",
                     f"{nodes[2].private_ip} slots=4"]
    assert all(ip.startswith("10.0.1.") for ip in (n.private_ip for n in nodes))


def test_cpu_instances_get_one_slot_and_unhealthy_instances_are_left_out(aws_env):
    session = boto3.session.Session()
    asg = _cluster(session, master_type="c5.xlarge", worker_type="c5.xlarge", workers=2)
    workers = asg.describe_auto_scaling_groups(AutoScalingGroupNames=["cluster-workers"])
    sick = workers["AutoScalingGroups"][0]["Instances"][0]["InstanceId"]
    asg.set_instance_health(InstanceId=sick, HealthStatus="Unhealthy")
    nodes = discover_nodes(session, master_asg="cluster-master", worker_asg="cluster-workers")
    assert sick not in {n.instance_id for n in nodes}
    assert [(n.role, n.gpus, n.as_node().slots) for n in nodes] == [("master", 0, 1), ("worker", 0, 1)]


def test_missing_group_is_a_clear_error(aws_env):
    session = boto3.session.Session()
    _cluster(session)
    with pytest.raises(LaunchError, match="cluster-typo.*not found"):
        discover_nodes(session, master_asg="cluster-master", worker_asg="cluster-typo")


def test_cli_reads_cluster_env_and_writes_hostfile(aws_env, tmp_path):
    session = boto3.session.Session()
    _cluster(session, workers=1)
    env_file = tmp_path / "cluster.env"
    env_file.write_text("STACK_NAME=EfsClusterStack\nAWS_REGION=us-east-1\nROLE=master\n"
                        "MASTER_ASG_NAME=cluster-master\nWORKER_ASG_NAME=cluster-workers\n")
    assert read_cluster_env(str(env_file))["ROLE"] == "master"
    out = tmp_path / "hostfile"
    assert hostfile.main(["--cluster-env", str(env_file), "--out", str(out)]) == 0
    assert [line.split()[1] for line in out.read_text().splitlines()] == ["slots=8", "slots=8"]


def test_missing_cluster_env_names_the_fix(tmp_path):
    with pytest.raises(LaunchError, match="not found: run this on a cluster node"):
        read_cluster_env(str(tmp_path / "nope.env"))
