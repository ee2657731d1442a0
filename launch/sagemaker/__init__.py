"""The SageMaker path: the job launcher (launcher.py, run where AWS credentials are) and the
container entry (entry.py, run by SageMaker inside the training image)."""
