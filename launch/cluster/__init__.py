"""The EC2 cluster path, run in each node's container: the Slurm daemons and their configuration
(slurm), node health checks (node_health), training runs as Slurm jobs (jobs: the user's command;
job: the body of each attempt), idle scale-down and capacity (idle, capacity); the mpirun flags live
in launch_command."""
