#!/bin/bash
# On-start lifecycle script of the SageMaker notebook. SageMaker runs it as root at every start
# (limit: 5 minutes); the stack prepends FILE_SYSTEM_ID and AWS_REGION. Mounts the shared EFS at
# ~/efs, where COCO staged once serves both the notebook's training jobs and the EC2 cluster.
set -euo pipefail

MOUNT=/home/ec2-user/efs
OPTIONS=nfsvers=4.1,rsize=1048576,wsize=1048576,hard,timeo=600,retrans=2,noresvport

# Encrypted in transit when the EFS mount helper (amazon-efs-utils, which runs stunnel) is on the
# image or in its package repository; otherwise plain NFS 4.1 inside the VPC (docs/infra.md,
# "EFS and encryption in transit").
if ! command -v mount.efs >/dev/null; then
  timeout 60 dnf install -y -q amazon-efs-utils >/dev/null 2>&1 || true
fi
if command -v mount.efs >/dev/null; then
  MOUNT_COMMAND=(mount -t efs -o tls "$FILE_SYSTEM_ID:/" "$MOUNT")
else
  MOUNT_COMMAND=(mount -t nfs4 -o "$OPTIONS" "$FILE_SYSTEM_ID.efs.$AWS_REGION.amazonaws.com:/"
                 "$MOUNT")
fi

mkdir -p "$MOUNT"
attempt=0
# Bounded so the script ends within SageMaker's 5 minutes: 1 minute for the helper's install,
# then 5 x (30 s mount + 10 s pause).
until mountpoint -q "$MOUNT"; do
  if (( attempt >= 5 )); then
    echo "could not mount $FILE_SYSTEM_ID at $MOUNT" >&2
    exit 1
  fi
  attempt=$((attempt + 1))
  timeout 30 "${MOUNT_COMMAND[@]}" || sleep 10
done

# The notebook user has no root access (RootAccess is disabled), so the first start hands the
# file system's top directory to ec2-user. Cluster nodes and training jobs write as root.
if [ "$(stat -c %u "$MOUNT")" = 0 ]; then
  chown ec2-user:ec2-user "$MOUNT"
fi
