#!/bin/bash
# Boot steps of an EfsClusterStack node (master or worker), run once, as root, on first boot. The
# launch template's user data (cluster.env, then cluster_node_bootstrap.sh) downloads this file
# from the CDK assets bucket, checks its SHA-256 and runs it in its own shell: the boot's log,
# log/retry/imds/signal, INSTANCE_ID, PRIVATE_IP, INSTANCE_TYPE, the settings of cluster.env and
# the reporting of the boot's result (success, or failure at any error) come from there.
#
# What it leaves behind (the contract launch/ builds on; docs/infra.md describes it):
#   /efs                                EFS, mounted now and from /etc/fstab on every reboot
#   /efs/.maskrcnn/$STACK_NAME/nodes/IP one line "IP slots=GPUS" per node that has booted
#   /etc/maskrcnn/hostfile              "IP slots=GPUS" for the InService nodes, master first
#   /fsx                                FSx for Lustre, when cluster.env has FSX_DNS_NAME (the app's
#                                       fsx_lustre_storage_gib option); also in the container
#   LOCAL_NVME in cluster.env           $NVME_MOUNT when the instance has instance-store NVMe
#                                       (then also mounted in the container), else empty
#   container "maskrcnn"                $TRAINING_IMAGE_URI running `cluster-node` (the Slurm
#                                       daemons), restarted by Docker after a reboot, once /efs
#                                       is mounted again
#   /etc/maskrcnn/munge.key             Slurm's authentication key (from Secrets Manager)
#   /usr/local/bin/maskrcnn             the project's command in the container (`maskrcnn job`:
#                                       training runs as Slurm jobs: submit, status, logs, stop, list)
#   maskrcnn-idle.timer                 on the master, unless IDLE_SCALEDOWN_MINUTES is 0: every
#                                       minute the idle check, which scales idle workers to 0
if ! declare -F boot_failed >/dev/null; then
  echo "cluster_node.sh runs inside the user data's cluster_node_bootstrap.sh, not alone" >&2
  exit 2
fi
REGISTRY="$EFS_MOUNT/.maskrcnn/$STACK_NAME/nodes"
# Seconds between checks while the master waits for every node to register.
# Nothing sets the variable on an instance; the boot tests shorten the wait with it.
POLL_SECONDS="${MASKRCNN_BOOT_POLL_SECONDS:-15}"

# The CloudWatch agent ships this boot's log and cloud-init's output to the deployment's log group
# (LOG_GROUP) as they are written, so a failed or hung boot can be read after, or without, the
# node. The Deep Learning AMIs' release notes list the agent among their packages; on an AMI
# without it AWS's package is installed, once its signature checks out against AWS's key. The
# agent's paths can be overridden from the environment: the boot-script tests stand in for the
# agent and serve local files.
CLOUDWATCH_AGENT_CTL=${CLOUDWATCH_AGENT_CTL:-/opt/aws/amazon-cloudwatch-agent/bin/amazon-cloudwatch-agent-ctl}
CLOUDWATCH_AGENT_KEY_URL=${CLOUDWATCH_AGENT_KEY_URL:-https://amazoncloudwatch-agent.s3.amazonaws.com/assets/amazon-cloudwatch-agent.gpg}
# The fingerprint of the key that signs the agent's packages, as AWS publishes it ("Verifying the
# signature of the CloudWatch agent package").
CLOUDWATCH_AGENT_KEY_FINGERPRINT=937616F3450B7D806CBD9725D58167303B789C72
CLOUDWATCH_AGENT_CONFIG=/etc/maskrcnn/cloudwatch-agent.json

agent_package_verified() {  # agent_package_verified DIR: AWS's package in DIR, signed by AWS's key
  local dir=$1 signer
  local url=${CLOUDWATCH_AGENT_URL:-https://amazoncloudwatch-agent-$AWS_REGION.s3.$AWS_REGION.amazonaws.com/ubuntu/$(dpkg --print-architecture)/latest/amazon-cloudwatch-agent.deb}
  retry 5 10 curl -sSf -o "$dir/agent.deb" "$url" || { log "cannot download $url"; return 1; }
  retry 5 10 curl -sSf -o "$dir/agent.deb.sig" "$url.sig" || { log "cannot download $url.sig"; return 1; }
  retry 5 10 curl -sSf -o "$dir/key.gpg" "$CLOUDWATCH_AGENT_KEY_URL" \
    || { log "cannot download $CLOUDWATCH_AGENT_KEY_URL"; return 1; }
  mkdir -m 0700 "$dir/gnupg" || return 1
  # No gpg-agent: none is needed for public keys, none is left running after the boot. gpg's exit
  # status counts the agent it cannot reach (a socket path too long for it, say) even when the key
  # was imported, so it is not what decides: the signature check below is.
  GNUPGHOME="$dir/gnupg" gpg --batch --quiet --no-autostart --import "$dir/key.gpg" 2>/dev/null || true
  # The primary key of a valid signature (the last field of gpg's VALIDSIG status line), not just
  # any key the downloaded key file holds.
  signer=$(GNUPGHOME="$dir/gnupg" gpg --batch --no-autostart --status-fd 1 \
             --verify "$dir/agent.deb.sig" "$dir/agent.deb" 2>/dev/null \
           | awk '$2 == "VALIDSIG" {print $NF}')
  if [[ "$signer" != "$CLOUDWATCH_AGENT_KEY_FINGERPRINT" ]]; then
    log "$url is not signed by the key $CLOUDWATCH_AGENT_KEY_FINGERPRINT: not installed"
    return 1
  fi
}

install_cloudwatch_agent() {
  local dir status=0
  dir=$(mktemp -d)
  agent_package_verified "$dir" && dpkg -i "$dir/agent.deb" >/dev/null || status=1
  rm -rf "$dir"
  return "$status"
}

ship_logs() {  # never fails the boot: without the agent the log stays on the node
  if [[ ! -x "$CLOUDWATCH_AGENT_CTL" ]] && ! install_cloudwatch_agent; then
    log "warning: no CloudWatch agent; the boot log is in $BOOT_LOG on this node only"
    return 0
  fi
  cat > "$CLOUDWATCH_AGENT_CONFIG" <<JSON
{
  "agent": {"run_as_user": "root"},
  "logs": {
    "force_flush_interval": 5,
    "logs_collected": {"files": {"collect_list": [
      {"file_path": "/var/log/cloud-init-output.log", "log_group_name": "$LOG_GROUP",
       "log_stream_name": "$INSTANCE_ID/cloud-init-output.log"},
      {"file_path": "$BOOT_LOG", "log_group_name": "$LOG_GROUP",
       "log_stream_name": "$INSTANCE_ID/maskrcnn-boot.log"}
    ]}}
  }
}
JSON
  if "$CLOUDWATCH_AGENT_CTL" -a fetch-config -m ec2 -s -c "file:$CLOUDWATCH_AGENT_CONFIG" \
       >/dev/null; then
    # shellcheck disable=SC2034  # read by the bootstrap's failure path
    LOGS_SHIPPED=1
    log "boot log shipped to CloudWatch Logs: $LOG_GROUP, $INSTANCE_ID/maskrcnn-boot.log"
    ship_training_telemetry
  else
    log "warning: the CloudWatch agent did not start; the boot log is in $BOOT_LOG only"
  fi
}

# Training telemetry: a second agent configuration, appended to the boot logs' one (the agent
# merges the collect lists; neither repeats the other's settings). Every node ships its containers'
# output (Docker's json-file logs). The master also ships what the runs write on EFS, whichever node
# runs rank 0: the Slurm jobs' output, tensorpack's log.log and rank 0's metric records
# (training/cloudwatch_metrics.py EMF_FILE), whose lines are CloudWatch embedded metric format: the
# agent sends such a stream as EMF and CloudWatch makes metrics of it. Only the master, so that each
# line is sent once. GPU and EFA metrics go to this deployment's node namespace (training/metrics.py
# NODE_NAMESPACE_PREFIX, which the node roles' PutMetricData permission and the dashboard name),
# rolled up per node (dimension InstanceId: the mean, minimum and maximum over its GPUs or devices).
TRAINING_AGENT_CONFIG=/etc/maskrcnn/cloudwatch-agent-training.json
TRAINING_METRICS_FILE=cloudwatch-metrics.log
NODE_METRICS_NAMESPACE_PREFIX=MaskRCNN/Nodes/
# The agent's nvidia_gpu measurements (published as nvidia_smi_<measurement>) and its EFA receiver's
GPU_MEASUREMENTS='"utilization_gpu", "utilization_memory", "memory_used", "memory_total", "temperature_gpu", "power_draw"'
EFA_MEASUREMENTS='"efa_rx_bytes", "efa_tx_bytes", "efa_rdma_read_bytes", "efa_rdma_write_bytes", "efa_rx_dropped"'

agent_log_file() {  # agent_log_file PATH_GLOB STREAM: one collect_list entry
  printf '{"file_path": "%s", "log_group_name": "%s", "log_stream_name": "%s/%s"}' \
    "$1" "$LOG_GROUP" "$INSTANCE_ID" "$2"
}

training_agent_config() {  # training_agent_config GPU EFA (1 or 0): this node's training configuration
  local files collected=() metrics=""
  files=$(agent_log_file "/var/lib/docker/containers/*/*-json.log" containers)
  if [[ "$ROLE" == master ]]; then
    files+=", $(agent_log_file "$EFS_MOUNT/logs/*/slurm-*.out" training-jobs)"
    files+=", $(agent_log_file "$EFS_MOUNT/logs/*/log.log" training.log)"
    files+=", $(agent_log_file "$EFS_MOUNT/logs/*/$TRAINING_METRICS_FILE" training-metrics)"
  fi
  if (( $1 )); then
    # Only the per-node rollup is sent: min/max over the node's GPUs still shows an idle one.
    collected+=("\"nvidia_gpu\": {\"measurement\": [$GPU_MEASUREMENTS], \"metrics_collection_interval\": 60, \"drop_original_metrics\": [$GPU_MEASUREMENTS]}")
  fi
  if (( $2 )); then
    collected+=("\"efa\": {\"measurement\": [$EFA_MEASUREMENTS], \"metrics_collection_interval\": 60}")
  fi
  if (( ${#collected[@]} )); then
    # shellcheck disable=SC2016  # ${aws:InstanceId} is the agent's placeholder, not a shell variable
    metrics=$(IFS=,; printf ', "metrics": {"namespace": "%s", "append_dimensions": {"InstanceId": "${aws:InstanceId}"}, "aggregation_dimensions": [["InstanceId"]], "metrics_collected": {%s}}' \
                "$NODE_METRICS_NAMESPACE_PREFIX$STACK_NAME" "${collected[*]}")
  fi
  printf '{"logs": {"logs_collected": {"files": {"collect_list": [%s]}}}%s}\n' "$files" "$metrics"
}

node_has_efa() {  # EFA devices, as start_container finds them
  local dev
  for dev in /dev/infiniband/uverbs*; do
    [[ -e "$dev" ]] && return 0
  done
  return 1
}

ship_training_telemetry() {  # after ship_logs started the agent; never fails the boot
  local gpu=0 efa=0
  if command -v nvidia-smi >/dev/null; then
    gpu=1
  fi
  if node_has_efa; then
    efa=1
  fi
  while :; do
    training_agent_config "$gpu" "$efa" > "$TRAINING_AGENT_CONFIG"
    if "$CLOUDWATCH_AGENT_CTL" -a append-config -m ec2 -s -c "file:$TRAINING_AGENT_CONFIG" >/dev/null; then
      log "training logs and node metrics shipped: $LOG_GROUP, $INSTANCE_ID/*; metrics in" \
          "$NODE_METRICS_NAMESPACE_PREFIX$STACK_NAME"
      return 0
    fi
    (( efa )) || break
    # EC2 EFA metrics arrived in agent 1.300068.0 (May 2026): an older agent refuses the section.
    log "warning: the CloudWatch agent refused the EFA metrics (older than 1.300068.0?); without them"
    efa=0
  done
  "$CLOUDWATCH_AGENT_CTL" -a remove-config -m ec2 -s -c "file:$TRAINING_AGENT_CONFIG" >/dev/null || true
  log "warning: the CloudWatch agent refused $TRAINING_AGENT_CONFIG: boot logs only, no training" \
      "logs or node metrics in CloudWatch"
}

gpu_count() {
  nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true
}

gpus_of_instance_type() {
  # shellcheck disable=SC2016  # the backticks are JMESPath literals, not command substitution
  aws ec2 describe-instance-types --instance-types "$INSTANCE_TYPE" \
    --query 'sum(InstanceTypes[0].GpuInfo.Gpus[].Count || `[]`)' --output text
}

check_gpus() {  # an AMI whose driver cannot drive this GPU boots fine and counts 0 GPUs
  local expected
  expected=$(retry 5 5 gpus_of_instance_type)
  if (( GPUS < expected )); then
    log "nvidia-smi sees $GPUS of the $expected GPUs of $INSTANCE_TYPE: the AMI's NVIDIA driver" \
        "does not drive them (choose an instance type the AMI supports, see docs/infra.md)"
    return 1
  fi
}

# EFS without TLS is allowed (SageMaker's EFS channels cannot use TLS either, docs/infra.md) but
# never silent: the boot log says so on every node, and the first node of each AMI tells the alerts
# topic (the marker on EFS keeps it to one message per AMI, not one per node and boot).
report_plain_nfs() {
  local ami marker subject
  log "warning: EFS $FILE_SYSTEM_ID is mounted with plain NFS 4.1, without encryption in transit:" \
      "this AMI has no amazon-efs-utils (mount.efs), which mounts EFS with TLS"
  ami=$(imds ami-id || true)
  marker="$EFS_MOUNT/.maskrcnn/$STACK_NAME/efs-without-tls/${ami:-unknown-ami}"
  mkdir -p "${marker%/*}" || return 0
  mkdir "$marker" 2>/dev/null || return 0   # another node of this AMI has told the topic
  subject="$STACK_NAME: EFS mounted without TLS (no amazon-efs-utils on the AMI)"
  aws sns publish --topic-arn "$ALERTS_TOPIC_ARN" --subject "${subject:0:100}" \
    --message "The cluster nodes of $STACK_NAME mount EFS $FILE_SYSTEM_ID with plain NFS 4.1: the \
traffic between the nodes and the file system is not encrypted in transit (its data at rest is). \
Their AMI (${ami:-unknown}) has no amazon-efs-utils, whose mount helper mount.efs mounts with TLS; \
first node: $INSTANCE_ID ($ROLE, $PRIVATE_IP). For TLS, pin ami_id to an AMI with amazon-efs-utils \
installed and redeploy; the nodes then mount with TLS. This message comes once per AMI." >/dev/null \
    || { log "could not publish to $ALERTS_TOPIC_ARN"; rmdir "$marker" || true; }
}

mount_efs() {
  local line tls=1
  mkdir -p "$EFS_MOUNT"
  if command -v mount.efs >/dev/null; then
    line="$FILE_SYSTEM_ID:/ $EFS_MOUNT efs _netdev,tls 0 0"
  else
    tls=0
    if ! command -v mount.nfs4 >/dev/null; then
      retry 5 10 apt-get -qq update
      retry 5 10 apt-get -qq install -y nfs-common
    fi
    line="$FILE_SYSTEM_ID.efs.$AWS_REGION.amazonaws.com:/ $EFS_MOUNT nfs4"
    line+=" nfsvers=4.1,rsize=1048576,wsize=1048576,hard,timeo=600,retrans=2,noresvport,_netdev 0 0"
  fi
  grep -qs " $EFS_MOUNT " /etc/fstab || echo "$line" >> /etc/fstab
  # Mount targets and their DNS names can take a few minutes to appear after the stack creates
  # them.
  # A hard NFS mount can hang while a target is unreachable: bound each attempt.
  mountpoint -q "$EFS_MOUNT" || retry 60 10 timeout 60 mount "$EFS_MOUNT"
  (( tls )) || report_plain_nfs
}

# The FSx for Lustre client repository for Ubuntu (FSx for Lustre user guide, "Installing the
# Lustre client"): its packages build the client modules for each AWS kernel. The key's URL can be
# overridden from the environment (the boot-script test serves a local file).
FSX_APT_KEY_URL=${FSX_APT_KEY_URL:-https://fsx-lustre-client-repo-public-keys.s3.amazonaws.com/fsx-ubuntu-public-key.asc}
FSX_APT_REPO_URL=https://fsx-lustre-client-repo.s3.amazonaws.com/ubuntu
FSX_APT_KEY=/etc/apt/keyrings/fsx-ubuntu-public-key.asc

install_lustre_client() {
  local codename
  # shellcheck source=/dev/null
  codename=$(. /etc/os-release && echo "$VERSION_CODENAME")
  mkdir -p /etc/apt/keyrings /etc/apt/sources.list.d
  retry 5 10 curl -sSf -o "$FSX_APT_KEY" "$FSX_APT_KEY_URL"
  echo "deb [signed-by=$FSX_APT_KEY] $FSX_APT_REPO_URL $codename main" \
    > /etc/apt/sources.list.d/fsxlustreclientrepo.list
  retry 5 10 apt-get -qq update
  # The modules must match the running kernel: the DLAMI's kernel is an AWS one the repository
  # builds for. A kernel it does not (yet) cover fails here, and so the boot.
  retry 5 10 apt-get -qq install -y "lustre-client-modules-$(uname -r)"
}

mount_lustre() {  # FSx for Lustre at $FSX_MOUNT, when the app has one
  [[ -n "${FSX_DNS_NAME:-}" ]] || return 0
  if ! command -v mount.lustre >/dev/null; then
    install_lustre_client
  fi
  mkdir -p "$FSX_MOUNT"
  grep -qs " $FSX_MOUNT " /etc/fstab || echo \
    "$FSX_DNS_NAME@tcp:/$FSX_MOUNT_NAME $FSX_MOUNT lustre defaults,relatime,flock,_netdev,x-systemd.requires=network-online.target 0 0" \
    >> /etc/fstab
  # The file system's DNS name resolves a little after the stack reports it created.
  mountpoint -q "$FSX_MOUNT" || retry 30 10 timeout 120 mount "$FSX_MOUNT"
}

find_local_nvme() {  # the instance-store NVMe the AMI mounted, if this type has one
  LOCAL_NVME=""
  if mountpoint -q "$NVME_MOUNT"; then
    LOCAL_NVME=$NVME_MOUNT
  fi
  echo "LOCAL_NVME=$LOCAL_NVME" >> /etc/maskrcnn/cluster.env
}

order_docker_after_efs() {
  # After a reboot Docker can start, and restart the container, before the NFS mount is back:
  # the container then sees the empty directory under /efs. Docker waits for the mount (and, if
  # the mount fails, does not start: the health check then reports the node). The same for the
  # NVMe, which the AMI mounts again at every boot.
  mkdir -p /etc/systemd/system/docker.service.d
  printf '[Unit]\nRequiresMountsFor=%s\n' \
    "$EFS_MOUNT${FSX_DNS_NAME:+ $FSX_MOUNT}${LOCAL_NVME:+ $LOCAL_NVME}" \
    > /etc/systemd/system/docker.service.d/maskrcnn-efs.conf
  systemctl daemon-reload
}

register_node() {
  mkdir -p "$REGISTRY"
  echo "$PRIVATE_IP slots=$SLOTS" > "$REGISTRY/.$PRIVATE_IP.tmp"
  mv "$REGISTRY/.$PRIVATE_IP.tmp" "$REGISTRY/$PRIVATE_IP"
}

attach_master_address() {
  # Only a master in the public subnet has an Elastic IP: one with several network interfaces
  # (EFA on each card) runs in the private subnet, and cluster.env then has no allocation id.
  if [[ -z "${EIP_ALLOCATION_ID:-}" ]]; then
    return 0
  fi
  retry 10 6 aws ec2 associate-address --allocation-id "$EIP_ALLOCATION_ID" \
    --instance-id "$INSTANCE_ID" --allow-reassociation >/dev/null
}

install_munge_key() {  # Slurm's authentication key, the same on every node (launch/cluster/slurm.py)
  local key
  key=$(aws secretsmanager get-secret-value --secret-id "$MUNGE_KEY_SECRET_NAME" \
          --query SecretString --output text) || return 1
  (umask 077 && printf '%s' "$key" > /etc/maskrcnn/munge.key)
  chmod 0400 /etc/maskrcnn/munge.key
}

ecr_login() {
  aws ecr get-login-password | docker login --username AWS --password-stdin "${TRAINING_IMAGE_URI%%/*}"
}

start_container() {
  local extra=() dev efa=0
  retry 10 15 ecr_login
  retry 5 30 docker pull --quiet "$TRAINING_IMAGE_URI"
  if (( GPUS > 0 )); then
    extra+=(--gpus all)
  fi
  for dev in /dev/infiniband/uverbs*; do  # EFA devices, when the instance has an EFA interface
    if [[ -e "$dev" ]]; then
      extra+=(--device "$dev")
      efa=1
    fi
  done
  if (( efa )); then
    extra+=(--ulimit memlock=-1:-1)
  fi
  if [[ -n "${FSX_DNS_NAME:-}" ]]; then  # the dataset read from Lustre (launch/ looks here first)
    extra+=(-v "$FSX_MOUNT:$FSX_MOUNT:rslave")
  fi
  if [[ -n "$LOCAL_NVME" ]]; then  # dataset staging target (launch/ copies the data there)
    extra+=(-v "$LOCAL_NVME:$LOCAL_NVME")
  fi
  docker rm -f maskrcnn >/dev/null 2>&1 || true
  # SYSLOG: the node's health check reads the kernel log for GPU Xid errors (dmesg), which the
  # kernel refuses without it (Ubuntu sets kernel.dmesg_restrict=1; Docker drops CAP_SYSLOG).
  docker run -d --name maskrcnn --restart unless-stopped "${extra[@]}" \
    --network host --ipc host --cap-add SYSLOG \
    -v "$EFS_MOUNT:$EFS_MOUNT:rslave" -v /etc/maskrcnn:/etc/maskrcnn:ro \
    "$TRAINING_IMAGE_URI" cluster-node
}

install_train_command() {
  cat > /usr/local/bin/maskrcnn <<'WRAPPER'
#!/bin/bash
# The project's command (launch/cli.py) in the maskrcnn container, e.g. training runs as Slurm jobs:
#   maskrcnn job submit [--run-name NAME] [--resume] [KEY=VALUE ...] | status | logs | stop | list
exec docker exec -i maskrcnn maskrcnn-entrypoint maskrcnn "$@"
WRAPPER
  chmod 0755 /usr/local/bin/maskrcnn
}

install_idle_check() {  # master: idle workers scale to zero (launch/cluster/idle.py, docs/infra.md)
  (( ${IDLE_SCALEDOWN_MINUTES:-0} > 0 )) || return 0
  cat > /usr/local/bin/maskrcnn-idle-check <<'CHECK'
#!/bin/bash
# Run every minute by maskrcnn-idle.timer: the idle check, in the maskrcnn container, which holds
# the code and sees the training processes. While the container is not running (boot, restart)
# there is nothing to check from; the check restarts its idle count after such a gap.
[[ "$(docker inspect -f '{{.State.Running}}' maskrcnn 2>/dev/null)" == true ]] || exit 0
exec docker exec maskrcnn python -m launch.cluster.idle
CHECK
  chmod 0755 /usr/local/bin/maskrcnn-idle-check
  cat > /etc/systemd/system/maskrcnn-idle.service <<'UNIT'
[Unit]
Description=Scale the worker group to zero when no training job has run for IDLE_SCALEDOWN_MINUTES
After=docker.service

[Service]
Type=oneshot
ExecStart=/usr/local/bin/maskrcnn-idle-check
UNIT
  cat > /etc/systemd/system/maskrcnn-idle.timer <<'UNIT'
[Unit]
Description=Check every minute whether the cluster's workers are idle

[Timer]
OnCalendar=minutely

[Install]
WantedBy=timers.target
UNIT
  systemctl daemon-reload
  systemctl enable --now maskrcnn-idle.timer
}

group_field() {  # group_field GROUP_NAME JMESPATH
  aws autoscaling describe-auto-scaling-groups --auto-scaling-group-names "$1" \
    --query "AutoScalingGroups[0].$2" --output text
}

write_hostfile() {  # write_hostfile WAIT_SECONDS: wait up to that long for every node to register
  local deadline=$((SECONDS + $1)) expected have group desired ids ip
  local tmp=/etc/maskrcnn/.hostfile.tmp
  while :; do
    expected=0
    have=0
    : > "$tmp"
    for group in "$MASTER_ASG_NAME" "$WORKER_ASG_NAME"; do
      desired=$(retry 5 5 group_field "$group" DesiredCapacity)
      expected=$((expected + desired))
      # shellcheck disable=SC2016  # the backticks are JMESPath literals, not command substitution
      ids=$(retry 5 5 group_field "$group" 'Instances[?LifecycleState==`InService`].InstanceId')
      [[ -z "$ids" || "$ids" == None ]] && continue
      # shellcheck disable=SC2086  # ids is a whitespace-separated list
      for ip in $(retry 5 5 aws ec2 describe-instances --instance-ids $ids \
                    --query 'Reservations[].Instances[].PrivateIpAddress' --output text \
                  | tr '\t' '\n' | sort -V); do
        if [[ -s "$REGISTRY/$ip" ]]; then
          cat "$REGISTRY/$ip" >> "$tmp"
          have=$((have + 1))
        fi
      done
    done
    if (( have >= expected || SECONDS >= deadline )); then
      break
    fi
    sleep "$POLL_SECONDS"
  done
  mv "$tmp" /etc/maskrcnn/hostfile
  log "hostfile: $have of $expected nodes"
}

log "node $INSTANCE_ID ($ROLE, $INSTANCE_TYPE) at $PRIVATE_IP"
ship_logs
GPUS=$(gpu_count)
check_gpus
SLOTS=$(( GPUS > 0 ? GPUS : 1 ))  # a CPU-only node runs one process
# The Slurm daemons register the node from this address (never the master's public one), with
# one rank per GPU.
printf 'PRIVATE_IP=%s\nINSTANCE_ID=%s\nINSTANCE_TYPE=%s\nSLOTS=%s\n' \
  "$PRIVATE_IP" "$INSTANCE_ID" "$INSTANCE_TYPE" "$SLOTS" >> /etc/maskrcnn/cluster.env
mount_efs
mount_lustre
find_local_nvme
order_docker_after_efs
register_node
if [[ "$ROLE" == master ]]; then
  attach_master_address
fi
retry 10 6 install_munge_key
start_container
install_train_command
if [[ "$ROLE" == master ]]; then
  install_idle_check
  write_hostfile 1200  # workers boot in parallel; launch/ rewrites the hostfile at launch anyway
else
  write_hostfile 0
fi
log "ready: $GPUS GPUs, container maskrcnn running"
