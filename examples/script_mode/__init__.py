"""Script mode: one small image classifier that SageMaker, or this machine, trains with an
asynchronous parameter server or with Horovod all-reduce, after AWS's SageMaker lab "Distributed
training with SageMaker's script mode using Parameter Server and Horovod". See docs/script_mode.md."""
