"""Stand-ins for deployed AWS state, shared by every test folder (tests/ is on sys.path through
tests/conftest.py): a SageMakerStack as the launchers see it, and request capture."""
import json
import socket
import subprocess
import sys
import time
import urllib.request

from infra import outputs

FS_ID = "fs-0123456789abcdef0"   # today's EFS ids: fs- + 17 hex characters
BUCKET = "maskrcnn-data-bucket"
STACK_OUTPUTS = {
    outputs.TRAINING_IMAGE_URI: "123456789012.dkr.ecr.us-east-1.amazonaws.com/cdk-hnb659fds-container-assets:abc",
    outputs.TRAINING_ROLE_ARN: "arn:aws:iam::123456789012:role/SageMakerTrainingRole",
    outputs.FILE_SYSTEM_ID: FS_ID,
    outputs.BUCKET_NAME: BUCKET,
    outputs.PRIVATE_SUBNET_IDS: "subnet-0aaa1111bbbb2222c,subnet-0ddd3333eeee4444f",
    outputs.TRAINING_SECURITY_GROUP_ID: "sg-0123456789abcdef0",
}


def deploy_stack(session, name=outputs.SAGEMAKER_STACK, values=STACK_OUTPUTS):
    """A CloudFormation stack in moto whose outputs have the real names and realistic values."""
    template = {"Resources": {"Placeholder": {"Type": "AWS::SNS::Topic"}},
                "Outputs": {k: {"Value": v} for k, v in values.items()}}
    session.client("cloudformation").create_stack(StackName=name, TemplateBody=json.dumps(template))


def node_groups(session, sizes: dict[str, tuple[int, int, int]]) -> str:
    """Auto-scaling groups shaped like the cluster's (`sizes`: name -> (min, max, desired)), on a
    CPU launch template in a new VPC subnet; returns the subnet id."""
    ec2, asg = session.client("ec2"), session.client("autoscaling")
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.2.0/24")["Subnet"]["SubnetId"]
    ec2.create_launch_template(LaunchTemplateName="node-lt", LaunchTemplateData={
        "ImageId": "ami-12c6146b", "InstanceType": "c5.xlarge"})
    for name, (low, high, desired) in sizes.items():
        asg.create_auto_scaling_group(
            AutoScalingGroupName=name, LaunchTemplate={"LaunchTemplateName": "node-lt"},
            MinSize=low, MaxSize=high, DesiredCapacity=desired, VPCZoneIdentifier=subnet)
    return subnet


def capture_requests(session, operation="CreateTrainingJob"):
    """JSON bodies of SageMaker `operation` requests as they leave botocore for the server.

    moto's DescribeTrainingJob returns canned metric definitions and drops the environment, so
    tests assert on what was sent."""
    seen = []
    session.events.register(f"before-send.sagemaker.{operation}",
                            lambda request, **kw: seen.append(json.loads(request.body)))
    return seen


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The server binds port 0 itself and reports the port it got: a port picked here and bound later by
# the server could be taken in between by another test's server, and this test would then talk to it.
_MOTO_SERVER = """
import signal
from moto.server import ThreadedMotoServer
server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
server.start()
print(server.get_host_and_port()[1], flush=True)
signal.pause()
"""


def start_moto_server() -> tuple[subprocess.Popen, str]:
    """A moto server on a free port of 127.0.0.1, answering: (process, endpoint URL).

    Used by the ``moto_server`` fixture and by bench/staging_efs.py; the caller stops it."""
    proc = subprocess.Popen([sys.executable, "-c", _MOTO_SERVER], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    port = proc.stdout.readline().strip()
    if not port.isdigit():
        proc.kill()
        raise RuntimeError("moto server did not start")
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while True:
        try:
            urllib.request.urlopen(url + "/moto-api/", timeout=1)
            return proc, url
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                proc.kill()
                raise RuntimeError("moto server did not start")
            time.sleep(0.2)
