"""Launch paths: the SageMaker container entry and job launcher (launch/sagemaker), the EC2 cluster
run on the master node (launch/cluster), and data staging to S3 and EFS (launch/staging)."""
