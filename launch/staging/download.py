"""Download COCO 2017 and the pretrained backbone weights, verify checksums, extract.

Layout under the stage directory (the layout DATA.BASEDIR expects, see training/config.py)::

    <stage>/downloads/<archive files>          kept, so a rerun skips verified downloads
    <stage>/coco/annotations/instances_{train,val}2017.json
    <stage>/coco/{train2017,val2017}/*.jpg
    <stage>/coco/weights/ImageNet-R50-AlignPadding.npz

Every URL and checksum can be replaced (``--url NAME=URL``, ``--checksum NAME=ALGO:HEX``, or a JSON
manifest), e.g. to use a mirror inside the VPC.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import tarfile
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

from tqdm import tqdm

from launch.staging.diskspace import StagingError, ensure_free_space

CHUNK = 1 << 20


@dataclasses.dataclass(frozen=True)
class Artifact:
    name: str               # file name under downloads/
    url: str
    checksum: str | None    # "md5:<hex>" or "sha256:<hex>"; None = not pinned
    extract_to: str | None  # directory under the stage dir to extract into; None = copy the file there
    target: str = "coco"


# Checksums as published alongside the COCO 2017 archives. The weights file has no published
# checksum: pass --checksum ImageNet-R50-AlignPadding.npz=sha256:<hex> from a copy you trust, or
# --allow-unpinned to accept it and record its sha256 in <stage>/checksums.json.
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
             target="coco/weights"),
)


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


def _verify(path: Path, artifact: Artifact) -> bool:
    algo, expected = parse_checksum(artifact.checksum)
    return file_digest(path, algo) == expected


def fetch(artifact: Artifact, downloads: Path, *, allow_unpinned: bool = False, progress: bool = True) -> Path:
    """Download ``artifact`` into ``downloads`` unless a verified copy is there; return its path."""
    if artifact.checksum is None and not allow_unpinned:
        raise StagingError(f"no checksum pinned for {artifact.name}: pass --checksum {artifact.name}=sha256:<hex> "
                           f"(from a copy you trust), or --allow-unpinned to accept it and record its sha256")
    dest = downloads / artifact.name
    if dest.exists() and artifact.checksum and _verify(dest, artifact):
        return dest
    downloads.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    try:
        with urllib.request.urlopen(artifact.url, timeout=60) as resp:
            total = int(resp.headers.get("Content-Length") or 0)
            if total:
                ensure_free_space(downloads, total, what=f"downloading {artifact.name}")
            with open(part, "wb") as out, tqdm(total=total or None, unit="B", unit_scale=True,
                                               desc=artifact.name, disable=not progress) as bar:
                while chunk := resp.read(CHUNK):
                    out.write(chunk)
                    bar.update(len(chunk))
    except (urllib.error.URLError, OSError) as err:
        part.unlink(missing_ok=True)
        raise StagingError(f"download of {artifact.name} from {artifact.url} failed: {err}; "
                           f"check the URL (--url {artifact.name}=...) and the network") from None
    if artifact.checksum and not _verify(part, artifact):
        part.unlink()
        raise StagingError(f"{artifact.name} from {artifact.url} does not match its checksum {artifact.checksum}: "
                           f"the download is corrupt or the file changed; the bad copy was deleted")
    part.replace(dest)
    return dest


def _archive_size(path: Path) -> int:
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            return sum(i.file_size for i in z.infolist())
    with tarfile.open(path) as t:
        return sum(m.size for m in t.getmembers())


def install(artifact: Artifact, file: Path, stage: Path) -> None:
    """Extract an archive (or copy a plain file) into its place under ``stage``."""
    if artifact.extract_to is None:
        target = stage / artifact.target
        target.mkdir(parents=True, exist_ok=True)
        ensure_free_space(target, file.stat().st_size, what=f"copying {artifact.name}")
        shutil.copy2(file, target / artifact.name)
        return
    target = stage / artifact.extract_to
    ensure_free_space(target, _archive_size(file), what=f"extracting {artifact.name}")
    target.mkdir(parents=True, exist_ok=True)
    if zipfile.is_zipfile(file):
        with zipfile.ZipFile(file) as z:   # zipfile drops absolute paths and '..' in member names
            z.extractall(target)
    else:
        with tarfile.open(file) as t:
            t.extractall(target, filter="data")  # refuses links and paths outside target


def stage_dataset(stage: Path, artifacts=COCO_2017, *, allow_unpinned: bool = False, progress: bool = True) -> Path:
    """Download, verify and extract every artifact; returns ``stage``. Records sha256 of each download."""
    stage = Path(stage)
    downloads = stage / "downloads"
    record_path = stage / "checksums.json"
    record = json.loads(record_path.read_text()) if record_path.exists() else {}
    for artifact in artifacts:
        if artifact.checksum is None and artifact.name in record:
            artifact = dataclasses.replace(artifact, checksum="sha256:" + record[artifact.name])
        file = fetch(artifact, downloads, allow_unpinned=allow_unpinned, progress=progress)
        record[artifact.name] = file_digest(file, "sha256")
        install(artifact, file, stage)
    record_path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return stage
