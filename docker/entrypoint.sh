#!/bin/bash
# Entry point of the training image. Commands:
#   train                SageMaker training job (SageMaker runs `docker run IMAGE train`)
#   serve                SageMaker endpoint or batch transform (`docker run IMAGE serve`): the model
#                        server on port 8080 (launch/sagemaker/serve.py)
#   cluster-node         EC2 cluster node: the Slurm daemons (munged, slurmd; slurmctld on the
#                        master) and the interruption watcher
#   job ARGS             on the master: training runs as Slurm jobs (submit, status, logs, stop, list)
#   maskrcnn ARGS        the project's command (launch/cli.py); every node's /usr/local/bin/maskrcnn
#   anything else        run as a command (e.g. bash)
set -euo pipefail

CLUSTER_DIR=${MASKRCNN_CLUSTER_DIR:-/etc/maskrcnn}   # overridable for tests

command=${1:-train}
[[ $# -gt 0 ]] && shift
case "$command" in
  # exec: the entry becomes PID 1 and receives SageMaker's SIGTERM itself (it has a handler, which
  # PID 1 needs, and passes the signal on to the training ranks: launch/rank_signals.py)
  train)          exec python -m launch.sagemaker.entry "$@" ;;
  # exec, and serve execs gunicorn: the server is PID 1 and stops gracefully on SageMaker's SIGTERM
  serve)          exec python -m launch.sagemaker.serve "$@" ;;
  # The Slurm daemons in the foreground: when one exits, the container exits and Docker restarts it.
  cluster-node)   exec python -m launch.cluster.slurm node --cluster-env "$CLUSTER_DIR/cluster.env" ;;
  job)            exec python -m launch.cluster.jobs --cluster-env "$CLUSTER_DIR/cluster.env" "$@" ;;
  maskrcnn)       exec python -m launch.cli "$@" ;;
  *)              exec "$command" "$@" ;;
esac
