"""Outputs both training stacks carry (names in infra/outputs.py), so a launcher reads one stack."""
from __future__ import annotations

from aws_cdk import CfnOutput, Fn, Stack

from infra import outputs
from infra.constructs.training_image import TrainingImage, TrainingImageBuild
from infra.stacks.network_storage import NetworkStorageStack


def add_shared_outputs(stack: Stack, *, shared: NetworkStorageStack, image: TrainingImage | TrainingImageBuild) -> None:
    """Repeats NetworkStorageStack's values (imports) as this stack's outputs, on purpose: the
    launchers read everything from the stack they launch on. cfn-lint's W6001 ("output value is
    an import from another output") flags exactly that, so it is acknowledged for these outputs'
    templates."""
    CfnOutput(stack, outputs.FILE_SYSTEM_ID, value=shared.file_system.id_in(stack))
    CfnOutput(stack, outputs.BUCKET_NAME, value=shared.data_bucket.bucket.bucket_name)
    CfnOutput(stack, outputs.TRAINING_IMAGE_URI, value=image.image_uri)
    CfnOutput(stack, outputs.PRIVATE_SUBNET_IDS, value=Fn.join(
        ",", [subnet.subnet_id for subnet in shared.network.private_subnets]))
    if shared.lustre.enabled:
        CfnOutput(stack, outputs.LUSTRE_FILE_SYSTEM_ID,
                  value=shared.lustre.value_in(stack, "file_system_id"))
        CfnOutput(stack, outputs.LUSTRE_MOUNT_NAME,
                  value=shared.lustre.value_in(stack, "mount_name"))
        CfnOutput(stack, outputs.LUSTRE_SUBNET_ID, value=shared.lustre.subnet.subnet_id)
    metadata = stack.template_options.metadata or {}
    stack.template_options.metadata = {**metadata, "cfn-lint": {"config": {"ignore_checks": [
        "W6001"]}}}
