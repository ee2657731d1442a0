"""SageMaker entry for the ps strategy: every instance runs this; it starts that instance's tasks.

ModelTrainer (sagemaker 3.x) runs the entry script on every instance with the hyperparameters as
arguments and SM_HOSTS / SM_CURRENT_HOST set. There is no parameter-server driver in 3.x (the
2.x TensorFlow estimator's ``parameter_server`` distribution set TF_CONFIG through the framework
container's toolkit), so this script gives each instance the layout of SageMaker's script-mode
example (parameter server and Horovod) itself: a parameter server on every instance, the chief on
the first, a worker on each of the others. Each task is ``train.py`` with its own TF_CONFIG, exactly
as ``python -m script_mode.local --strategy ps`` runs them on one machine.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

if not __package__:
    # Run as a file (SageMaker's entry_script): make the `script_mode` package importable.
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from script_mode import cluster as cl  # noqa: E402
from script_mode import ps_tasks  # noqa: E402

TRAIN_SCRIPT = Path(__file__).resolve().with_name("train.py")
# The job's own MaxRuntimeInSeconds stops it on SageMaker; this only bounds a stuck task here.
TASK_TIMEOUT_S = 7 * 24 * 3600


def main(argv: list[str] | None = None, environ: dict[str, str] | None = None) -> int:
    env = dict(os.environ if environ is None else environ)
    try:
        hosts = json.loads(env["SM_HOSTS"])
        current = env["SM_CURRENT_HOST"]
    except KeyError as missing:
        print(f"error: {missing} is not set: this entry runs inside a SageMaker training job; "
              f"locally use `python -m script_mode.local --strategy ps`", file=sys.stderr)
        return 2
    try:
        cluster, tasks = cl.sagemaker_cluster(sorted(hosts), current)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    env.setdefault("TF_USE_LEGACY_KERAS", "1")
    print(f"{current}: tasks {[f'{t.type}-{t.index}' for t in tasks]} of cluster "
          f"{json.dumps(cluster)}", flush=True)
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        return ps_tasks.run_tasks([sys.executable, str(TRAIN_SCRIPT), *args], cluster, tasks, env,
                                  None, TASK_TIMEOUT_S)
    except ps_tasks.TaskFailed as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
