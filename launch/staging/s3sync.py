"""Parallel, resumable copies between a local tree and S3 (boto3's TransferManager: multipart,
many files at once), with one progress bar over all bytes.

Upload resume: every object carries its file's sha256 in its metadata (``x-amz-meta-sha256``); a file
whose object already has the same size and sha256 is skipped, so an interrupted upload picks up
where it stopped. (S3's ETag is no content hash for multipart uploads, hence our own.)
S3 -> EFS copy: files already there with the object's size are skipped; free space is checked
before the first byte is written; each worker fetches an object with one GET (ranged GETs in
parallel for large ones), checks it against the sha256 recorded in that GET's metadata and renames
it into place, so the per-file cost is one S3 request and one file creation on EFS.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import posixpath
import threading
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

import boto3
import urllib3
from boto3.s3.transfer import TransferConfig, create_transfer_manager
from botocore.config import Config
from botocore.exceptions import ClientError, IncompleteReadError, NoCredentialsError, ResponseStreamingError
from s3transfer.subscribers import BaseSubscriber
from tqdm import tqdm

from launch.staging import s3get
from launch.staging.diskspace import StagingError, ensure_free_space
from launch.staging.download import CHUNK, file_digest

SHA256_KEY = "sha256"
MB = 1 << 20
# Objects larger than this are fetched as parallel ranged GETs of this size (the upload's part size).
PART_SIZE = 64 * MB
GET_ATTEMPTS = 3   # per object or part, for connections lost mid-body (botocore/urllib3 retry the rest)


@dataclasses.dataclass
class SyncReport:
    transferred: list[str] = dataclasses.field(default_factory=list)
    skipped: list[str] = dataclasses.field(default_factory=list)
    bytes_transferred: int = 0


class _Progress(BaseSubscriber):
    def __init__(self, bar: tqdm):
        self.bar = bar

    def on_progress(self, future, bytes_transferred, **kwargs):
        self.bar.update(bytes_transferred)


def _transfer_config(concurrency: int) -> TransferConfig:
    # 64 MiB parts: COCO's 18 GiB train2017.zip becomes ~300 parts, well under S3's 10,000 limit.
    return TransferConfig(multipart_threshold=PART_SIZE, multipart_chunksize=PART_SIZE,
                          max_concurrency=concurrency, use_threads=True)


def _check_bucket(client, bucket: str) -> None:
    try:
        client.head_bucket(Bucket=bucket)
    except NoCredentialsError:
        raise StagingError("no AWS credentials found: configure them with `aws configure` or `aws sso login`, "
                           "or run on the notebook instance / master node, which have a role") from None
    except ClientError as err:
        code = err.response.get("Error", {}).get("Code", "")
        if code in ("404", "NoSuchBucket", "NotFound"):
            raise StagingError(f"bucket {bucket!r} does not exist: use the stack's BucketName output "
                               f"(or --stack to read it) or create the bucket") from None
        if code in ("403", "AccessDenied", "Forbidden"):
            raise StagingError(f"access to bucket {bucket!r} denied: check the credentials' permissions") from None
        raise


def _key(prefix: str, rel: str) -> str:
    return f"{prefix.strip('/')}/{rel}" if prefix.strip("/") else rel


def upload_tree(session: boto3.session.Session, local_dir: str | Path, bucket: str, prefix: str, *,
                concurrency: int = 16, progress: bool = True, client=None) -> SyncReport:
    """Upload every file under ``local_dir`` to ``s3://bucket/prefix/<relative path>``."""
    local_dir = Path(local_dir)
    if not local_dir.is_dir():
        raise StagingError(f"{local_dir} is not a directory: stage the data first (maskrcnn data download)")
    client = client or session.client("s3")
    _check_bucket(client, bucket)
    files = sorted(p for p in local_dir.rglob("*") if p.is_file())
    report = SyncReport()

    def plan(path: Path):
        key = _key(prefix, path.relative_to(local_dir).as_posix())
        size, digest = path.stat().st_size, file_digest(path)
        try:
            head = client.head_object(Bucket=bucket, Key=key)
            if head["ContentLength"] == size and head.get("Metadata", {}).get(SHA256_KEY) == digest:
                return key, path, size, digest, True
        except ClientError as err:
            if err.response.get("Error", {}).get("Code") not in ("404", "NoSuchKey", "NotFound"):
                raise
        return key, path, size, digest, False

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        plans = list(pool.map(plan, files))
    todo = [p for p in plans if not p[4]]
    report.skipped = [p[0] for p in plans if p[4]]
    with tqdm(total=sum(p[2] for p in todo), unit="B", unit_scale=True, desc=f"upload s3://{bucket}",
              disable=not progress) as bar, create_transfer_manager(client, _transfer_config(concurrency)) as tm:
        futures = [(key, size, tm.upload(str(path), bucket, key, extra_args={"Metadata": {SHA256_KEY: digest}},
                                         subscribers=[_Progress(bar)]))
                   for key, path, size, digest, _ in todo]
        for key, size, future in futures:
            future.result()
            report.transferred.append(key)
            report.bytes_transferred += size
    return report


def _relative_path(key: str, root: str) -> str:
    """The key's path under ``root``, refused if it could land outside the destination.

    Checked on the text rather than with ``Path.resolve()``: resolving costs a round trip per path
    component on EFS, x 120,000 files."""
    rel = key[len(root) + 1:] if root else key
    norm = posixpath.normpath(rel)
    if not rel or posixpath.isabs(rel) or norm == ".." or norm.startswith("../") or norm == ".":
        raise StagingError(f"object key {key!r} would be written outside the destination; refusing")
    return norm


def _existing_sizes(dest: Path) -> dict[str, int]:
    """``{relative path: size}`` of the files already under ``dest``: one directory scan (NFS
    READDIRPLUS brings the sizes along) instead of a stat per object."""
    sizes = {}
    if not dest.is_dir():
        return sizes
    for folder, _, names in os.walk(dest):
        rel_folder = os.path.relpath(folder, dest)
        for name in names:
            try:
                size = os.stat(os.path.join(folder, name)).st_size
            except FileNotFoundError:
                continue
            sizes[name if rel_folder == "." else f"{rel_folder}/{name}"] = size
    return sizes


def _make_directories(dest: Path, rels: list[str]) -> None:
    """Every directory the copy needs, each created once (a per-file ``mkdir -p`` is a round trip
    per file on EFS)."""
    dest.mkdir(parents=True, exist_ok=True)
    needed = set()
    for rel in rels:
        parent = posixpath.dirname(rel)
        while parent and parent not in needed:
            needed.add(parent)
            parent = posixpath.dirname(parent)
    for rel in sorted(needed, key=lambda r: r.count("/")):   # parents before children
        try:
            os.mkdir(dest / rel)
        except FileExistsError:
            pass


class _ObjectCopy:
    """One object being copied to ``target`` through ``<target>.part`` (renamed when verified, so a
    file under its final name is always complete): one GET for a small object, ranged GETs of
    ``part_size`` in parallel for a large one."""

    def __init__(self, key: str, target: Path, size: int, part_size: int):
        self.key, self.target, self.size = key, target, size
        self.part = target.with_name(target.name + ".part")
        self.ranges = [(start, min(start + part_size, size) - 1) for start in range(0, size, part_size)] or [(0, -1)]
        self._left = len(self.ranges)
        self._lock = threading.Lock()
        self.expected_sha256 = None

    def part_done(self) -> bool:
        with self._lock:
            self._left -= 1
            return self._left == 0


def copy_to_local(session: boto3.session.Session, bucket: str, prefix: str, dest: str | Path, *,
                  concurrency: int = 32, progress: bool = True, client=None,
                  part_size: int = PART_SIZE) -> SyncReport:
    """Copy ``s3://bucket/prefix/`` into ``dest`` (e.g. /efs/data): the S3 -> EFS step.

    Each worker thread downloads, hashes as the bytes arrive, checks the object's recorded sha256
    (from the GET's own metadata: no HEAD) and renames into place; files already there with the
    object's size are skipped."""
    dest = Path(dest)
    client = client or session.client("s3", config=Config(max_pool_connections=concurrency,
                                                          retries={"mode": "standard", "max_attempts": 5}))
    _check_bucket(client, bucket)
    root = prefix.strip("/")
    objects = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{root}/" if root else ""):
        objects += [o for o in page.get("Contents", []) if not o["Key"].endswith("/")]
    if not objects:
        raise StagingError(f"nothing under s3://{bucket}/{root}: upload the data first (maskrcnn data upload)")
    report = SyncReport()
    existing = _existing_sizes(dest)
    todo = []
    for o in objects:
        rel = _relative_path(o["Key"], root)
        if existing.get(rel) == o["Size"]:
            report.skipped.append(o["Key"])
        else:
            todo.append((rel, _ObjectCopy(o["Key"], dest / rel, o["Size"], part_size)))
    ensure_free_space(dest, sum(c.size for _, c in todo), what=f"copying s3://{bucket}/{root} to {dest}")
    _make_directories(dest, [rel for rel, _ in todo])

    def fetch_range(copy: _ObjectCopy, first: int, last: int, bar: tqdm) -> None:
        whole = len(copy.ranges) == 1
        for attempt in range(1, GET_ATTEMPTS + 1):
            try:
                received, digest = write_range(copy, first, last, whole)
                break
            except (urllib3.exceptions.HTTPError, ResponseStreamingError, IncompleteReadError,
                    ConnectionError, TimeoutError) as err:
                if attempt == GET_ATTEMPTS:   # a connection lost mid-body; earlier ones are retried
                    raise StagingError(f"copying s3://{bucket}/{copy.key} failed {attempt} times: {err}; "
                                       f"rerun to copy what is missing") from None
        with bar_lock:
            bar.update(received)
        if received != last - first + 1:
            raise StagingError(f"s3://{bucket}/{copy.key} changed while being copied (got {received} bytes of "
                               f"bytes {first}-{last}): rerun to copy it again")
        if whole:
            finish(copy, digest.hexdigest())
        elif copy.part_done():
            finish(copy, file_digest(copy.part))   # re-read while it is still in the page cache

    def write_range(copy: _ObjectCopy, first: int, last: int, whole: bool):
        if whole and getter:
            resp = getter.get(copy.key)
            copy.expected_sha256 = resp.headers.get(f"x-amz-meta-{SHA256_KEY}")
            chunks = resp.stream(CHUNK, decode_content=False)   # the stored bytes, as botocore gives them
        else:
            resp = client.get_object(Bucket=bucket, Key=copy.key, **({} if whole else {"Range": f"bytes={first}-{last}"}))
            copy.expected_sha256 = resp.get("Metadata", {}).get(SHA256_KEY)
            chunks = resp["Body"].iter_chunks(CHUNK)
        digest = hashlib.sha256() if whole else None
        received = 0
        # A small object is written and hashed in one pass; a large one's parts land at their offsets.
        with open(copy.part, "wb" if whole else "r+b") as out:
            out.seek(first)
            for chunk in chunks:
                out.write(chunk)
                received += len(chunk)
                if digest:
                    digest.update(chunk)
        if whole and getter:
            resp.release_conn()
        return received, digest
    def finish(copy: _ObjectCopy, actual: str) -> None:
        if copy.expected_sha256 and actual != copy.expected_sha256:
            copy.part.unlink(missing_ok=True)
            raise StagingError(f"{copy.target} does not match the sha256 recorded for s3://{bucket}/{copy.key}; "
                               f"deleted it, rerun to fetch it again")
        os.replace(copy.part, copy.target)

    bar_lock = threading.Lock()
    getter = s3get.PresignedGetter(client, bucket, max_connections=concurrency) if s3get.usable(client) else None
    for _, copy in todo:   # large objects: the file exists at full size before parts are written into it
        if len(copy.ranges) > 1:
            with open(copy.part, "wb") as f:
                f.truncate(copy.size)
    with tqdm(total=sum(c.size for _, c in todo), unit="B", unit_scale=True, desc=f"copy to {dest}",
              disable=not progress) as bar, ThreadPoolExecutor(max_workers=concurrency) as pool:
        futures = [pool.submit(fetch_range, copy, first, last, bar) for _, copy in todo for first, last in copy.ranges]
        try:
            for future in as_completed(futures):
                future.result()
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            for _, copy in todo:   # nothing half-written is left behind under any name
                copy.part.unlink(missing_ok=True)
            raise
        finally:
            if getter:
                getter.close()
    report.transferred = [copy.key for _, copy in todo]
    report.bytes_transferred = sum(copy.size for _, copy in todo)
    return report


def default_concurrency() -> int:
    """Requests in flight. Small-object GETs and EFS file creations are bound by latency (S3: tens
    of ms to the first byte; EFS: ms per create), not by CPU, so even a 2-vCPU notebook wants
    dozens of them (``aws s3 sync`` keeps 10); more cores, up to 64."""
    return max(32, min(64, 4 * (os.cpu_count() or 2)))
