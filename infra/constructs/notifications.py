"""The SNS topic that tells the user when something they pay for by the hour goes wrong: cluster
nodes that fail to launch or terminate (a replacement that never becomes healthy shows up here
as a launch, then a terminate, over and over) and, with bursting EFS, running out of credits."""
from __future__ import annotations

from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from constructs import Construct

from infra.constructs.acknowledge import acknowledge


class Notifications(Construct):
    """One topic per deployment, with an optional email subscription (AWS emails a confirmation
    link first: nothing is delivered until the recipient confirms)."""

    def __init__(self, scope: Construct, id: str, *, email: str | None = None) -> None:
        super().__init__(scope, id)
        self.topic = sns.Topic(self, "Topic", display_name="Mask R-CNN training alerts",
                               enforce_ssl=True)
        acknowledge(
            self.topic, "AwsSolutions-SNS2",
            "Auto Scaling publishes with its service-linked role, which a KMS key policy can name "
            "only once it exists (a fresh account has none before its first group), and the "
            "messages carry only group names, instance ids and alarm states, no data.")
        if email:
            self.topic.add_subscription(subscriptions.EmailSubscription(email))
