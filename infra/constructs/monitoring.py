"""A training stack's CloudWatch dashboard and its alerts to the deployment's SNS topic.

Metric names are the trainer's (training/metrics.py), never written here a second time.

EC2 cluster (:class:`ClusterMonitoring`): rank 0's embedded-metric-format records
(training/cloudwatch_metrics.py, dimension Deployment = the stack's name) and the nodes' CloudWatch
agent metrics (namespace training.metrics.NODE_NAMESPACE_PREFIX + the stack's name, dimension
InstanceId: infra/userdata/cluster_node.sh, ship_logs). Alarms:

- run finished / run failed / loss not finite: the run's own records (run_finished, run_failed,
  loss_not_finite), missing data is "not breaching": nothing runs, nothing is wrong;
- run stalled: a run that dies without its last record (killed, out of memory, its node gone) or
  hangs writes nothing more, and "no data" must then mean trouble, while "no data" between runs must
  not. Two silent alarms hold the two facts and a composite alarm notifies when both hold:
  ``active``, run_active (1 from a run's start, 0 in its last record, Minimum per minute) with
  missing data "ignore", which keeps the state of the last data point, so it stays in ALARM from a
  run's first record until its last; ``silent``, no heartbeat for ``stall_minutes`` consecutive
  minutes with missing data "breaching". Between runs ``active`` is OK, so the composite is too.
- node replaced: an EventBridge rule on the groups' "EC2 Instance Terminate Successful" events whose
  cause is a health or status check (a boot that failed, an instance EC2 stopped, terminated or
  took back), not the scale-ins of pause, idle scale-down or a smaller worker_count, which are the
  user's own doing (auto-scaling notifications cannot tell them apart).

SageMaker (:class:`SageMakerMonitoring`): the jobs' metrics are what SageMaker publishes from the
metric definitions (namespace /aws/sagemaker/TrainingJobs, dimension Host = "<job>/algo-<n>"), per
job: the dashboard finds them with SEARCH. A job's end comes from SageMaker itself: an EventBridge
rule on "SageMaker Training Job State Change" (Completed, Failed, Stopped) for jobs that run with the
stack's training role, which also covers jobs that die without a word in their log.
"""
from __future__ import annotations

from typing import Sequence

from aws_cdk import Duration, Stack
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cloudwatch_actions
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_sns as sns
from constructs import Construct

from infra.constructs.acknowledge import acknowledge
from training import metrics as m

PERIOD = Duration.minutes(1)
# Evaluation figures arrive once per evaluation: graphed as points over longer periods.
EVALUATION_PERIOD = Duration.minutes(5)
# The auto-scaling causes of a replacement (EC2 Auto Scaling user guide, "View the reason for
# health check failures"; troubleshooting "Health checks"): "... in response to an EC2 health check
# indicating it has been terminated or stopped", "... an EC2 instance status checks failure",
# "... a user health-check" (a failed boot marks its node unhealthy), "... an ELB system health check
# failure". Scale-ins say "... a difference between desired and actual capacity".
REPLACEMENT_CAUSES = ("*health check*", "*health-check*", "*status check*")
GPU_MEASUREMENTS = (m.GPU_UTILIZATION, m.GPU_MEMORY_UTILIZATION, m.GPU_MEMORY_USED)


def node_namespace(stack_name: str) -> str:
    return m.NODE_NAMESPACE_PREFIX + stack_name


def _search(namespace: str, dimensions: Sequence[str], metric_name: str, statistic: str, *,
            period: Duration = PERIOD) -> cloudwatch.MathExpression:
    """A SEARCH over the metrics with exactly ``dimensions``: one line per series found, labelled
    with its dimension values."""
    schema = ",".join([f'"{namespace}"', *dimensions])
    expression = f"SEARCH('{{{schema}}} MetricName=\"{metric_name}\"', '{statistic}', {int(period.to_seconds())})"
    return cloudwatch.MathExpression(expression=expression, using_metrics={}, period=period)


def _storage_widgets(*, file_system_id: str, lustre_file_system_id: str | None) -> list[cloudwatch.IWidget]:
    """EFS (and FSx for Lustre) read and write throughput, bytes per second."""
    def rate(namespace, name, fs_id, label):   # label: an id unique in its graph, too
        total = cloudwatch.Metric(namespace=namespace, metric_name=name, statistic="Sum", period=PERIOD,
                                  dimensions_map={"FileSystemId": fs_id})
        return cloudwatch.MathExpression(expression=f"{label} / PERIOD({label})", using_metrics={label: total},
                                         label=label, period=PERIOD)
    widgets = [cloudwatch.GraphWidget(
        title="EFS throughput (bytes/s)", width=12,
        left=[rate("AWS/EFS", "DataReadIOBytes", file_system_id, "read"),
              rate("AWS/EFS", "DataWriteIOBytes", file_system_id, "write")])]
    if lustre_file_system_id:
        widgets.append(cloudwatch.GraphWidget(
            title="FSx for Lustre throughput (bytes/s)", width=12,
            left=[rate("AWS/FSx", "DataReadBytes", lustre_file_system_id, "read"),
                  rate("AWS/FSx", "DataWriteBytes", lustre_file_system_id, "write")]))
    return widgets


class _Alerts(Construct):
    """EventBridge rules to the topic, through a role of their own (the topic's policy, in the
    shared stack, stays as it is), each with an alarm on its failed deliveries.

    EventBridge counts a target it could not invoke (its role denied, the topic gone, a
    throttled publish) as a FailedInvocation of the rule, in AWS/Events with the dimension
    RuleName, and drops the event after its retries: without the alarm an alert that never
    arrived would look like nothing happened. The alarm tells the same topic through CloudWatch,
    which publishes under the topic policy's own statement, not through the rule's role."""

    def __init__(self, scope: Construct, id: str, *, topic: sns.ITopic) -> None:
        super().__init__(scope, id)
        self.topic = topic
        self.role = iam.Role(self, "PublishRole", assumed_by=iam.ServicePrincipal("events.amazonaws.com"),
                             description="EventBridge publishes the training stack's alerts to the topic")

    def rule(self, id: str, *, description: str, pattern: events.EventPattern,
             message: events.RuleTargetInput) -> events.Rule:
        rule = events.Rule(self, id, description=description, event_pattern=pattern, targets=[
            targets.SnsTopic(self.topic, authorize_using_role=True, role=self.role, message=message)])
        failed = cloudwatch.Metric(
            namespace="AWS/Events", metric_name="FailedInvocations", statistic="Sum",
            period=Duration.minutes(5), dimensions_map={"RuleName": rule.rule_name})
        alarm = failed.create_alarm(
            self, f"{id}FailedDeliveries", threshold=1, evaluation_periods=1,
            alarm_name=f"{Stack.of(self).stack_name}-{id}-failed-deliveries",
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            alarm_description=(
                f"EventBridge could not deliver the {id} alert to the alerts topic, and the event "
                f"it was about is lost ({description}). Check the rule's target, its publish "
                "role (sns:Publish on the topic) and the topic."))
        alarm.add_alarm_action(cloudwatch_actions.SnsAction(self.topic))
        return rule


class ClusterMonitoring(Construct):
    """Dashboard, alarms and the node-replaced rule of an EfsClusterStack; the nodes' roles may put
    metrics into the stack's node namespace (the CloudWatch agent's GPU and EFA metrics)."""

    def __init__(self, scope: Construct, id: str, *, topic: sns.ITopic, node_roles: Sequence[iam.IRole],
                 group_names: Sequence[str], file_system_id: str, lustre_file_system_id: str | None,
                 stall_minutes: int) -> None:
        super().__init__(scope, id)
        stack = Stack.of(self)
        self.deployment = stack.stack_name
        self.node_namespace = node_namespace(self.deployment)
        self._grant_node_metrics(node_roles)

        action = cloudwatch_actions.SnsAction(topic)
        self.run_finished = self._count_alarm(
            "RunFinished", m.RUN_FINISHED, action, name="run-finished",
            description="A training run reached the end of its schedule (TRAIN.MAX_STEPS). Its "
                        "checkpoints and eval_results.json are in <EFS>/logs/<run name>; the workers "
                        "scale to zero after idle_scaledown_minutes.")
        self.run_failed = self._count_alarm(
            "RunFailed", m.RUN_FAILED, action, name="run-failed",
            description="A training run stopped on an error before the end of its schedule. Read the "
                        "error in <EFS>/logs/<run name>/log.log (log stream <master id>/training.log of "
                        "the node log group); `maskrcnn job submit --run-name <run name> --resume` continues "
                        "from the latest checkpoint.")
        self.loss_not_finite = self._count_alarm(
            "LossNotFinite", m.LOSS_NOT_FINITE, action, name="loss-not-finite",
            description="A training step's total loss was NaN or infinite: the weights may be "
                        "diverging. Compare the losses on the dashboard; lower the learning rate or "
                        "resume from an earlier checkpoint (see docs).")
        self.run_active = self._metric(m.RUN_ACTIVE, "Minimum").create_alarm(
            self, "RunActive", threshold=1, evaluation_periods=1, alarm_name=f"{self.deployment}-run-active",
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            treat_missing_data=cloudwatch.TreatMissingData.IGNORE, actions_enabled=False,
            alarm_description="In ALARM from a run's first record until its last (run_active); part of "
                              "the stalled alarm, notifies nobody itself.")
        self.silent = self._metric(m.HEARTBEAT, "Sum").create_alarm(
            self, "NoHeartbeat", threshold=1, evaluation_periods=stall_minutes, datapoints_to_alarm=stall_minutes,
            alarm_name=f"{self.deployment}-no-heartbeat",
            comparison_operator=cloudwatch.ComparisonOperator.LESS_THAN_THRESHOLD,
            treat_missing_data=cloudwatch.TreatMissingData.BREACHING, actions_enabled=False,
            alarm_description=f"No training heartbeat for {stall_minutes} minutes (also between runs); "
                              "part of the stalled alarm, notifies nobody itself.")
        self.stalled = cloudwatch.CompositeAlarm(
            self, "RunStalled", composite_alarm_name=f"{self.deployment}-run-stalled",
            alarm_rule=cloudwatch.AlarmRule.all_of(
                cloudwatch.AlarmRule.from_alarm(self.run_active, cloudwatch.AlarmState.ALARM),
                cloudwatch.AlarmRule.from_alarm(self.silent, cloudwatch.AlarmState.ALARM)),
            alarm_description=(
                f"A training run started and has written no heartbeat for {stall_minutes} minutes "
                "without a last record: it hangs (a rank stuck in a collective, a dead data worker) "
                "or died (killed, out of memory, its node gone). The job's step watchdog requeues it "
                "after its --stall-minutes, from the latest checkpoint; check the nodes (dashboard "
                "GPU utilization, `sinfo -R` on the master) if it recurs. An evaluation or "
                "checkpoint longer than this also counts: raise stall_alarm_minutes then."))
        self.stalled.add_alarm_action(action)

        alerts = _Alerts(self, "Alerts", topic=topic)
        detail = events.EventField.from_path
        self.node_replaced = alerts.rule(
            "NodeReplaced", description="A cluster node failed a health or status check and is replaced",
            pattern=events.EventPattern(
                source=["aws.autoscaling"], detail_type=["EC2 Instance Terminate Successful"],
                detail={"AutoScalingGroupName": list(group_names),
                        "Cause": events.Match.any_of(*(events.Match.wildcard(c) for c in REPLACEMENT_CAUSES))}),
            message=events.RuleTargetInput.from_text(
                f"Cluster node {detail('$.detail.EC2InstanceId')} of {detail('$.detail.AutoScalingGroupName')} "
                f"was terminated and its group launches a replacement. Cause: {detail('$.detail.Cause')} "
                "Slurm requeues a job that ran on it; the job resumes from its latest checkpoint once "
                "the new node has joined and passed its health checks (docs/launch.md)."))

        self.dashboard = cloudwatch.Dashboard(
            self, "Dashboard", dashboard_name=f"{self.deployment}-training",
            default_interval=Duration.hours(6), widgets=self._widgets(file_system_id, lustre_file_system_id))

    # --- metrics and alarms --------------------------------------------------------------------

    def _metric(self, name: str, statistic: str, *, period: Duration = PERIOD, label: str | None = None,
                ) -> cloudwatch.Metric:
        return cloudwatch.Metric(namespace=m.NAMESPACE, metric_name=name, statistic=statistic, period=period,
                                 dimensions_map={m.DEPLOYMENT_DIMENSION: self.deployment}, label=label)

    def _count_alarm(self, id: str, metric_name: str, action, *, name: str,
                     description: str) -> cloudwatch.Alarm:
        alarm = self._metric(metric_name, "Sum").create_alarm(
            self, id, threshold=1, evaluation_periods=1, alarm_name=f"{self.deployment}-{name}",
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING, alarm_description=description)
        alarm.add_alarm_action(action)
        return alarm

    def _grant_node_metrics(self, roles: Sequence[iam.IRole]) -> None:
        policy = iam.Policy(self, "NodeMetrics", statements=[iam.PolicyStatement(
            sid="PutNodeMetrics", actions=["cloudwatch:PutMetricData"], resources=["*"],
            conditions={"StringEquals": {"cloudwatch:namespace": self.node_namespace}})])
        for role in roles:
            policy.attach_to_role(role)
        acknowledge(policy, "AwsSolutions-IAM5[Resource::*]",
                    "cloudwatch:PutMetricData has no resource-level scoping; the condition limits it "
                    "to this deployment's node namespace (the CloudWatch agent's GPU and EFA metrics).")

    # --- dashboard ---------------------------------------------------------------------------------

    def _widgets(self, file_system_id: str, lustre_file_system_id: str | None) -> list[list[cloudwatch.IWidget]]:
        avg = lambda name: self._metric(name, "Average", label=name)  # noqa: E731
        nodes = self.node_namespace
        evaluation = lambda names: [self._metric(n, "Maximum", period=EVALUATION_PERIOD, label=n)  # noqa: E731
                                    for n in names]
        return [
            [cloudwatch.TextWidget(width=24, height=2, markdown=(
                f"## Mask R-CNN training: {self.deployment}\n"
                f"Rank 0's records (namespace `{m.NAMESPACE}`, Deployment `{self.deployment}`; per run: "
                f"dimension `{m.RUN_DIMENSION}`) and the nodes' agent metrics (namespace `{nodes}`). "
                "Alarms notify the deployment's alerts topic."))],
            [cloudwatch.GraphWidget(title="Run progress", width=8,
                                    left=[self._metric(m.STEP, "Maximum", label=m.STEP)],
                                    right=[self._metric(m.EPOCH, "Maximum", label=m.EPOCH)]),
             cloudwatch.GraphWidget(title="Images/s per GPU", width=8, left=[avg(m.IMAGES_PER_SECOND_PER_GPU)],
                                    right=[avg(m.IMAGES_PER_SECOND)]),
             cloudwatch.GraphWidget(title="Learning rate", width=8, left=[avg(m.LEARNING_RATE)])],
            [cloudwatch.GraphWidget(title="Losses (mean per record)", width=12,
                                    left=[avg(n) for n in m.LOSS_METRICS if n != m.TOTAL_COST],
                                    right=[avg(m.TOTAL_COST)]),
             cloudwatch.GraphWidget(title="COCO mAP", width=6, left=evaluation(
                 [m.map_metric_name(t, s) for t in m.IOU_TYPES for s in m.COCO_STAT_SUFFIXES[:3]])),
             cloudwatch.GraphWidget(title="COCO mAP by object size", width=6, left=evaluation(
                 [m.map_metric_name(t, s) for t in m.IOU_TYPES for s in m.COCO_STAT_SUFFIXES[3:]]))],
            [cloudwatch.GraphWidget(title="GPU utilization per node (%): mean of its GPUs", width=8, left=[
                _search(nodes, [m.NODE_DIMENSION], m.GPU_UTILIZATION, "Average")]),
             cloudwatch.GraphWidget(title="Least busy GPU per node (%)", width=8, left=[
                 _search(nodes, [m.NODE_DIMENSION], m.GPU_UTILIZATION, "Minimum")]),
             cloudwatch.GraphWidget(title="GPU memory used per node (MiB, the fullest GPU)", width=8, left=[
                 _search(nodes, [m.NODE_DIMENSION], m.GPU_MEMORY_USED, "Maximum")])],
            [cloudwatch.GraphWidget(title="EFA bytes received per node and minute", width=12, left=[
                _search(nodes, [m.NODE_DIMENSION], m.EFA_RX_BYTES, "Sum")]),
             cloudwatch.GraphWidget(title="EFA bytes sent per node and minute", width=12, left=[
                 _search(nodes, [m.NODE_DIMENSION], m.EFA_TX_BYTES, "Sum")])],
            _storage_widgets(file_system_id=file_system_id, lustre_file_system_id=lustre_file_system_id),
            [cloudwatch.GraphWidget(title="Run events (count per minute)", width=12, left=[
                self._metric(n, "Sum", label=n)
                for n in (m.RUN_FINISHED, m.RUN_FAILED, m.RUN_STOPPED, m.LOSS_NOT_FINITE, m.HEARTBEAT)]),
             cloudwatch.AlarmStatusWidget(title="Alarms", width=12, alarms=[
                 self.run_finished, self.run_failed, self.loss_not_finite, self.stalled])],
        ]

    @property
    def dashboard_url(self) -> str:
        stack = Stack.of(self)
        return (f"https://{stack.region}.console.aws.amazon.com/cloudwatch/home?region={stack.region}"
                f"#dashboards:name={self.dashboard.dashboard_name}")


class SageMakerMonitoring(Construct):
    """Dashboard of the SageMaker jobs' metrics and a notification when a job of the stack's
    training role completes, fails or is stopped."""

    def __init__(self, scope: Construct, id: str, *, topic: sns.ITopic, training_role_arn: str,
                 file_system_id: str, lustre_file_system_id: str | None) -> None:
        super().__init__(scope, id)
        stack = Stack.of(self)
        alerts = _Alerts(self, "Alerts", topic=topic)
        detail = events.EventField.from_path
        self.job_ended = alerts.rule(
            "TrainingJobEnded", description="A SageMaker training job of this stack completed, failed or stopped",
            pattern=events.EventPattern(
                source=["aws.sagemaker"], detail_type=["SageMaker Training Job State Change"],
                detail={"TrainingJobStatus": ["Completed", "Failed", "Stopped"], "RoleArn": [training_role_arn]}),
            # EventBridge reads every <name> in the text as a placeholder (its variables and
            # aws.events.*), so the text names the job by its own variable and the run in words.
            message=events.RuleTargetInput.from_text(
                f"SageMaker training job {detail('$.detail.TrainingJobName')}: "
                f"{detail('$.detail.TrainingJobStatus')}. {detail('$.detail.FailureReason')} "
                f"`maskrcnn sagemaker describe {detail('$.detail.TrainingJobName')}` shows the reason, "
                "final metrics and cost; a failed or stopped job continues from its checkpoints with "
                "`maskrcnn sagemaker start --run-name RUN --resume`, RUN being the job's "
                "maskrcnn-run-name tag."))

        ns, host = m.SAGEMAKER_NAMESPACE, m.SAGEMAKER_HOST_DIMENSION
        per_job = lambda name, statistic="Average", period=PERIOD: _search(  # noqa: E731
            ns, [host], name, statistic, period=period)
        evaluation = [m.map_metric_name(t, s) for t in m.IOU_TYPES for s in m.COCO_STAT_SUFFIXES[:3]]
        self.dashboard = cloudwatch.Dashboard(
            self, "Dashboard", dashboard_name=f"{stack.stack_name}-training", default_interval=Duration.hours(6),
            widgets=[
                [cloudwatch.TextWidget(width=24, height=2, markdown=(
                    f"## Mask R-CNN SageMaker jobs: {stack.stack_name}\n"
                    f"The metric definitions' values of every training job in this region (namespace "
                    f"`{ns}`, one line per job and host); SageMaker samples the log for them. Job ends "
                    "notify the deployment's alerts topic."))],
                [cloudwatch.GraphWidget(title="Images/s (job)", width=8, left=[per_job(m.IMAGES_PER_SECOND)]),
                 cloudwatch.GraphWidget(title="Learning rate", width=8, left=[per_job(m.LEARNING_RATE)]),
                 # SageMaker's instance metric: the host's GPUs' utilization added up (up to 100 per GPU).
                 cloudwatch.GraphWidget(title="GPU utilization per host (%, summed over its GPUs)", width=8,
                                        left=[per_job("GPUUtilization")])],
                [cloudwatch.GraphWidget(title="Losses (epoch means)", width=12, left=[
                    per_job(n, period=EVALUATION_PERIOD)
                    for n in (m.FASTRCNN_BOX_LOSS, m.FASTRCNN_LABEL_LOSS, m.MASKRCNN_LOSS)]),
                 cloudwatch.GraphWidget(title="COCO mAP", width=12, left=[
                     per_job(n, "Maximum", period=EVALUATION_PERIOD) for n in evaluation])],
                _storage_widgets(file_system_id=file_system_id, lustre_file_system_id=lustre_file_system_id),
            ])

    @property
    def dashboard_url(self) -> str:
        stack = Stack.of(self)
        return (f"https://{stack.region}.console.aws.amazon.com/cloudwatch/home?region={stack.region}"
                f"#dashboards:name={self.dashboard.dashboard_name}")
