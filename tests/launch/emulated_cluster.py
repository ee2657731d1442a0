"""What the emulated EC2 cluster tests share (tests/emulated_hosts.py gives the hosts): the training
settings of a short multi-node run, the auto-scaling groups in the master's moto server, and how a host
gets the address moto gave its instance.

The training run: one CPU rank per node, 2 images each: global batch 6; 24 images an epoch = 4 steps;
3 epochs. The claims need a checkpoint before a node is lost (epoch 1's) and steps after the resume,
not many steps. No evaluation (DATA.VAL=()): the claims are about the cluster, and evaluation across
ranks is tested elsewhere (tests/training/test_startup_devices.py, tests/launch/test_sagemaker_multihost.py).
"""
import subprocess
import sys
from pathlib import Path

from training.configs import cpu_synthetic

REPO = Path(__file__).resolve().parents[2]
VPC_CIDR = "10.0.0.0/16"
SUBNET_CIDR = "10.0.2.0/24"
MOTO_PORT = 5000
GROUPS = {"master": ("emulated-master-asg", 1), "worker": ("emulated-worker-asg", 2)}
EPOCHS, STEPS_PER_EPOCH = 3, 4
MAX_STEPS = EPOCHS * STEPS_PER_EPOCH
TRAINING = [*cpu_synthetic.OVERRIDES, "DATA.VAL=()", f"TRAIN.IMAGES_PER_EPOCH={3 * 2 * STEPS_PER_EPOCH}",
            f"TRAIN.LR_EPOCH_SCHEDULE=[({EPOCHS - 1}, 0.5), ({EPOCHS}, None)]",
            "TRAIN.LOG_PERIOD=1", "TRAIN.WARMUP=2", "PREPROC.TRAIN_SHORT_EDGE_SIZE=[96, 96]",
            "PREPROC.TEST_SHORT_EDGE_SIZE=96", "PREPROC.MAX_SIZE=96", "RPN.TRAIN_PER_LEVEL_NMS_TOPK=100",
            "RPN.TEST_PER_LEVEL_NMS_TOPK=100"]

# Run inside the master against its moto: the stack's two groups (CPU instances: one slot each),
# then the private IP of every InService instance per group.
CREATE_GROUPS = f"""
import json, boto3
ec2, asg = boto3.client("ec2"), boto3.client("autoscaling")
vpc = ec2.create_vpc(CidrBlock="{VPC_CIDR}")["Vpc"]["VpcId"]
subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="{SUBNET_CIDR}")["Subnet"]["SubnetId"]
ec2.create_launch_template(LaunchTemplateName="node", LaunchTemplateData={{"ImageId": "ami-12c6146b",
                                                                         "InstanceType": "c5.xlarge"}})
ips = {{}}
for role, (name, size) in {GROUPS!r}.items():
    asg.create_auto_scaling_group(AutoScalingGroupName=name, LaunchTemplate={{"LaunchTemplateName": "node"}},
                                  MinSize=size, MaxSize=size, DesiredCapacity=size, VPCZoneIdentifier=subnet)
    ids = [i["InstanceId"] for i in asg.describe_auto_scaling_groups(AutoScalingGroupNames=[name])
           ["AutoScalingGroups"][0]["Instances"]]
    ips[role] = sorted(i["PrivateIpAddress"] for r in ec2.describe_instances(InstanceIds=ids)["Reservations"]
                       for i in r["Instances"])
print(json.dumps(ips))
"""
# Run inside the master against its moto: the group replaces the instance at the given IP, as it does
# an instance that failed its health checks; prints the replacement's IP.
REPLACE_INSTANCE = """
import boto3, sys
ec2, asg = boto3.client("ec2"), boto3.client("autoscaling")
dead = ec2.describe_instances(Filters=[{"Name": "private-ip-address", "Values": [sys.argv[1]]}])
dead = dead["Reservations"][0]["Instances"][0]["InstanceId"]
asg.terminate_instance_in_auto_scaling_group(InstanceId=dead, ShouldDecrementDesiredCapacity=False)
group = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[sys.argv[2]])["AutoScalingGroups"][0]
ids = [i["InstanceId"] for i in group["Instances"] if i["LifecycleState"] == "InService"]
ips = [i["PrivateIpAddress"] for r in ec2.describe_instances(InstanceIds=ids)["Reservations"] for i in r["Instances"]]
print([ip for ip in ips if ip != sys.argv[1] and ip not in sys.argv[3:]][0])
"""


def _host_env(**extra) -> dict[str, str]:
    """What the image's processes see: its Python first on PATH, Keras 2, fake AWS credentials."""
    return {"PATH": f"{Path(sys.executable).parent}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": "/root", "LANG": "C.UTF-8", "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO),
            "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2",
            "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1",
            "AWS_DEFAULT_REGION": "us-east-1", **extra}


def _readdress(host, address: str) -> None:
    """Give ``host`` the private IP moto chose for its instance (the hosts exist before moto runs)."""
    for cmd in (["addr", "flush", "dev", "eth0"], ["addr", "add", f"{address}/24", "dev", "eth0"]):
        subprocess.run(["ip", "-n", host.netns, *cmd], check=True, capture_output=True)
    host.address = address

