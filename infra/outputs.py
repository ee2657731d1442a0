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
# EfsClusterStack: the AMI id the nodes run (the one cdk.context.json keeps, or ami_id; offline, the SSM parameter).
CLUSTER_AMI_ID = "ClusterAmiId"

# Both training stacks: the console URL of the deployment's CloudWatch dashboard.
DASHBOARD_URL = "DashboardUrl"

# Both training stacks, when fsx_lustre_storage_gib > 0: the FSx for Lustre file system.
LUSTRE_FILE_SYSTEM_ID = "LustreFileSystemId"
LUSTRE_MOUNT_NAME = "LustreMountName"          # the SageMaker channel's path starts /<mount name>
LUSTRE_SUBNET_ID = "LustreSubnetId"            # its zone's private subnet: where jobs must run

# The FSx for Lustre file system shows s3://<data bucket>/<LUSTRE_IMPORT_PREFIX>/ as files, so the
# dataset staged under data/coco (maskrcnn data upload) is <mount>/coco: /fsx/coco on the cluster.
LUSTRE_IMPORT_PREFIX = "data"
LUSTRE_COCO_DIR = "coco"
