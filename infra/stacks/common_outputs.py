"""Outputs both training stacks carry (names in infra/outputs.py), so a launcher reads one stack."""
from __future__ import annotations

from aws_cdk import CfnOutput, Fn, Stack

from infra import outputs
from infra.constructs.training_image import TrainingImage
from infra.stacks.network_storage import NetworkStorageStack


def add_shared_outputs(stack: Stack, *, shared: NetworkStorageStack, image: TrainingImage) -> None:
    CfnOutput(stack, outputs.FILE_SYSTEM_ID, value=shared.file_system.file_system_id)
    CfnOutput(stack, outputs.BUCKET_NAME, value=shared.data_bucket.bucket.bucket_name)
    CfnOutput(stack, outputs.TRAINING_IMAGE_URI, value=image.image_uri)
    CfnOutput(stack, outputs.PRIVATE_SUBNET_IDS, value=Fn.join(
        ",", [subnet.subnet_id for subnet in shared.network.private_subnets]))
