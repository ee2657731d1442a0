"""Download COCO 2017 and the pretrained weights, verify checksums, extract.

Layout under the stage directory (the layout DATA.BASEDIR expects, see training/config.py)::

    <stage>/downloads/<archive files>          kept, so a rerun skips verified downloads
    <stage>/coco/annotations/instances_{train,val}2017.json
    <stage>/coco/{train2017,val2017}/*.jpg
    <stage>/coco/weights/ImageNet-R50-AlignPadding.npz          BACKBONE.WEIGHTS
    <stage>/coco/weights/COCO-R50FPN-MaskRCNN-Standard.npz      TRAIN.LOAD_MODEL (fine-tuning), or a model
                                                                 to predict, export and serve as it is

The weights alone (:func:`weights_only`, ``maskrcnn data download --weights-only``) need no COCO
images: a few hundred MB instead of the 19 GB of archives.

Every URL and checksum can be replaced (``--url NAME=URL``, ``--checksum NAME=ALGO:HEX``, or a JSON
manifest), e.g. to use a mirror inside the VPC.
"""
from __future__ import annotations

import dataclasses
import hashlib
import http.client
import json
import re
import shutil
import tarfile
import time
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

from tqdm import tqdm

from launch.staging.diskspace import StagingError, ensure_free_space

CHUNK = 1 << 20
DOWNLOAD_ATTEMPTS = 5   # per run; a dropped connection resumes with a range request
RETRY_DELAY_S = 2.0     # x attempt number, between attempts


@dataclasses.dataclass(frozen=True)
class Artifact:
    name: str               # file name under downloads/
    url: str
    checksum: str | None    # "md5:<hex>" or "sha256:<hex>"; None = not pinned
    extract_to: str | None  # directory under the stage dir to extract into; None = copy the file there
    target: str = "coco"


# tensorpack's COCO-trained Mask R-CNN R50-FPN, to fine-tune from (docs/training.md). No checksum
# or size is published for it: not in tensorpack's repository or model zoo, nor in AWS's samples
# (a plain wget). From its variables (tests/training/data/COCO-R50FPN-MaskRCNN-Standard.txt) it holds
# 44,453,556 float32 values, 178 MB before compression. This is the one place to pin its sha256
# once taken from a copy you trust ("sha256:<hex>"); until then it is unpinned like the ImageNet file.
COCO_MODEL_CHECKSUM: str | None = None
WEIGHTS_TARGET = "coco/weights"   # where the weights files go under the stage directory

# Checksums as published alongside the COCO 2017 archives. The weights files have no published
# checksum: pass --checksum ImageNet-R50-AlignPadding.npz=sha256:<hex> (likewise for the COCO model)
# from a copy you trust, or --allow-unpinned to accept them and record their sha256 in
# <stage>/checksums.json, against which every later run checks them.
COCO_2017 = (
    Artifact("train2017.zip", "http://images.cocodataset.org/zips/train2017.zip",
             "md5:cced6f7f71b7629ddf16f17bbcfab6b2", "coco"),
    Artifact("val2017.zip", "http://images.cocodataset.org/zips/val2017.zip",
             "md5:442b8da7639aecaf257c1dceb8ba8c80", "coco"),
    Artifact("annotations_trainval2017.zip",
             "http://images.cocodataset.org/annotations/annotations_trainval2017.zip",
             "md5:f4bbac642086de4f52a3fdda2de5fa2c", "coco"),
    Artifact("ImageNet-R50-AlignPadding.npz",
             "http://models.tensorpack.com/FasterRCNN/ImageNet-R50-AlignPadding.npz", None, None,
             target=WEIGHTS_TARGET),
    Artifact("COCO-R50FPN-MaskRCNN-Standard.npz",
             "http://models.tensorpack.com/FasterRCNN/COCO-R50FPN-MaskRCNN-Standard.npz", COCO_MODEL_CHECKSUM, None,
             target=WEIGHTS_TARGET),
)


def weights_only(artifacts) -> tuple[Artifact, ...]:
    """The artifacts that are weights files (installed under :data:`WEIGHTS_TARGET`)."""
    found = tuple(a for a in artifacts if a.target == WEIGHTS_TARGET and a.extract_to is None)
    if not found:
        raise StagingError(f"no weights file among the artifacts ({', '.join(a.name for a in artifacts)}): "
                           f"a weights file has \"target\": \"{WEIGHTS_TARGET}\" and no \"extract_to\"")
    return found


def parse_checksum(text: str) -> tuple[str, str]:
    algo, sep, hexdigest = text.partition(":")
    if not sep or algo not in ("md5", "sha256") or not hexdigest:
        raise StagingError(f"checksum {text!r} must look like md5:<hex> or sha256:<hex>")
    return algo, hexdigest.lower()


def file_digest(path: Path, algo: str = "sha256") -> str:
    h = hashlib.new(algo)
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def load_manifest(path: str | Path) -> tuple[Artifact, ...]:
    """A JSON list of {"name", "url", "checksum", "extract_to", "target"} objects."""
    try:
        items = json.loads(Path(path).read_text())
        return tuple(Artifact(**item) for item in items)
    except (OSError, ValueError, TypeError) as err:
        raise StagingError(f"cannot read manifest {path}: {err}") from None


def with_overrides(artifacts, urls: dict[str, str], checksums: dict[str, str]) -> tuple[Artifact, ...]:
    names = {a.name for a in artifacts}
    unknown = (set(urls) | set(checksums)) - names
    if unknown:
        raise StagingError(f"unknown artifact(s) {sorted(unknown)}; known: {sorted(names)}")
    for c in checksums.values():
        parse_checksum(c)
    return tuple(dataclasses.replace(a, url=urls.get(a.name, a.url), checksum=checksums.get(a.name, a.checksum))
                 for a in artifacts)


def file_digests(path: Path, algos: tuple[str, ...]) -> dict[str, str]:
    """Several digests of one file in a single read (COCO's train2017.zip is 18 GiB)."""
    hashes = {algo: hashlib.new(algo) for algo in algos}
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            for h in hashes.values():
                h.update(chunk)
    return {algo: h.hexdigest() for algo, h in hashes.items()}


class _Interrupted(Exception):
    """The connection ended before the whole body arrived; what arrived is kept in the .part file."""


def _validator(headers) -> str | None:
    """What ``If-Range`` sends back so a resumed range comes from the same version of the file."""
    etag = headers.get("ETag")
    if etag and not etag.startswith("W/"):   # weak ETags are not allowed in If-Range
        return etag
    return headers.get("Last-Modified")


def _download_once(artifact: Artifact, part: Path, progress: bool) -> None:
    """One request: resume ``part`` from its size with a range request, or start it afresh when
    there is nothing to resume or the server sends the whole file (no range support, file changed)."""
    meta_path = part.with_name(part.name + ".json")
    meta = json.loads(meta_path.read_text()) if part.exists() and meta_path.exists() else {}
    have = part.stat().st_size if meta.get("url") == artifact.url else 0
    headers = {}
    if have:
        headers["Range"] = f"bytes={have}-"
        if meta.get("validator"):
            headers["If-Range"] = meta["validator"]
    try:
        resp = urllib.request.urlopen(urllib.request.Request(artifact.url, headers=headers), timeout=60)
    except urllib.error.HTTPError as err:
        if err.code == 416 and have:   # the kept part is not a prefix of this file: start again
            part.unlink()
            raise _Interrupted("the server refused to resume (416); starting again") from None
        raise
    with resp:
        total = int(resp.headers.get("Content-Length") or 0)
        content_range = re.fullmatch(r"bytes (\d+)-(\d+)/(\d+|\*)", resp.headers.get("Content-Range") or "")
        if resp.status == 206:
            if not (content_range and int(content_range[1]) == have):   # not the range asked for
                part.unlink(missing_ok=True)
                raise _Interrupted(f"asked for bytes {have}- and got {resp.headers.get('Content-Range')!r}; "
                                   f"starting again")
            mode, start = "ab", have
            total = have + total
        else:
            mode, start = "wb", 0
            meta_path.write_text(json.dumps({"url": artifact.url, "validator": _validator(resp.headers)}))
        if total:
            ensure_free_space(part.parent, total - start, what=f"downloading {artifact.name}")
        with open(part, mode) as out, tqdm(total=total or None, initial=start, unit="B", unit_scale=True,
                                           desc=artifact.name, disable=not progress) as bar:
            while chunk := resp.read(CHUNK):
                out.write(chunk)
                bar.update(len(chunk))
    received = part.stat().st_size
    # http.client returns an empty read when the peer closes early: a short body must not pass for
    # the whole file (an unpinned one would be accepted as it is).
    if total and received != total:
        raise _Interrupted(f"the connection closed after {received} of {total} bytes")


def _retryable(err: Exception) -> bool:
    if isinstance(err, urllib.error.HTTPError):
        return err.code >= 500 or err.code in (408, 429)
    return isinstance(err, (_Interrupted, urllib.error.URLError, OSError, http.client.HTTPException))


def fetch(artifact: Artifact, downloads: Path, *, allow_unpinned: bool = False,
          progress: bool = True) -> tuple[Path, str]:
    """Download ``artifact`` into ``downloads`` unless a verified copy is there; return its path and sha256.

    A dropped connection is retried with a range request from where it stopped (``DOWNLOAD_ATTEMPTS``
    times); after that the partial file is kept as ``<name>.part`` and the next run resumes it."""
    if artifact.checksum is None and not allow_unpinned:
        raise StagingError(f"no checksum pinned for {artifact.name}: pass --checksum {artifact.name}=sha256:<hex> "
                           f"(from a copy you trust), or --allow-unpinned to accept it and record its sha256")
    dest = downloads / artifact.name
    if dest.exists() and artifact.checksum and (sha256 := _verify(dest, artifact)):
        return dest, sha256
    downloads.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    meta_path = part.with_name(part.name + ".json")
    for attempt in range(1, DOWNLOAD_ATTEMPTS + 1):
        try:
            _download_once(artifact, part, progress)
            break
        except (_Interrupted, urllib.error.URLError, OSError, http.client.HTTPException) as err:
            kept = part.stat().st_size if part.exists() else 0
            if not _retryable(err) or attempt == DOWNLOAD_ATTEMPTS:
                hint = (f"{kept} bytes are kept in {part}: rerun to resume" if kept and _retryable(err) else
                        f"check the URL (--url {artifact.name}=...) and the network")
                raise StagingError(f"download of {artifact.name} from {artifact.url} failed "
                                   f"(attempt {attempt} of {DOWNLOAD_ATTEMPTS}): {err}; {hint}") from None
            time.sleep(RETRY_DELAY_S * attempt)
    sha256 = _verify(part, artifact) if artifact.checksum else file_digest(part)
    if not sha256:
        part.unlink()
        meta_path.unlink(missing_ok=True)
        raise StagingError(f"{artifact.name} from {artifact.url} does not match its checksum {artifact.checksum}: "
                           f"the download is corrupt or the file changed; the bad copy was deleted")
    part.replace(dest)
    meta_path.unlink(missing_ok=True)
    return dest, sha256


def _verify(path: Path, artifact: Artifact) -> str | None:
    """The file's sha256 if it matches the artifact's pinned checksum, else None (one read for both)."""
    algo, expected = parse_checksum(artifact.checksum)
    digests = file_digests(path, tuple(dict.fromkeys((algo, "sha256"))))
    return digests["sha256"] if digests[algo] == expected else None


def _archive_members(path: Path) -> list[tuple[str, int]]:
    """(name, size) of every regular file in a zip or tar archive."""
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            return [(i.filename, i.file_size) for i in z.infolist() if not i.is_dir()]
    with tarfile.open(path) as t:
        return [(m.name, m.size) for m in t.getmembers() if m.isfile()]


def _is_in_place(path: Path, size: int) -> bool:
    try:
        return path.stat().st_size == size
    except OSError:
        return False


def install(artifact: Artifact, file: Path, stage: Path) -> None:
    """Extract an archive (or copy a plain file) into its place under ``stage``.

    Only files not already there with their size are written, and only they count against the free
    space: a rerun after a finished extraction writes nothing, one after an interrupted extraction
    completes it."""
    if artifact.extract_to is None:
        target = stage / artifact.target
        placed = target / artifact.name
        if _is_in_place(placed, file.stat().st_size) and file_digest(placed) == file_digest(file):
            return
        target.mkdir(parents=True, exist_ok=True)
        ensure_free_space(target, file.stat().st_size, what=f"copying {artifact.name}")
        shutil.copy2(file, placed)
        return
    target = stage / artifact.extract_to
    missing = [(name, size) for name, size in _archive_members(file) if not _is_in_place(target / name, size)]
    if not missing:
        return
    ensure_free_space(target, sum(size for _, size in missing), what=f"extracting {artifact.name}")
    target.mkdir(parents=True, exist_ok=True)
    names = {name for name, _ in missing}
    if zipfile.is_zipfile(file):
        with zipfile.ZipFile(file) as z:   # zipfile drops absolute paths and '..' in member names
            z.extractall(target, members=[i for i in z.infolist() if i.filename in names])
    else:
        with tarfile.open(file) as t:   # the "data" filter refuses links and paths outside target
            t.extractall(target, members=[m for m in t.getmembers() if m.name in names], filter="data")


def stage_dataset(stage: Path, artifacts=COCO_2017, *, allow_unpinned: bool = False, progress: bool = True) -> Path:
    """Download, verify and extract every artifact; returns ``stage``. Records sha256 of each download."""
    stage = Path(stage)
    downloads = stage / "downloads"
    record_path = stage / "checksums.json"
    record = json.loads(record_path.read_text()) if record_path.exists() else {}
    for artifact in artifacts:
        if artifact.checksum is None and artifact.name in record:
            artifact = dataclasses.replace(artifact, checksum="sha256:" + record[artifact.name])
        file, record[artifact.name] = fetch(artifact, downloads, allow_unpinned=allow_unpinned, progress=progress)
        record_path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")   # kept if a later one fails
        install(artifact, file, stage)
    return stage
