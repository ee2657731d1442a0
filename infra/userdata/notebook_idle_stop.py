#!/usr/bin/python3
"""Stops this SageMaker notebook instance once nothing has happened in it for --idle-minutes.

A systemd timer that the on-start lifecycle script installs runs it every 5 minutes. It asks the
notebook's own Jupyter server (REST API): a kernel that is busy keeps the notebook running, however
long its cell takes; otherwise the latest of each kernel's and terminal's last activity and the
server's start must be --idle-minutes old. Open browser tabs alone do not count. Then it calls
StopNotebookInstance on the notebook's own name with the AWS CLI, if the notebook is InService.
Only the standard library: it runs on the system python3 of the image, which has no boto3."""
from __future__ import annotations

import argparse
import json
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from datetime import datetime, timedelta, timezone

JUPYTER_URL = "https://localhost:8443"
METADATA_FILE = "/opt/ml/metadata/resource-metadata.json"


def parse_time(text: str) -> datetime:
    # Jupyter writes UTC with a trailing Z, which fromisoformat reads only from Python 3.11.
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def jupyter_state(url: str) -> dict:
    """/api/status, /api/sessions, /api/kernels and /api/terminals of the Jupyter server at `url`
    (None for an endpoint the server does not have: terminals can be switched off)."""
    # SageMaker's server answers on localhost with a self-signed certificate.
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    state = {}
    for name in ("status", "sessions", "kernels", "terminals"):
        try:
            with urllib.request.urlopen(f"{url}/api/{name}", context=context,
                                        timeout=30) as response:
                state[name] = json.load(response)
        except urllib.error.HTTPError as error:
            if error.code != 404:
                raise
            state[name] = None
    return state


def idle_decision(state: dict, now: datetime, idle: timedelta) -> tuple[bool, str]:
    """(whether to stop, why) for the server `state` that jupyter_state returned."""
    kernels = list(state["kernels"] or [])
    kernels += [s["kernel"] for s in state["sessions"] or [] if s.get("kernel")]
    busy = sorted({k["id"] for k in kernels if k.get("execution_state") == "busy"})
    if busy:
        return False, f"kernel {', '.join(busy)} is busy"
    # The server's start counts as activity: a notebook just started is not stopped at once.
    times = [parse_time(state["status"]["started"])]
    times += [parse_time(item["last_activity"]) for item in kernels + (state["terminals"] or [])
              if item.get("last_activity")]
    last = max(times)
    if now - last < idle:
        return False, f"last activity {last.isoformat()}, less than {idle} ago"
    return True, f"no kernel busy and no activity since {last.isoformat()}"


def notebook_instance(metadata_file: str) -> tuple[str, str]:
    """This notebook instance's name and region, from the metadata file SageMaker writes."""
    with open(metadata_file) as f:
        metadata = json.load(f)
    # arn:<partition>:sagemaker:<region>:<account>:notebook-instance/<name>
    return metadata["ResourceName"], metadata["ResourceArn"].split(":")[3]


def sagemaker(*args: str, region: str) -> str:
    return subprocess.run(["aws", "sagemaker", *args, "--region", region, "--output", "text"],
                          check=True, capture_output=True, text=True).stdout.strip()


def main(argv: list[str] | None = None, now: datetime | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--idle-minutes", type=int, required=True)
    parser.add_argument("--jupyter-url", default=JUPYTER_URL)
    parser.add_argument("--metadata-file", default=METADATA_FILE)
    args = parser.parse_args(argv)
    if args.idle_minutes < 1:
        parser.error("--idle-minutes must be at least 1")
    try:
        state = jupyter_state(args.jupyter_url)
    except OSError as error:
        # No answer (the server starting or restarting) is no evidence of idleness.
        print(f"Jupyter at {args.jupyter_url} could not be asked ({error}): not stopping")
        return 1
    stop, reason = idle_decision(state, now or datetime.now(timezone.utc),
                                 timedelta(minutes=args.idle_minutes))
    if not stop:
        print(f"Not idle: {reason}")
        return 0
    name, region = notebook_instance(args.metadata_file)
    status = sagemaker("describe-notebook-instance", "--notebook-instance-name", name,
                       "--query", "NotebookInstanceStatus", region=region)
    if status != "InService":
        print(f"Idle ({reason}), but {name} is {status}: nothing to stop")
        return 0
    print(f"Idle ({reason}): stopping {name}")
    sagemaker("stop-notebook-instance", "--notebook-instance-name", name, region=region)
    return 0


if __name__ == "__main__":
    sys.exit(main())
