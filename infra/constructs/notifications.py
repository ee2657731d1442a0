"""The SNS topic that tells the user when something they pay for by the hour goes wrong: cluster
nodes that fail to launch or terminate (a replacement that never becomes healthy shows up here
as a launch, then a terminate, over and over) and, with bursting EFS, running out of credits."""
from __future__ import annotations

from aws_cdk import Aws
from aws_cdk import aws_iam as iam
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
        # The topic policy (TLS only) replaces SNS's default one, which let the account's
        # CloudWatch alarms publish: without this statement an alarm's action fails with "not
        # authorized to perform SNS:Publish ... no resource-based policy allows". Auto Scaling
        # publishes with its service-linked role, which an identity policy already allows.
        self.topic.add_to_resource_policy(iam.PolicyStatement(
            sid="CloudWatchAlarmsOfThisAccount", actions=["sns:Publish"],
            principals=[iam.ServicePrincipal("cloudwatch.amazonaws.com")],
            resources=[self.topic.topic_arn],
            conditions={"StringEquals": {"aws:SourceAccount": Aws.ACCOUNT_ID}}))
        if email:
            self.topic.add_subscription(subscriptions.EmailSubscription(email))
