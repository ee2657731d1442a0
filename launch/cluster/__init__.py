"""The EC2 cluster path, run on the master node: discover nodes (hostfile), check them (health),
start Horovod over the healthy ones with resume (run); the launch flags live in launch_command."""
