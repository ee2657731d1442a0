#!/bin/bash
# On-start lifecycle script of the SageMaker notebook. SageMaker runs it as root at every start
# (limit: 5 minutes); the stack prepends FILE_SYSTEM_ID, AWS_REGION, STACK_NAME, PROJECT_CODE_URL,
# NOTEBOOK_IDLE_MINUTES and, unless that is 0, IDLE_STOP_SOURCE (notebook_idle_stop.py). Unpacks
# the project into the Jupyter root on the first start, installs the idle stop, and mounts the
# shared EFS at ~/efs (shown as `efs` in the file browser), where COCO staged once serves the
# training jobs and the cluster.
set -euo pipefail

MOUNT=/home/ec2-user/efs
JUPYTER_ROOT=/home/ec2-user/SageMaker
CODE_DIR=$JUPYTER_ROOT/maskrcnn-on-aws
OPTIONS=nfsvers=4.1,rsize=1048576,wsize=1048576,hard,timeo=600,retrans=2,noresvport

# The project (code, docs, notebooks/sagemaker_training.ipynb), once: the Jupyter root is on the
# notebook's persistent volume, and a later start must not overwrite the user's edits. Rename
# the folder and restart the notebook to get the version deployed since.
if [ ! -e "$CODE_DIR" ]; then
  staging=$(mktemp -d)
  aws s3 cp --only-show-errors "$PROJECT_CODE_URL" "$staging/project.zip"
  python3 -m zipfile -e "$staging/project.zip" "$staging/project"
  mv "$staging/project" "$CODE_DIR"
  rm -rf "$staging"
  chown -R ec2-user:ec2-user "$CODE_DIR"
fi
ln -sfn "$MOUNT" "$JUPYTER_ROOT/efs"

# The stack this notebook belongs to: `maskrcnn sagemaker`, `endpoint` and `data` and the notebook
# read it to find the deployment's stacks when they have a name prefix (launch/deployment.py).
printf '%s\n' "$STACK_NAME" > "$JUPYTER_ROOT/.maskrcnn-stack"
chown ec2-user:ec2-user "$JUPYTER_ROOT/.maskrcnn-stack"

# The project's command in a notebook terminal (`maskrcnn data to-efs ...`, `maskrcnn sagemaker
# start ...`), with the terminal's Python. At every start: only the Jupyter root outlives a stop.
cat > /usr/local/bin/maskrcnn <<WRAPPER
#!/bin/bash
PYTHONPATH="$CODE_DIR\${PYTHONPATH:+:\$PYTHONPATH}" exec python3 -m launch.cli "\$@"
WRAPPER
chmod 0755 /usr/local/bin/maskrcnn

# Idle stop (docs/infra.md, "Notebook auto-stop"): a systemd timer (AL2023 has no cron) runs the
# check every 5 minutes. Installed at every start: only the Jupyter root outlives a stop. It runs
# as the notebook user, with no more rights than a notebook terminal has, from a file that user
# cannot change.
if (( NOTEBOOK_IDLE_MINUTES > 0 )); then
  printf '%s' "$IDLE_STOP_SOURCE" > /usr/local/sbin/notebook-idle-stop
  chmod 0755 /usr/local/sbin/notebook-idle-stop
  cat > /etc/systemd/system/notebook-idle-stop.service <<UNIT
[Unit]
Description=Stop this notebook instance after $NOTEBOOK_IDLE_MINUTES idle minutes

[Service]
Type=oneshot
User=ec2-user
ExecStart=/usr/bin/python3 /usr/local/sbin/notebook-idle-stop --idle-minutes $NOTEBOOK_IDLE_MINUTES
UNIT
  cat > /etc/systemd/system/notebook-idle-stop.timer <<'UNIT'
[Unit]
Description=Check every 5 minutes whether this notebook instance is idle

[Timer]
OnActiveSec=5min
OnUnitActiveSec=5min

[Install]
WantedBy=timers.target
UNIT
  # A notebook that does not stop itself costs less than one that does not start.
  if ! { systemctl daemon-reload && systemctl enable --now notebook-idle-stop.timer; }; then
    echo "could not start notebook-idle-stop.timer: this notebook will not stop when idle" >&2
  fi
fi

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
# Bounded so the script ends within SageMaker's 5 minutes: seconds for the project, 1 minute for
# the helper's install, then 5 x (30 s mount + 10 s pause).
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
