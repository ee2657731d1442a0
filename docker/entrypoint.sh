#!/bin/bash
# Entry point of the training image. Commands:
#   train                SageMaker training job (SageMaker runs `docker run IMAGE train`)
#   cluster-node         EC2 cluster node: the Slurm daemons (munged, slurmd; slurmctld on the
#                        master) and sshd on $SSH_PORT with the cluster key
#   job ARGS             on the master: training runs as Slurm jobs (submit, status, logs, stop, list)
#   anything else        run as a command (e.g. bash)
set -euo pipefail

CLUSTER_DIR=${MASKRCNN_CLUSTER_DIR:-/etc/maskrcnn}   # overridable for tests

cluster_env() {  # cluster_env KEY DEFAULT: a value from cluster.env, read as data (not sourced)
  local value=""
  if [[ -r "$CLUSTER_DIR/cluster.env" ]]; then
    value=$(grep -E "^$1=" "$CLUSTER_DIR/cluster.env" | tail -n 1 | cut -d= -f2- | tr -d '"' || true)
  fi
  echo "${value:-$2}"
}

cluster_node() {
  local port address key_dir=$CLUSTER_DIR/ssh
  port=$(cluster_env SSH_PORT 2222)
  # The node's private address, written by the boot script: with --network host, sshd would
  # otherwise listen on every interface of the host (docker0, EFA, anything added later). The
  # master's public address reaches it only through the security group (docs/infra.md).
  address=$(cluster_env PRIVATE_IP "")
  if [[ -z "$address" ]]; then
    echo "cluster-node: no PRIVATE_IP in $CLUSTER_DIR/cluster.env (not a node set up by the" \
         "cluster's user data): sshd listens on all addresses" >&2
    address=0.0.0.0
  fi
  if [[ ! -s "$key_dir/authorized_keys" ]]; then
    echo "cluster-node: $key_dir/authorized_keys is missing: start the container with" \
         "-v /etc/maskrcnn:/etc/maskrcnn:ro on a node set up by the cluster's user data" >&2
    exit 2
  fi
  # Host keys are made per container, never shipped in the image.
  ssh-keygen -A >/dev/null
  mkdir -p /run/sshd
  # sshd sessions (mpirun's orted, health checks) start with a clean environment: give them the
  # container's PATH, library path and training settings.
  env | grep -E '^(PATH|LD_LIBRARY_PATH|PYTHONPATH|TF_[A-Z_]+|NCCL_[A-Z_]+|CUDA_[A-Z_]+|NVIDIA_[A-Z_]+|AWS_REGION|AWS_DEFAULT_REGION)=' \
    > /etc/environment || true
  /usr/sbin/sshd -D -e -o ListenAddress="$address:$port" \
    -o AuthorizedKeysFile="$key_dir/authorized_keys" \
    -o PasswordAuthentication=no -o KbdInteractiveAuthentication=no \
    -o PermitRootLogin=prohibit-password -o AllowTcpForwarding=no -o X11Forwarding=no &
  # The Slurm daemons in the foreground: when one exits, the container exits and Docker restarts it.
  exec python -m launch.cluster.slurm node --cluster-env "$CLUSTER_DIR/cluster.env"
}

command=${1:-train}
[[ $# -gt 0 ]] && shift
case "$command" in
  # exec: the entry becomes PID 1 and receives SageMaker's SIGTERM itself (it has a handler, which
  # PID 1 needs, and passes the signal on to the training ranks: launch/rank_signals.py)
  train)          exec python -m launch.sagemaker.entry "$@" ;;
  cluster-node)   cluster_node ;;
  job)            exec python -m launch.cluster.jobs --cluster-env "$CLUSTER_DIR/cluster.env" "$@" ;;
  *)              exec "$command" "$@" ;;
esac
