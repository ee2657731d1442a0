"""Data staging commands (what prepare-s3-bucket.sh and prepare-efs.sh did)::

    python -m launch.staging download --stage-dir /data/stage          # COCO 2017 + weights, verified
    python -m launch.staging upload   --stage-dir /data/stage          # -> s3://<stack bucket>/data/coco/
    python -m launch.staging to-efs   --efs-dir /efs/data/coco         # s3://<stack bucket>/data/coco/ -> EFS

``upload`` and ``to-efs`` read the bucket from the stack's BucketName output (``--stack``), or take
``--bucket``. Each command can be rerun: finished work is skipped.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from infra import outputs
from launch.aws import LaunchError, make_session, require_output, stack_outputs
from launch.staging import download as dl
from launch.staging import s3sync
from launch.staging.diskspace import human

DEFAULT_PREFIX = "data/coco"
DEFAULT_STACK = getattr(outputs, "NETWORK_STORAGE_STACK", outputs.SAGEMAKER_STACK)


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
    return require_output(stack_outputs(session, args.stack), outputs.BUCKET_NAME, args.stack)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m launch.staging", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("download", help="download, verify and extract COCO 2017 and the pretrained weights")
    d.add_argument("--stage-dir", required=True, type=Path)
    d.add_argument("--manifest", help="JSON list of artifacts replacing the built-in COCO 2017 list")
    d.add_argument("--url", action="append", metavar="NAME=URL", help="replace an artifact's URL (a mirror)")
    d.add_argument("--checksum", action="append", metavar="NAME=ALGO:HEX", help="pin or replace a checksum")
    d.add_argument("--allow-unpinned", action="store_true",
                   help="accept artifacts without a pinned checksum and record their sha256")

    for name, text in (("upload", "upload <stage-dir>/coco to s3://BUCKET/PREFIX (parallel, resumable)"),
                       ("to-efs", "copy s3://BUCKET/PREFIX to an EFS directory (parallel, resumable)")):
        s = sub.add_parser(name, help=text)
        s.add_argument("--bucket", help="bucket name (default: the stack's BucketName output)")
        s.add_argument("--stack", default=DEFAULT_STACK, help=f"stack to read the bucket from (default {DEFAULT_STACK})")
        s.add_argument("--prefix", default=DEFAULT_PREFIX)
        s.add_argument("--region")
        s.add_argument("--concurrency", type=int, default=s3sync.default_concurrency())
        if name == "upload":
            s.add_argument("--stage-dir", required=True, type=Path)
        else:
            s.add_argument("--efs-dir", default="/efs/data/coco", type=Path)

    a = p.parse_args(argv)
    try:
        if a.command == "download":
            artifacts = dl.load_manifest(a.manifest) if a.manifest else dl.COCO_2017
            artifacts = dl.with_overrides(artifacts, _pairs(a.url, "--url"), _pairs(a.checksum, "--checksum"))
            stage = dl.stage_dataset(a.stage_dir, artifacts, allow_unpinned=a.allow_unpinned)
            print(f"staged under {stage / 'coco'}; checksums in {stage / 'checksums.json'}")
            return 0
        session = make_session(a.region)
        bucket = _bucket(a, session)
        if a.command == "upload":
            report = s3sync.upload_tree(session, a.stage_dir / "coco", bucket, a.prefix, concurrency=a.concurrency)
            verb, where = "uploaded", f"s3://{bucket}/{a.prefix}"
        else:
            report = s3sync.copy_to_local(session, bucket, a.prefix, a.efs_dir, concurrency=a.concurrency)
            verb, where = "copied", str(a.efs_dir)
        print(f"{verb} {len(report.transferred)} file(s) ({human(report.bytes_transferred)}) to {where}; "
              f"{len(report.skipped)} already there")
        return 0
    except LaunchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
