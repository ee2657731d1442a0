"""Script mode (seed 003): one small image classifier that SageMaker, or this machine, trains with
an asynchronous parameter server or with Horovod all-reduce. See docs/script_mode.md."""
