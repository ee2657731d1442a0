"""Stand-ins for deployed AWS state, shared by every test folder (tests/ is on sys.path through
tests/conftest.py): a SageMakerStack as the launchers see it, and request capture."""
import json

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


def capture_requests(session, operation="CreateTrainingJob"):
    """JSON bodies of SageMaker `operation` requests as they leave botocore for the server.

    moto's describe drops fields (NOTES.md), so tests assert on what was sent."""
    seen = []
    session.events.register(f"before-send.sagemaker.{operation}",
                            lambda request, **kw: seen.append(json.loads(request.body)))
    return seen
