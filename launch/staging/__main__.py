"""Data staging commands (what prepare-s3-bucket.sh and prepare-efs.sh did)::

    maskrcnn data download --stage-dir /data/stage          # COCO 2017 + weights, verified
    maskrcnn data download --stage-dir ./stage --weights-only   # the weights files alone
    maskrcnn data upload   --stage-dir /data/stage          # -> s3://<stack bucket>/data/coco/
    maskrcnn data to-efs   --efs-dir /efs/data/coco         # s3://<stack bucket>/data/coco/ -> EFS

Your own dataset, a folder of any layout, under a name of its own (never COCO's ``coco``)::

    maskrcnn data upload --dataset-dir ./mine --name mine   # -> s3://<stack bucket>/data/mine/
    maskrcnn data to-efs --name mine                        # -> /efs/data/mine

FSx for Lustre, where the stacks have it, shows ``s3://<bucket>/data/<name>/`` as ``/fsx/<name>``.
``upload`` and ``to-efs`` read the bucket from a stack's BucketName output (``--stack``, by default
the first of BUCKET_STACKS, with the deployment's name prefix (launch/deployment.py), these credentials
may read), or take ``--bucket``. Each command can be rerun: finished work is skipped.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from infra import outputs
from botocore.exceptions import ClientError

from launch import deployment
from launch.aws import LaunchError, make_session, require_output, stack_outputs
from launch.staging import download as dl
from launch.staging import s3sync
from launch.staging.diskspace import human

# s3://<bucket>/data/<name>/: the prefix FSx for Lustre imports, so a dataset is /fsx/<name> there
DATA_PREFIX = outputs.LUSTRE_IMPORT_PREFIX
COCO_NAME = outputs.LUSTRE_COCO_DIR          # COCO 2017 as `download` stages it
DEFAULT_PREFIX = f"{DATA_PREFIX}/{COCO_NAME}"
EFS_DATA_DIR = "/efs/data"                   # the cluster nodes' EFS data folder; <name> below it
# Every stack has the bucket's name among its outputs, and each role may read only its own stack's
# (the notebook's SageMakerStack, the cluster nodes' EfsClusterStack): without --stack, the first
# of these that exists and that these credentials may read is used.
BUCKET_STACKS = (outputs.SAGEMAKER_STACK, outputs.EFS_CLUSTER_STACK, outputs.NETWORK_STORAGE_STACK)
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def dataset_prefix(name: str) -> str:
    """The S3 prefix of the dataset ``name``; a clear error for a name that is no single folder name."""
    if not NAME_PATTERN.fullmatch(name or ""):
        raise LaunchError(f"dataset name {name!r}: use letters, digits, '.', '_' and '-' (at most 100, "
                          f"starting with a letter or digit), e.g. --name my-parts")
    return f"{DATA_PREFIX}/{name}"


def _prefix(args, default_name: str) -> str:
    if args.prefix and args.name:
        raise LaunchError(f"--prefix {args.prefix!r} and --name {args.name!r}: give one (--name N is "
                          f"--prefix {DATA_PREFIX}/N)")
    return args.prefix or dataset_prefix(args.name or default_name)


def upload_source(args) -> tuple[Path, str]:
    """(local folder, S3 prefix) of an upload: COCO as `download` staged it, or a dataset folder."""
    if args.stage_dir is not None:
        return args.stage_dir / COCO_NAME, _prefix(args, COCO_NAME)
    folder = args.dataset_dir
    if not folder.is_dir():
        raise LaunchError(f"--dataset-dir {folder} is not a folder: give the folder that holds your annotation "
                          f"file(s) and images")
    name = args.name or (None if args.prefix else folder.resolve().name)
    if name == COCO_NAME:
        raise LaunchError(f"the name {COCO_NAME!r} is COCO 2017's (`upload --stage-dir`): give your dataset its "
                          f"own, e.g. --name my-parts")
    if next(folder.rglob("*.json"), None) is None:
        raise LaunchError(f"{folder} holds no .json annotation file: is it the dataset's folder? "
                          f"(check it first: maskrcnn check-data --annotations F --images D)")
    return folder, _prefix(argparse.Namespace(prefix=args.prefix, name=name), COCO_NAME)


def _pairs(values: list[str], flag: str) -> dict[str, str]:
    out = {}
    for v in values or []:
        name, sep, value = v.partition("=")
        if not sep or not name or not value:
            raise LaunchError(f"{flag} takes NAME=VALUE, got {v!r}")
        out[name] = value
    return out


def _bucket(args, session) -> str:
    if args.bucket:
        return args.bucket
    if args.stack:
        return require_output(stack_outputs(session, args.stack), outputs.BUCKET_NAME, args.stack)
    tried = []
    prefix = deployment.name_prefix()
    for stack in (deployment.stack_name(stack_id, prefix=prefix) for stack_id in BUCKET_STACKS):
        try:
            found = stack_outputs(session, stack)
        except LaunchError as err:
            tried.append(str(err).split(":")[0])
            continue
        except ClientError as err:
            if err.response.get("Error", {}).get("Code") not in ("AccessDenied", "AccessDeniedException"):
                raise
            tried.append(f"stack {stack!r} is not readable with these credentials")
            continue
        if found.get(outputs.BUCKET_NAME):
            return found[outputs.BUCKET_NAME]
        tried.append(f"stack {stack!r} has no {outputs.BUCKET_NAME} output")
    raise LaunchError(f"no stack's bucket found ({'; '.join(tried)}): deploy the stacks, or pass --stack NAME "
                      f"(the stack's name as CloudFormation shows it, with its name_prefix) or --bucket")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="maskrcnn data", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("download", help="download, verify and extract COCO 2017 and the pretrained weights")
    d.add_argument("--stage-dir", required=True, type=Path)
    d.add_argument("--manifest", help="JSON list of artifacts replacing the built-in COCO 2017 list")
    d.add_argument("--url", action="append", metavar="NAME=URL", help="replace an artifact's URL (a mirror)")
    d.add_argument("--checksum", action="append", metavar="NAME=ALGO:HEX", help="pin or replace a checksum")
    d.add_argument("--allow-unpinned", action="store_true",
                   help="accept artifacts without a pinned checksum and record their sha256")
    d.add_argument("--weights-only", action="store_true",
                   help=f"only the weights files (ImageNet backbone, COCO model) into <stage-dir>/{dl.WEIGHTS_TARGET}, "
                        f"without the COCO images and annotations (19 GB)")

    for name, text in (("upload", f"upload <stage-dir>/{COCO_NAME}, or a dataset folder, to "
                                  f"s3://BUCKET/{DATA_PREFIX}/<name> (parallel, resumable)"),
                       ("to-efs", f"copy s3://BUCKET/{DATA_PREFIX}/<name> to an EFS directory (parallel, resumable)")):
        s = sub.add_parser(name, help=text)
        s.add_argument("--bucket", help="bucket name (default: the stack's BucketName output)")
        s.add_argument("--stack", help=f"stack to read the bucket from (default: the first of "
                                       f"{', '.join(BUCKET_STACKS)}, with the deployment's name_prefix in front, "
                                       f"that these credentials may read)")
        s.add_argument("--name", help=f"the dataset's name: s3://BUCKET/{DATA_PREFIX}/<name>, {EFS_DATA_DIR}/<name> "
                                      f"(default: {COCO_NAME} for --stage-dir and to-efs, the folder's name for "
                                      f"--dataset-dir)")
        s.add_argument("--prefix", help=f"the S3 prefix itself, instead of --name (default {DEFAULT_PREFIX})")
        s.add_argument("--region")
        s.add_argument("--concurrency", type=int, default=s3sync.default_concurrency())
        if name == "upload":
            source = s.add_mutually_exclusive_group(required=True)
            source.add_argument("--stage-dir", type=Path, help=f"COCO as `download` staged it (<stage-dir>/{COCO_NAME})")
            source.add_argument("--dataset-dir", type=Path,
                                help="your dataset's folder (annotation files and images, any layout), uploaded as it is")
        else:
            s.add_argument("--efs-dir", type=Path, help=f"where the copy goes (default {EFS_DATA_DIR}/<name>)")

    a = p.parse_args(argv)
    try:
        if a.command == "download":
            artifacts = dl.load_manifest(a.manifest) if a.manifest else dl.COCO_2017
            artifacts = dl.with_overrides(artifacts, _pairs(a.url, "--url"), _pairs(a.checksum, "--checksum"))
            if a.weights_only:
                artifacts = dl.weights_only(artifacts)
            stage = dl.stage_dataset(a.stage_dir, artifacts, allow_unpinned=a.allow_unpinned)
            where = stage / (dl.WEIGHTS_TARGET if a.weights_only else "coco")
            print(f"staged under {where}; checksums in {stage / 'checksums.json'}")
            return 0
        if a.command == "upload":
            folder, prefix = upload_source(a)
        else:
            prefix = _prefix(a, COCO_NAME)
            efs_dir = a.efs_dir or Path(EFS_DATA_DIR, prefix.rstrip("/").rsplit("/", 1)[-1])
        session = make_session(a.region)
        bucket = _bucket(a, session)
        if a.command == "upload":
            report = s3sync.upload_tree(session, folder, bucket, prefix, concurrency=a.concurrency)
            verb, where = "uploaded", f"s3://{bucket}/{prefix}"
        else:
            report = s3sync.copy_to_local(session, bucket, prefix, efs_dir, concurrency=a.concurrency)
            verb, where = "copied", str(efs_dir)
        print(f"{verb} {len(report.transferred)} file(s) ({human(report.bytes_transferred)}) to {where}; "
              f"{len(report.skipped)} already there")
        return 0
    except LaunchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
