"""Names of the CloudFormation outputs: one source of truth for the stacks that write them and the
launchers that read them (launch/). Plain constants, importable without aws-cdk-lib."""

# Stack names, as `cdk deploy <name>` takes them.
EFS_CLUSTER_STACK = "EfsClusterStack"
SAGEMAKER_STACK = "SageMakerStack"

# Shared by both stacks
FILE_SYSTEM_ID = "FileSystemId"
BUCKET_NAME = "BucketName"
TRAINING_IMAGE_URI = "TrainingImageUri"
PRIVATE_SUBNET_IDS = "PrivateSubnetIds"          # comma-separated

# SageMakerStack
TRAINING_SECURITY_GROUP_ID = "TrainingSecurityGroupId"
TRAINING_ROLE_ARN = "TrainingRoleArn"
NOTEBOOK_ROLE_ARN = "NotebookRoleArn"
NOTEBOOK_NAME = "NotebookInstanceName"

# EfsClusterStack
MASTER_ASG_NAME = "MasterAutoScalingGroupName"
WORKER_ASG_NAME = "WorkerAutoScalingGroupName"
CONNECT_COMMAND = "ConnectCommand"

# The stack both stacks above build on: VPC, EFS and bucket (defined once, deployed once).
NETWORK_STORAGE_STACK = "NetworkStorageStack"

# EfsClusterStack: the master's Elastic IP (public) address.
MASTER_ADDRESS = "MasterAddress"
# EfsClusterStack: the AMI id the nodes run (the SSM parameter's value at deploy, or the pinned id).
CLUSTER_AMI_ID = "ClusterAmiId"
