"""Where a cluster run reads its dataset, and the copy of the dataset to a node's local NVMe.

``choose_data`` picks the directory: --data-dir, else FSx for Lustre's copy of the named dataset
(``/fsx/<name>``), else EFS's (``/efs/data/<name>``), copied to the node's instance-store NVMe when it
has one; the name is ``coco`` unless the run names its own dataset (``maskrcnn data upload
--dataset-dir DIR --name NAME`` put it there). ``STAGE_SCRIPT`` is the copy, run once per node.
``dataset_problem`` checks, before a job is queued, that every split the run trains and evaluates
on is there; ``staged_overrides`` points splits given by absolute paths inside the staged
directory at the node's copy.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from infra.outputs import LUSTRE_COCO_DIR

# A node copies the dataset to its NVMe with this script (run through the health checks' runner, or
# one srun task per node: in the node's container, which has EFS and LOCAL_NVME mounted). Files land
# in DEST.partial, which becomes DEST only when complete; DEST/.maskrcnn-staged then holds the
# digest of the source's listing (paths and sizes), so a later run skips a node whose copy is
# complete and current ("already staged").
# A rerun after an interruption copies what is missing or wrong: every file whose copy differs from
# its source in size or modification time (whole seconds) is copied again. cp -p sets the time after
# the last byte, so a copy cut short keeps the time it was written at and is recopied (cp -u, which
# skips a target newer than its source, kept such a truncated file for good). Copies of files the
# source no longer has are removed, and an outdated complete copy is where the next one starts.
STAGE_SCRIPT = r"""
set -euo pipefail
src=$1 dest=$2 jobs=$3
marker=.maskrcnn-staged
listing() { (cd "$1" && find . -type f ! -name "$marker" -printf '%P %s\n' | LC_ALL=C sort | sha256sum | cut -d' ' -f1); }
# "path<TAB>size<TAB>mtime in whole seconds" of every file, sorted
stamps() { (cd "$1" && find . -type f ! -name "$marker" -printf '%P\t%s\t%T@\n' | sed 's/\.[0-9]*$//' | LC_ALL=C sort); }
want=$(listing "$src")
if [[ -f "$dest/$marker" && "$(cat "$dest/$marker")" == "$want" ]]; then
  echo "already staged"; exit 0
fi
odd=$(cd "$src" && find . \( -name $'*\n*' -o -name $'*\t*' \) -print -quit)
if [[ -n "$odd" ]]; then
  echo "cannot stage $src: a file name with a tab or a newline ($odd); rename it, or train from where it is without the copy" >&2
  exit 1
fi
rm -rf "$dest.old"
if [[ -d "$dest" && ! -d "$dest.partial" ]]; then mv "$dest" "$dest.partial"; fi
mkdir -p "$dest.partial"
rm -f "$dest.partial/$marker"
lists=$(mktemp -d)
trap 'rm -rf "$lists"' EXIT
stamps "$src" > "$lists/src"
stamps "$dest.partial" > "$lists/dest"
# copies that are not exactly a source file's (stale, truncated, or no longer in the source): removed
LC_ALL=C comm -13 "$lists/src" "$lists/dest" | cut -f1 | tr '\n' '\0' \
  | (cd "$dest.partial" && xargs -0 -r rm -f --)
cd "$src"
find . -mindepth 1 -type d -printf '%P\0' | (cd "$dest.partial" && xargs -0 -r mkdir -p)
# source files without an exact copy: copied
LC_ALL=C comm -23 "$lists/src" "$lists/dest" | cut -f1 | tr '\n' '\0' \
  | xargs -0 -r -n 64 -P "$jobs" cp -p --parents -t "$dest.partial"
[[ "$(listing "$dest.partial")" == "$want" ]] || { echo "the copy does not match $src" >&2; exit 1; }
echo "$want" > "$dest.partial/$marker"
if [[ -e "$dest" ]]; then mv "$dest" "$dest.old"; fi
mv "$dest.partial" "$dest"
rm -rf "$dest.old"
echo "staged"
"""
STAGE_JOBS = 16           # parallel copies per node: EFS serves many small files best in parallel
STAGE_TIMEOUT_S = 4 * 3600


@dataclass(frozen=True)
class DataPlan:
    """Where training reads the dataset (``train_dir``, on every node) and, when it is a local
    copy, the EFS directory it is copied from (``stage_from``)."""
    train_dir: str
    stage_from: str | None = None


def choose_data(env: dict[str, str], *, data_dir: str | None, stage_to_nvme: bool,
                dataset: str = LUSTRE_COCO_DIR) -> DataPlan:
    """The data directory: --data-dir, else /fsx/<dataset> when it holds anything (FSx imports
    s3://<bucket>/data/<dataset>/), else EFS's /efs/data/<dataset>, copied to the node's NVMe when it
    has one (LOCAL_NVME) and ``stage_to_nvme``."""
    efs = env.get("EFS_MOUNT", "/efs")
    fsx = env.get("FSX_MOUNT")
    source = data_dir
    if source is None and fsx and Path(fsx, dataset).is_dir() and any(Path(fsx, dataset).iterdir()):
        source = str(Path(fsx, dataset))
    source = source or f"{efs}/data/{dataset}"
    on_lustre = bool(fsx) and Path(source).is_relative_to(fsx)
    nvme = env.get("LOCAL_NVME")
    if on_lustre or not nvme or not stage_to_nvme or Path(source).is_relative_to(nvme):
        return DataPlan(train_dir=source)
    return DataPlan(train_dir=str(Path(nvme, "maskrcnn-data", Path(source).relative_to("/"))),
                    stage_from=source)


def stage_argv(plan: DataPlan, *, jobs: int = STAGE_JOBS) -> list[str]:
    """The command that copies ``plan.stage_from`` to ``plan.train_dir`` on one node."""
    return ["bash", "-c", STAGE_SCRIPT, "stage", plan.stage_from, plan.train_dir, str(jobs)]


SPLIT_KEYS = ("DATA.TRAIN", "DATA.VAL")


def _config(data_dir: str, overrides: list[str]):
    from training.config import new_config   # no TensorFlow: the config tree and its parsing only
    cfg = new_config()
    cfg.update_args([f"DATA.BASEDIR={data_dir!r}", *overrides])   # the user's DATA.BASEDIR wins, as in training
    return cfg


def dataset_problem(data_dir: str, overrides: list[str]) -> str | None:
    """Why the run's splits (DATA.TRAIN and DATA.VAL, after ``overrides``) cannot be read under
    ``data_dir`` (where the nodes read, or the directory they copy it from), or None: the check
    before a job is queued, one line naming the missing file and the fix."""
    from training.config import ConfigError
    from training.data import splits
    try:
        cfg = _config(data_dir, overrides)
        for key in SPLIT_KEYS:
            for entry in cfg.get(key):
                splits.resolve(cfg.DATA.BASEDIR, entry)
    except (ConfigError, splits.DatasetError) as err:
        return (f"{err} (stage the dataset first: maskrcnn data upload/to-efs; or pass --data-dir, "
                f"or DATA.TRAIN / DATA.VAL naming what is there)")
    return None


def staged_overrides(overrides: list[str], plan: DataPlan) -> list[str]:
    """``overrides`` plus, where a split entry has absolute paths in ``plan.stage_from``, the entries
    pointing at the same files in the node's copy (``plan.train_dir``); relative paths move with
    DATA.BASEDIR by themselves."""
    if not plan.stage_from:
        return list(overrides)
    from training.data import splits
    cfg = _config(plan.train_dir, overrides)
    source, copy = Path(plan.stage_from), Path(plan.train_dir)

    def local(path: str) -> str:
        p = Path(path)
        return str(copy / p.relative_to(source)) if p.is_absolute() and p.is_relative_to(source) else path

    out = list(overrides)
    for key in SPLIT_KEYS:
        entries = []
        for entry in cfg.get(key):
            files = splits.parse(entry)
            entries.append(entry if files is None else
                           f"{local(files.annotations)}{splits.SEPARATOR}{local(files.images)}")
        if tuple(entries) != tuple(cfg.get(key)):
            out.append(f"{key}={tuple(entries)!r}")   # after the user's: the last override of a key wins
    return out
