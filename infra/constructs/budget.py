"""An optional monthly cost budget that tells the alerts topic when this deployment's spend nears
its limit: at 80% of the limit actually spent, and when AWS forecasts the month to exceed it.

It counts the cost of resources carrying the stack's tags (project=maskrcnn-on-aws), so an account
shared with other work is not charged to it. AWS sees a tag in cost data only once it is activated
as a cost allocation tag in Billing (docs/infra.md, "Budget"); until then the budget reads $0.
"""
from __future__ import annotations

from aws_cdk import Aws, Fn
from aws_cdk import aws_budgets as budgets
from constructs import Construct

from infra.constructs.notifications import Notifications

# (notification type, percent of the limit): actual spend early enough to act on, and the
# forecast, which warns in the first days of a month whose pace would overrun.
THRESHOLDS = (("ACTUAL", 80), ("FORECASTED", 100))


def tag_filter(tags: dict[str, str]) -> dict[str, list[str]]:
    """Budgets' CostFilters for resources with any of `tags` (user-defined cost allocation tags
    are named user:KEY, and a value follows the key after $)."""
    return {"TagKeyValue": [f"user:{key}${value}" for key, value in sorted(tags.items())]}


class MonthlyBudget(Construct):
    def __init__(self, scope: Construct, id: str, *, amount_usd: int,
                 notifications: Notifications, tags: dict[str, str]) -> None:
        super().__init__(scope, id)
        if not tags:
            raise ValueError("the budget counts tagged resources: the stack has no tags")
        topic_policy = notifications.allow_budgets_to_publish()
        topic_arn = notifications.topic.topic_arn
        self.budget = budgets.CfnBudget(
            self, "Budget",
            budget=budgets.CfnBudget.BudgetDataProperty(
                budget_type="COST", time_unit="MONTHLY",
                # Budgets are per account, stacks per region: the name carries both.
                budget_name=Fn.join("-", [Aws.STACK_NAME, Aws.REGION, "monthly"]),
                budget_limit=budgets.CfnBudget.SpendProperty(amount=amount_usd, unit="USD"),
                cost_filters=tag_filter(tags)),
            notifications_with_subscribers=[
                budgets.CfnBudget.NotificationWithSubscribersProperty(
                    notification=budgets.CfnBudget.NotificationProperty(
                        notification_type=kind, comparison_operator="GREATER_THAN",
                        threshold=percent, threshold_type="PERCENTAGE"),
                    subscribers=[budgets.CfnBudget.SubscriberProperty(
                        subscription_type="SNS", address=topic_arn)])
                for kind, percent in THRESHOLDS])
        # The topic policy is in place before the budget, so no notification is refused.
        self.budget.node.add_dependency(topic_policy)
