"""The node contract: what an EC2 cluster node's boot leaves for the training container and the
commands that run in it, named once for every side that shares it.

- The stack (infra/constructs/cluster.py) writes STACK_KEYS (and, where its settings have them,
  OPTIONAL_STACK_KEYS) into each node's user data as /etc/maskrcnn/cluster.env.
- The boot script (infra/userdata/cluster_node.sh) reads them, mounts EFS_MOUNT (and FSX_MOUNT),
  writes the munge key to MUNGE_KEY, appends BOOT_KEYS from the instance itself, and starts the
  container CONTAINER with CLUSTER_DIR and the mounts inside it.
- The container's entry (docker/entrypoint.sh) and the commands in it (launch/cluster/) read
  CLUSTER_ENV (launch/cluster/node_env.py).

The shell side takes the mounts from cluster.env and names the paths under CLUSTER_DIR literally;
tests/infra/test_node_contract.py fails when any side uses a key or path this module does not name.
"""
from __future__ import annotations

CONTAINER = "maskrcnn"
CLUSTER_DIR = "/etc/maskrcnn"
CLUSTER_ENV = f"{CLUSTER_DIR}/cluster.env"
MUNGE_KEY = f"{CLUSTER_DIR}/munge.key"
HOSTFILE = f"{CLUSTER_DIR}/hostfile"      # a record of the nodes at boot; nothing reads it
PATHS = (CLUSTER_DIR, CLUSTER_ENV, MUNGE_KEY, HOSTFILE)

EFS_MOUNT = "/efs"
# The FSx for Lustre file system, when the app has one (the DLAMI cluster example's run.sh looked here first).
FSX_MOUNT = "/fsx"
# Where the Deep Learning AMI mounts the instance-store NVMe (g5, p4d, p5 have it): a local copy
# of the dataset there takes the reads off EFS during training.
NVME_MOUNT = "/opt/dlami/nvme"

# cluster.env, written by the stack into every node's user data.
STACK_KEYS = frozenset({
    "STACK_NAME", "AWS_REGION", "ROLE", "FILE_SYSTEM_ID", "BUCKET_NAME", "TRAINING_IMAGE_URI",
    "MASTER_ASG_NAME", "WORKER_ASG_NAME", "MUNGE_KEY_SECRET_NAME", "WORKER_COUNT", "EFA_INTERFACES",
    "EFS_MOUNT", "NVME_MOUNT", "VPC_CIDR", "IDLE_SCALEDOWN_MINUTES", "ASG_LOGICAL_ID",
    # what the boot script needs to report a failed boot (cluster_node_bootstrap.sh)
    "ASG_NAME", "BOOT_FAILURES_PARAMETER", "BOOT_FAILURE_LIMIT", "ALERTS_TOPIC_ARN", "LOG_GROUP",
    "BOOT_SCRIPT_URL", "BOOT_SCRIPT_SHA256",
})
# ... only with FSx for Lustre (FSX_*), or on a master with a public address (EIP_ALLOCATION_ID).
OPTIONAL_STACK_KEYS = frozenset({"FSX_MOUNT", "FSX_DNS_NAME", "FSX_MOUNT_NAME", "EIP_ALLOCATION_ID"})
# Appended by the boot script from the instance itself.
BOOT_KEYS = frozenset({"PRIVATE_IP", "INSTANCE_ID", "INSTANCE_TYPE", "SLOTS", "LOCAL_NVME"})
# Set only where no real node runs (the emulated hosts of the tests): the CPUs Slurm may give a node.
EMULATION_KEYS = frozenset({"NODE_CPUS"})
CLUSTER_ENV_KEYS = STACK_KEYS | OPTIONAL_STACK_KEYS | BOOT_KEYS | EMULATION_KEYS
