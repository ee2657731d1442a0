"""The SNS topic that tells the user when something they pay for by the hour goes wrong: cluster
nodes that fail to launch or terminate, a group that stopped launching after consecutive failed
boots (the failing node publishes which step failed and its log's tail), with bursting EFS,
running out of credits, and, with a monthly budget, spend nearing it."""
from __future__ import annotations

from aws_cdk import Aws, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from constructs import Construct, IDependable

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
            "messages carry group names, instance ids, alarm states and the tail of a failed "
            "boot's log (which logs no secrets), no training data.")
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

    def allow_budgets_to_publish(self) -> IDependable:
        """Lets this account's AWS Budgets notifications publish here (MonthlyBudget). Budgets,
        like CloudWatch, publishes as its service principal, which only the topic policy can
        allow; the conditions keep other accounts' budgets out. Returns the topic policy."""
        return self.topic.add_to_resource_policy(iam.PolicyStatement(
            sid="BudgetsOfThisAccount", actions=["sns:Publish"],
            principals=[iam.ServicePrincipal("budgets.amazonaws.com")],
            resources=[self.topic.topic_arn],
            conditions={
                "StringEquals": {"aws:SourceAccount": Aws.ACCOUNT_ID},
                "ArnLike": {"aws:SourceArn": Stack.of(self).format_arn(
                    service="budgets", region="", resource="*")},
            })).policy_dependable
