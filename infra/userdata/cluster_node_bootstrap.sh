#!/bin/bash
# The user data of an EfsClusterStack node, after the lines that write /etc/maskrcnn/cluster.env.
# cloud-init runs it once, as root, on first boot. It sets up the boot's log, fetches the boot
# steps (cluster_node.sh, a CDK asset in S3: the user data stays far below EC2's 16 KB limit however
# the steps grow), checks them against the SHA-256 the launch template carries, and runs them in
# this shell. Reporting the boot's result lives here, so that a node that cannot even fetch its
# steps is counted and reported like any other failure (docs/infra.md, "When nodes fail to boot").
set -Eeuo pipefail
exec > >(tee -a /var/log/maskrcnn-boot.log) 2>&1

set -a
# shellcheck source=/dev/null
. /etc/maskrcnn/cluster.env
set +a
export AWS_DEFAULT_REGION="$AWS_REGION"
# The instance metadata service; the variable is the AWS SDKs' standard override.
IMDS="${AWS_EC2_METADATA_SERVICE_ENDPOINT:-http://169.254.169.254}"
IMDS="${IMDS%/}"
BOOT_LOG=/var/log/maskrcnn-boot.log
BOOT_STEPS=/etc/maskrcnn/cluster_node.sh
# The steps set this once the CloudWatch agent ships the boot log. A failing node then waits this
# long before it has itself replaced, so that the agent (5 s flush interval) sends the last lines.
# Nothing sets the variable on an instance; the boot tests shorten the wait with it.
LOGS_SHIPPED=0
LOG_FLUSH_SECONDS="${MASKRCNN_BOOT_LOG_FLUSH_SECONDS:-15}"

log() { echo "[maskrcnn-boot $(date -u +%FT%TZ)] $*" >&2; }

retry() {  # retry ATTEMPTS DELAY_SECONDS COMMAND...
  local attempts=$1 delay=$2 n=1
  shift 2
  until "$@"; do
    if (( n >= attempts )); then
      log "gave up after $n attempts: $*"
      return 1
    fi
    n=$((n + 1))
    sleep "$delay"
  done
}

imds() {  # IMDSv2: the launch template requires session tokens
  local token
  token=$(curl -sf -X PUT "$IMDS/latest/api/token" \
    -H 'X-aws-ec2-metadata-token-ttl-seconds: 300')
  curl -sf -H "X-aws-ec2-metadata-token: $token" "$IMDS/latest/meta-data/$1"
}

signal() {  # report this node's boot result to the auto-scaling group's creation policy
  aws cloudformation signal-resource --stack-name "$STACK_NAME" \
    --logical-resource-id "$ASG_LOGICAL_ID" --unique-id "$INSTANCE_ID" --status "$1" || true
}

set_failure_count() {
  aws ssm put-parameter --name "$BOOT_FAILURES_PARAMETER" --value "$1" --overwrite >/dev/null
}

count_failure() {  # prints the group's number of consecutive failed boots, this one included
  local count
  count=$(aws ssm get-parameter --name "$BOOT_FAILURES_PARAMETER" --query Parameter.Value \
            --output text) || return 1
  [[ "$count" =~ ^[0-9]+$ ]] || count=0
  count=$((count + 1))
  set_failure_count "$count" || return 1
  echo "$count"
}

stop_launching() {  # stop_launching COUNT STEP: the group launches no more nodes; tell the topic
  local count=$1 step=$2 state subject
  local resume="aws autoscaling resume-processes --auto-scaling-group-name $ASG_NAME"
  resume+=" --scaling-processes Launch --region $AWS_REGION"
  if aws autoscaling suspend-processes --auto-scaling-group-name "$ASG_NAME" \
       --scaling-processes Launch; then
    state="has stopped launching nodes"
    subject="$ASG_NAME stopped launching after $count failed boots"
    # After a resume the group gets the whole limit again, not one more try.
    set_failure_count 0 || log "could not reset $BOOT_FAILURES_PARAMETER"
  else
    state="could not be stopped (suspending its Launch process failed) and keeps launching nodes"
    subject="$ASG_NAME: $count failed boots, could not stop launching"
  fi
  log "$ASG_NAME $state: $count boots in a row failed"
  # SNS takes subjects of up to 100 characters.
  aws sns publish --topic-arn "$ALERTS_TOPIC_ARN" --subject "${subject:0:100}" \
    --message "The auto-scaling group $ASG_NAME $state: $count node boots in a row failed \
(boot_failure_limit is $BOOT_FAILURE_LIMIT).

Last failed node: $INSTANCE_ID ($ROLE, $INSTANCE_TYPE, $PRIVATE_IP)
Failed step: $step
Boot logs: CloudWatch Logs group $LOG_GROUP, streams $INSTANCE_ID/maskrcnn-boot.log and \
$INSTANCE_ID/cloud-init-output.log

Last lines of its boot log:
$(tail -n 40 "$BOOT_LOG" | cut -c1-300)

Once the cause is fixed, resume launching (the group then starts nodes up to its desired capacity):
  $resume" >/dev/null || log "could not publish to $ALERTS_TOPIC_ARN"
}

boot_failed() {  # the ERR trap: count the failure, stop the group at the limit, get replaced
  local line=$1 file=${BASH_SOURCE[1]:-} step="" i count
  # Command substitutions and pipelines inherit the trap: only the boot's own shell reports.
  if (( BASH_SUBSHELL > 0 )); then
    exit 1
  fi
  trap - ERR
  set +e
  for ((i = ${#FUNCNAME[@]} - 1; i > 0; i--)); do  # the outermost function is the boot step
    case "${FUNCNAME[i]}" in
      main | source) ;;
      *) step="${FUNCNAME[i]}, "; break ;;
    esac
  done
  step+="${file##*/} line $line: $(sed -n "${line}{s/^ *//;p}" "$file" 2>/dev/null)"
  log "boot failed at $step"
  if count=$(count_failure); then
    log "$count of $BOOT_FAILURE_LIMIT consecutive failed boots in $ASG_NAME"
    if (( count >= BOOT_FAILURE_LIMIT )); then
      stop_launching "$count" "$step"
    fi
  else
    log "could not count this failure in $BOOT_FAILURES_PARAMETER"
  fi
  # At stack creation the FAILURE signal fails the deploy. After it (a replacement or scale-out
  # node), CloudFormation ignores signals: marking the instance unhealthy makes its group
  # terminate and replace it, instead of keeping a broken node InService.
  signal FAILURE
  if (( LOGS_SHIPPED )); then
    sleep "$LOG_FLUSH_SECONDS"
  fi
  aws autoscaling set-instance-health --instance-id "$INSTANCE_ID" --health-status Unhealthy \
    --no-should-respect-grace-period || true
  exit 1
}

boot_succeeded() {  # a node that boots ends its group's run of failures
  set_failure_count 0 || log "could not reset $BOOT_FAILURES_PARAMETER"
  signal SUCCESS
}

fetch_boot_steps() {  # the steps as synthesized: a changed object in the assets bucket is not run
  local sha256
  retry 10 15 aws s3 cp --only-show-errors "$BOOT_SCRIPT_URL" "$BOOT_STEPS.download"
  sha256=$(sha256sum "$BOOT_STEPS.download" | cut -d' ' -f1)
  if [[ "$sha256" != "$BOOT_SCRIPT_SHA256" ]]; then
    log "$BOOT_SCRIPT_URL has SHA-256 $sha256, the launch template $BOOT_SCRIPT_SHA256: not run"
    return 1
  fi
  mv "$BOOT_STEPS.download" "$BOOT_STEPS"
}

INSTANCE_ID=$(retry 10 3 imds instance-id)
PRIVATE_IP=$(retry 10 3 imds local-ipv4)
INSTANCE_TYPE=$(retry 10 3 imds instance-type)
trap 'boot_failed $LINENO' ERR

fetch_boot_steps
# shellcheck source=/dev/null
. "$BOOT_STEPS"
boot_succeeded
