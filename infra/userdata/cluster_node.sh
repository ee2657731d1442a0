#!/bin/bash
# Boot script of an EfsClusterStack node (master or worker). cloud-init runs it once, as root, on
# first boot; the launch template's user data writes /etc/maskrcnn/cluster.env just before it.
#
# What it leaves behind (the contract launch/ builds on; docs/infra.md describes it):
#   /efs                                EFS, mounted now and from /etc/fstab on every reboot
#   /efs/.maskrcnn/$STACK_NAME/nodes/IP one line "IP slots=GPUS" per node that has booted
#   /etc/maskrcnn/ssh/                  id_ed25519, id_ed25519.pub, authorized_keys (cluster key)
#   /etc/maskrcnn/hostfile              "IP slots=GPUS" for the InService nodes, master first
#   /fsx                                FSx for Lustre, when cluster.env has FSX_DNS_NAME (the app's
#                                       fsx_lustre_storage_gib option); also in the container
#   LOCAL_NVME in cluster.env           $NVME_MOUNT when the instance has instance-store NVMe
#                                       (then also mounted in the container), else empty
#   container "maskrcnn"                $TRAINING_IMAGE_URI running `cluster-node` (sshd on
#                                       $PRIVATE_IP:$SSH_PORT), restarted by Docker after a
#                                       reboot, once /efs is mounted again
#   /usr/local/bin/maskrcnn-train       the one command that starts training (on the master)
set -Eeuo pipefail
exec > >(tee -a /var/log/maskrcnn-boot.log) 2>&1

set -a
# shellcheck source=/dev/null
. /etc/maskrcnn/cluster.env
set +a
export AWS_DEFAULT_REGION="$AWS_REGION"
REGISTRY="$EFS_MOUNT/.maskrcnn/$STACK_NAME/nodes"
# The instance metadata service; the variable is the AWS SDKs' standard override.
IMDS="${AWS_EC2_METADATA_SERVICE_ENDPOINT:-http://169.254.169.254}"
IMDS="${IMDS%/}"
KEY_HEADER='-----BEGIN OPENSSH PRIVATE KEY-----'
# Seconds between checks while a node waits for the master's key or for every node to register.
# Nothing sets the variable on an instance; the boot tests shorten the wait with it.
POLL_SECONDS="${MASKRCNN_BOOT_POLL_SECONDS:-15}"

log() { echo "[maskrcnn-boot $(date -u +%FT%TZ)] $*" >&2; }

retry() {  # retry ATTEMPTS DELAY_SECONDS COMMAND...
  local attempts=$1 delay=$2 n=1
  shift 2
  until "$@"; do
    if (( n >= attempts )); then
      log "gave up after $n attempts: $*"
      return 1
    fi
    n=$((n + 1))
    sleep "$delay"
  done
}

imds() {  # IMDSv2: the launch template requires session tokens
  local token
  token=$(curl -sf -X PUT "$IMDS/latest/api/token" \
    -H 'X-aws-ec2-metadata-token-ttl-seconds: 300')
  curl -sf -H "X-aws-ec2-metadata-token: $token" "$IMDS/latest/meta-data/$1"
}

signal() {  # report this node's boot result to the auto-scaling group's creation policy
  aws cloudformation signal-resource --stack-name "$STACK_NAME" \
    --logical-resource-id "$ASG_LOGICAL_ID" --unique-id "$INSTANCE_ID" --status "$1" || true
}

boot_failed() {
  log "boot failed at line $1"
  # At stack creation the FAILURE signal fails the deploy. After it (a replacement or scale-out
  # node), CloudFormation ignores signals: marking the instance unhealthy makes its group
  # terminate and replace it, instead of keeping a broken node InService.
  signal FAILURE
  aws autoscaling set-instance-health --instance-id "$INSTANCE_ID" --health-status Unhealthy \
    --no-should-respect-grace-period || true
}

INSTANCE_ID=$(retry 10 3 imds instance-id)
PRIVATE_IP=$(retry 10 3 imds local-ipv4)
INSTANCE_TYPE=$(retry 10 3 imds instance-type)
trap 'boot_failed $LINENO' ERR

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

mount_efs() {
  local line
  mkdir -p "$EFS_MOUNT"
  if command -v mount.efs >/dev/null; then
    line="$FILE_SYSTEM_ID:/ $EFS_MOUNT efs _netdev,tls 0 0"
  else
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
  retry 10 6 aws ec2 associate-address --allocation-id "$EIP_ALLOCATION_ID" \
    --instance-id "$INSTANCE_ID" --allow-reassociation >/dev/null
}

read_cluster_key() {
  aws secretsmanager get-secret-value --secret-id "$CLUSTER_KEY_SECRET_ARN" \
    --query SecretString --output text
}

install_cluster_key() {
  local dir=/etc/maskrcnn/ssh key waited=0
  install -d -m 0700 "$dir"
  key=$(retry 10 6 read_cluster_key)
  if [[ "$key" != "$KEY_HEADER"* ]]; then
    if [[ "$ROLE" == master ]]; then
      # First boot of this cluster: the secret still holds CloudFormation's random placeholder.
      # A replacement master finds the key already there and reuses it.
      rm -f "$dir/new" "$dir/new.pub"
      ssh-keygen -q -t ed25519 -N '' -C "maskrcnn-$STACK_NAME" -f "$dir/new"
      retry 10 6 aws secretsmanager put-secret-value --secret-id "$CLUSTER_KEY_SECRET_ARN" \
        --secret-string "file://$dir/new" >/dev/null
      rm -f "$dir/new" "$dir/new.pub"
      key=$(retry 10 6 read_cluster_key)
    else
      until [[ "$key" == "$KEY_HEADER"* ]]; do
        if (( waited >= 1800 )); then
          log "the master has not published the cluster key after 30 minutes"
          return 1
        fi
        sleep "$POLL_SECONDS"
        waited=$((waited + POLL_SECONDS))
        key=$(retry 10 6 read_cluster_key)
      done
    fi
  fi
  (umask 077 && printf '%s\n' "$key" > "$dir/id_ed25519")
  ssh-keygen -y -f "$dir/id_ed25519" > "$dir/id_ed25519.pub"
  # The key is accepted only from inside the VPC, and grants no agent or port forwarding.
  printf 'from="%s",no-agent-forwarding,no-port-forwarding,no-X11-forwarding %s\n' \
    "$VPC_CIDR" "$(cat "$dir/id_ed25519.pub")" > "$dir/authorized_keys"
  chmod 0644 "$dir/id_ed25519.pub"
  chmod 0600 "$dir/authorized_keys"
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
  docker run -d --name maskrcnn --restart unless-stopped "${extra[@]}" \
    --network host --ipc host \
    -v "$EFS_MOUNT:$EFS_MOUNT:rslave" -v /etc/maskrcnn:/etc/maskrcnn:ro \
    "$TRAINING_IMAGE_URI" cluster-node
}

install_train_command() {
  cat > /usr/local/bin/maskrcnn-train <<'WRAPPER'
#!/bin/bash
# Starts distributed training on every cluster node from here (the master): launch/cluster/run.py
# inside the maskrcnn container; arguments are KEY=VALUE config overrides.
exec docker exec -i maskrcnn maskrcnn-entrypoint cluster-train "$@"
WRAPPER
  chmod 0755 /usr/local/bin/maskrcnn-train
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
GPUS=$(gpu_count)
check_gpus
SLOTS=$(( GPUS > 0 ? GPUS : 1 ))  # a CPU-only node runs one process
# The container's sshd listens on this address only (never on the master's public address).
echo "PRIVATE_IP=$PRIVATE_IP" >> /etc/maskrcnn/cluster.env
mount_efs
mount_lustre
find_local_nvme
order_docker_after_efs
register_node
if [[ "$ROLE" == master ]]; then
  attach_master_address
fi
install_cluster_key
start_container
install_train_command
if [[ "$ROLE" == master ]]; then
  write_hostfile 1200  # workers boot in parallel; launch/ rewrites the hostfile at launch anyway
else
  write_hostfile 0
fi
signal SUCCESS
log "ready: $GPUS GPUs, container maskrcnn running"
