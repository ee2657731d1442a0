"""S3 buckets: one for datasets, checkpoints and job output, one for access and flow logs.
Both encrypted, private, TLS-only and retained when the stack is deleted."""
from __future__ import annotations

from aws_cdk import Duration, RemovalPolicy, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from constructs import Construct

from infra.constructs.acknowledge import acknowledge


def _secure_bucket_props() -> dict:
    return dict(
        encryption=s3.BucketEncryption.S3_MANAGED,
        block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
        enforce_ssl=True,
        object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
        removal_policy=RemovalPolicy.RETAIN,
    )


class LogBucket(Construct):
    """Destination of the data bucket's access logs and the VPC flow logs."""

    def __init__(self, scope: Construct, id: str, *, expire_after_days: int = 365) -> None:
        super().__init__(scope, id)
        self.bucket = s3.Bucket(
            self, "Bucket",
            lifecycle_rules=[s3.LifecycleRule(expiration=Duration.days(expire_after_days))],
            **_secure_bucket_props(),
        )
        acknowledge(
            self.bucket, "AwsSolutions-S1",
            "This is the access-log bucket itself; logging it into itself would recurse, and "
            "into another bucket would only move the question.")


class DataBucket(Construct):
    """Datasets (COCO tarballs before staging to EFS), checkpoints and training-job output.
    Not versioned: checkpoints are rewritten often and versions would multiply their storage cost;
    the bucket is retained on stack delete so nothing is lost with the stack."""

    def __init__(self, scope: Construct, id: str, *, access_log_bucket: s3.IBucket) -> None:
        super().__init__(scope, id)
        self.bucket = s3.Bucket(
            self, "Bucket",
            server_access_logs_bucket=access_log_bucket,
            server_access_logs_prefix="data-bucket/",
            lifecycle_rules=[s3.LifecycleRule(
                abort_incomplete_multipart_upload_after=Duration.days(7))],
            **_secure_bucket_props(),
        )
        # An export with a fixed name, so the grants in the training stacks (and the cdk-nag
        # acknowledgment of their `<bucket>/*` resource) name it the same way on every synth.
        stack = Stack.of(self)
        self._arn_export_name = f"{stack.stack_name}-{id}Arn"
        self._exported_arn = stack.export_value(self.bucket.bucket_arn,
                                                name=self._arn_export_name)

    def grant_data_access(self, grantee: iam.IGrantable) -> None:
        """Read, write and delete objects, list the bucket: what staging data, checkpointing and
        job output need. Narrower than Bucket.grant_read_write (no wildcard actions).
        For grantees in other stacks (the training stacks)."""
        iam.Grant.add_to_principal(
            grantee=grantee, actions=["s3:ListBucket", "s3:GetBucketLocation"],
            resource_arns=[self._exported_arn])
        iam.Grant.add_to_principal(
            grantee=grantee,
            actions=["s3:GetObject", "s3:PutObject", "s3:DeleteObject",
                     "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"],
            resource_arns=[f"{self._exported_arn}/*"])
        acknowledge(
            grantee, f"AwsSolutions-IAM5[Resource::{self._arn_export_name}/*]",
            "Object-level access to this one bucket: datasets, checkpoints and job outputs "
            "have keys chosen at run time.")
