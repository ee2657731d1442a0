#!/bin/bash
# Entry point of the training image. Commands:
#   train                SageMaker training job (SageMaker runs `docker run IMAGE train`)
#   cluster-node         EC2 cluster node: the Slurm daemons (munged, slurmd; slurmctld on the
#                        master) and the interruption watcher
#   job ARGS             on the master: training runs as Slurm jobs (submit, status, logs, stop, list)
#   anything else        run as a command (e.g. bash)
set -euo pipefail

CLUSTER_DIR=${MASKRCNN_CLUSTER_DIR:-/etc/maskrcnn}   # overridable for tests

command=${1:-train}
[[ $# -gt 0 ]] && shift
case "$command" in
  # exec: the entry becomes PID 1 and receives SageMaker's SIGTERM itself (it has a handler, which
  # PID 1 needs, and passes the signal on to the training ranks: launch/rank_signals.py)
  train)          exec python -m launch.sagemaker.entry "$@" ;;
  # The Slurm daemons in the foreground: when one exits, the container exits and Docker restarts it.
  cluster-node)   exec python -m launch.cluster.slurm node --cluster-env "$CLUSTER_DIR/cluster.env" ;;
  job)            exec python -m launch.cluster.jobs --cluster-env "$CLUSTER_DIR/cluster.env" "$@" ;;
  *)              exec "$command" "$@" ;;
esac
