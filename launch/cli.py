"""``maskrcnn``: one command for the whole journey, a subcommand per step.

Each subcommand is a module's ``main(argv)``, imported only when it runs (``maskrcnn --help`` stays
fast and needs neither TensorFlow nor the AWS SDK); ``maskrcnn SUB --help`` is that module's own
help. The same modules still run as ``python -m MODULE`` (the training image and the tests start
them that way).
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import sys

PROG = "maskrcnn"
DISTRIBUTION = "maskrcnn-on-aws"   # pyproject.toml's project name; its version is the one source
# What pyproject.toml's `train` extra brings (as imported): the client install has none of them.
TRAINER_IMPORTS = frozenset({"tensorflow", "tf_keras", "tensorpack", "horovod", "cv2", "pycocotools",
                             "mpi4py", "sagemaker_training", "flask", "gunicorn"})


@dataclasses.dataclass(frozen=True)
class Command:
    module: str         # runs as module.main([*args, *argv]) -> exit status
    summary: str
    example: str
    group: str
    args: tuple = ()


# The order is the journey's: set up, data, train, look at results, serve.
COMMANDS: dict[str, Command] = {
    "settings": Command("infra.settings", "this deployment's settings (settings.json), read by every cdk command",
                        "maskrcnn settings set instance_type=p4d.24xlarge worker_count=3", "set up"),
    "preflight": Command("launch.preflight", "read-only checks of the account before a deploy: zones, quotas, "
                         "reservations", "maskrcnn preflight --region us-east-1", "set up"),
    "cluster": Command("launch.cluster.capacity", "pause, resume and show the EC2 cluster's node groups",
                       "maskrcnn cluster pause", "set up"),
    "cost": Command("launch.cost", "what the deployment's cluster (settings.json) or a SageMaker job costs",
                    "maskrcnn cost --hours 72", "set up"),
    "data": Command("launch.staging.__main__", "stage datasets and weights: download, upload to S3, copy to EFS or FSx",
                    "maskrcnn data download --stage-dir ./stage", "data"),
    "check-data": Command("training.data.check", "validate a COCO-format dataset and render annotated samples",
                          "maskrcnn check-data --annotations labels/train.json --images photos/train", "data"),
    "synthetic": Command("training.data.synthetic", "write a synthetic COCO-format dataset of shapes",
                         "maskrcnn synthetic --output data/synthetic --train 1000 --val 100", "data"),
    "train": Command("training.train", "train on this machine (under horovodrun for several processes)",
                     "maskrcnn train --logdir runs/r1 --preset cpu_synthetic", "train"),
    "demo": Command("training.local_job", "the offline demo: synthetic data, 2-process Horovod training, mAP",
                    "maskrcnn demo", "train"),
    "job": Command("launch.cluster.jobs", "EC2 cluster runs as Slurm jobs: submit, status, logs, stop, list "
                   "(on the master)", "maskrcnn job submit TRAIN.BATCH_SIZE_PER_GPU=4", "train"),
    "sagemaker": Command("launch.sagemaker.launcher", "SageMaker training jobs: start, describe, logs, stop",
                         "maskrcnn sagemaker start --instance-type ml.p4d.24xlarge --instance-count 2 --dry-run",
                         "train"),
    "smoke-aws": Command("launch.smoke", "deploy a small CPU copy on your account, train both ways, tear down",
                         "maskrcnn smoke-aws --region us-east-1", "train"),
    "predict": Command("training.predict", "detections of a checkpoint or model file on images or a split, drawn on "
                       "request, "
                       "and COCO evaluation", "maskrcnn predict --checkpoint runs/r1 --split val2017 "
                       "--output results.json", "results"),
    "evaluate": Command("training.predict", "COCO evaluation of a checkpoint or model file on a split: the mAP table with "
                        "the AP of each class", "maskrcnn evaluate --checkpoint runs/r1 --split val2017",
                        "results", args=("--evaluate",)),
    "export": Command("training.export", "a checkpoint or model file as a TensorFlow SavedModel that takes image bytes",
                      "maskrcnn export --checkpoint runs/r1 --output exported/r1", "serve"),
    "serve": Command("launch.sagemaker.serve", "the model server of SageMaker's hosting contract (GET /ping, "
                     "POST /invocations on port 8080)", "maskrcnn serve --model-dir exported/r1", "serve"),
    "endpoint": Command("launch.sagemaker.endpoint", "a trained model as a SageMaker endpoint or batch transform "
                        "job: deploy, invoke with an image, list, delete",
                        "maskrcnn endpoint invoke ENDPOINT_NAME photo.jpg --draw detections.jpg", "serve"),
}


def _usage() -> str:
    lines = [f"usage: {PROG} COMMAND [ARGS...]", "",
             "Mask R-CNN on AWS: from a dataset to trained and served models, on an EC2 cluster or SageMaker.",
             f"`{PROG} COMMAND --help` shows a command's options; `{PROG} --version` the version.", ""]
    width = max(map(len, COMMANDS))
    group = None
    for name, command in COMMANDS.items():
        if command.group != group:
            group = command.group
            lines.append(f"{group}:")
        lines.append(f"  {name:<{width}}  {command.summary}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if argv[0] == "--version":
        try:
            print(f"{PROG} {importlib.metadata.version(DISTRIBUTION)}")
        except importlib.metadata.PackageNotFoundError:
            print(f"{PROG}: error: the {DISTRIBUTION} package is not installed here "
                  f"(python -m pip install -c constraints.txt -e .)", file=sys.stderr)
            return 1
        return 0
    name, rest = argv[0], argv[1:]
    command = COMMANDS.get(name)
    if command is None:
        print(f"{PROG}: error: unknown command {name!r}; one of: {', '.join(COMMANDS)} "
              f"(`{PROG} --help` says what each does)", file=sys.stderr)
        return 2
    # argparse names the program after argv[0] where a module sets no prog of its own.
    sys.argv = [f"{PROG} {name}", *rest]
    # The trainer's modules import TensorFlow once their arguments are read (--help needs none of
    # it), so a missing trainer install shows at the import or inside main.
    try:
        module = importlib.import_module(command.module)
        status = module.main([*command.args, *rest])
    except ModuleNotFoundError as missing:
        if (missing.name or "").partition(".")[0] not in TRAINER_IMPORTS:
            raise
        print(f"{PROG}: error: `{PROG} {name}` runs the trainer, which this install lacks (no module "
              f"{missing.name!r}): python -m pip install -c constraints.txt -e '.[train]'", file=sys.stderr)
        return 2
    except SystemExit as done:       # argparse's --help and usage errors end this way
        if done.code == 0 and ("-h" in rest or "--help" in rest):
            print(f"\nexample: {command.example}")
        raise
    return status if isinstance(status, int) else 0


if __name__ == "__main__":
    sys.exit(main())
