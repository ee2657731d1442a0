"""Which files a split entry (an item of DATA.TRAIN / DATA.VAL, or predict's ``--split``) names.

Two forms:

1. a split name of the COCO layout under DATA.BASEDIR, tried in this order (the first whose
   annotation file exists wins):

   - the name as given: ``train2017`` -> ``annotations/instances_train2017.json``, images in ``train2017/``;
   - without a ``coco_`` prefix: ``coco_train2017`` -> ``annotations/instances_train2017.json`` and
     ``train2017/`` (the spelling the SageMaker EFS example's hyperparameters use);

2. ``<annotation file>:<image folder>``, e.g. ``labels/train.json:photos/train``: any COCO-format
   instances file and the folder its ``file_name`` entries are relative to. Relative paths are under
   DATA.BASEDIR, absolute ones are used as given. The first ``:`` separates the two, so neither path
   may contain one.

No NumPy, pycocotools or TensorFlow here: config validation and the launchers use it too.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

SEPARATOR = ":"
COCO_PREFIX = "coco_"
EXAMPLE = "labels/train.json:photos/train"


class DatasetError(ValueError):
    """The dataset on disk cannot be used; the message names the file and the expected layout."""


@dataclass(frozen=True)
class SplitFiles:
    """The two paths of an ``<annotation file>:<image folder>`` entry, as written."""

    annotations: str
    images: str


def layout_help(basedir: str | os.PathLike) -> str:
    return (f"expected layout: {basedir}/annotations/instances_<split>.json and images in "
            f"{basedir}/<split>/ (a split named coco_<split> also resolves to <split>), or an entry "
            f"'<annotation file>:<image folder>' such as '{EXAMPLE}'")


def parse(entry: str) -> SplitFiles | None:
    """The paths of an ``<annotation file>:<image folder>`` entry; None for a split name.

    Raises :class:`DatasetError` for an entry of neither form (empty, one part missing, an
    annotation file that is not a .json, a .json file without its image folder)."""
    if not isinstance(entry, str) or not entry.strip():
        raise DatasetError(f"split entry {entry!r} is empty: give a split name such as 'train2017' or "
                           f"'<annotation file>:<image folder>' such as '{EXAMPLE}'")
    if SEPARATOR not in entry:
        if entry.strip().lower().endswith(".json"):
            raise DatasetError(f"split entry {entry!r} names an annotation file without its image folder: "
                               f"write '{entry.strip()}:<image folder>'")
        return None
    annotations, _, images = (part.strip() for part in entry.partition(SEPARATOR))
    if not annotations or not images:
        raise DatasetError(f"split entry {entry!r} needs both parts, '<annotation file>:<image folder>' "
                           f"(e.g. '{EXAMPLE}')")
    if not annotations.lower().endswith(".json"):
        raise DatasetError(f"split entry {entry!r}: the annotation file {annotations!r} is not a .json file; "
                           f"the form is '<annotation file>.json:<image folder>' (e.g. '{EXAMPLE}')")
    return SplitFiles(annotations, images)


def problem(entry: str) -> str | None:
    """What is wrong with the form of ``entry`` (no file is looked at), or None."""
    try:
        parse(entry)
    except DatasetError as err:
        return str(err)
    return None


def _under(basedir: Path, path: str) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else basedir / p


def resolve(basedir: str | os.PathLike, entry: str) -> tuple[Path, Path]:
    """(annotation file, image folder) of ``entry`` under ``basedir``; :class:`DatasetError` naming
    the path and the fix when the annotation file does not exist (for a split name: every path
    tried) or, for an ``<annotation file>:<image folder>`` entry, the image folder does not."""
    basedir = Path(basedir).expanduser().resolve()
    files = parse(entry)
    if files is not None:
        annotations = _under(basedir, files.annotations).resolve()
        images = _under(basedir, files.images).resolve()
        relative = f" (relative paths are under DATA.BASEDIR {basedir})"
        if not annotations.exists():
            raise DatasetError(f"annotation file {annotations} of split {entry!r} does not exist{relative}")
        if not annotations.is_file():
            raise DatasetError(f"annotation file {annotations} of split {entry!r} is not a file{relative}")
        if not images.is_dir():
            what = "is not a folder" if images.exists() else "does not exist"
            raise DatasetError(f"image folder {images} of split {entry!r} {what}{relative}")
        return annotations, images
    names = [entry]
    if entry.startswith(COCO_PREFIX) and len(entry) > len(COCO_PREFIX):
        names.append(entry[len(COCO_PREFIX):])
    tried = []
    for name in names:
        annotations = basedir / "annotations" / f"instances_{name}.json"
        if annotations.is_file():
            return annotations, basedir / name
        tried.append(str(annotations))
    if not basedir.is_dir():
        raise DatasetError(f"data directory {basedir} does not exist; {layout_help(basedir)}")
    raise DatasetError(f"no annotation file for split {entry!r}: tried {', '.join(tried)}; "
                       f"{layout_help(basedir)}")
