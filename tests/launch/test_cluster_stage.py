"""The copy of the dataset to a node's NVMe (launch/cluster/stage.py's STAGE_SCRIPT), run for real
with bash and the coreutils/findutils an Ubuntu 22.04 image has: an interrupted copy completes on a
rerun, a complete one is skipped. Where a run reads a named dataset, the check of its splits before
a job is queued, and splits given by absolute paths read from the node's copy."""
import os
import subprocess
from pathlib import Path

from launch.cluster.stage import DataPlan, choose_data, dataset_problem, stage_argv, staged_overrides

IMAGES = 30


def _source(root: Path) -> Path:
    src = root / "coco"
    (src / "train2017").mkdir(parents=True)
    (src / "annotations").mkdir()
    (src / "annotations" / "instances_train2017.json").write_text('{"images": []}')
    for i in range(IMAGES):
        (src / "train2017" / f"{i:012d}.jpg").write_bytes(bytes([i]) * (1000 + 37 * i))
    # sources with an old time, as on EFS: a copy made now differs from it unless cp -p set it
    for path in src.rglob("*"):
        os.utime(path, (1_600_000_000, 1_600_000_000))
    return src


def _stage(src: Path, dest: Path) -> subprocess.CompletedProcess:
    return subprocess.run(stage_argv(DataPlan(train_dir=str(dest), stage_from=str(src)), jobs=4),
                          capture_output=True, text=True, timeout=60)


def _tree(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every file's content and modification time (whole seconds) under ``root``, the marker aside."""
    return {p.relative_to(root).as_posix(): (p.read_bytes(), int(p.stat().st_mtime))
            for p in root.rglob("*") if p.is_file() and p.name != ".maskrcnn-staged"}


def test_an_interrupted_copy_completes_on_a_rerun_and_a_complete_one_is_skipped(tmp_path):
    src = _source(tmp_path)
    dest = tmp_path / "nvme" / "coco"
    partial = Path(f"{dest}.partial")
    # The state an interrupted copy leaves: most files copied (cp -p: the source's time), the one
    # being written truncated and carrying the time it was written at (newer than its source),
    # the rest not copied yet, and a copy of a file the source has lost since.
    partial.parent.mkdir(parents=True)
    subprocess.run(["cp", "-r", "-p", str(src), str(partial)], check=True)
    cut = partial / "train2017" / "000000000017.jpg"
    cut.write_bytes(cut.read_bytes()[:100])                      # truncated, mtime = now
    for i in (25, 26, 27):
        (partial / "train2017" / f"{i:012d}.jpg").unlink()      # not reached yet
    (partial / "train2017" / "gone.jpg").write_bytes(b"deleted at the source since")
    untouched = partial / "train2017" / "000000000003.jpg"
    inode = untouched.stat().st_ino

    rerun = _stage(src, dest)
    assert rerun.returncode == 0, rerun.stderr
    assert rerun.stdout.strip() == "staged"
    assert _tree(dest) == _tree(src)                   # every byte and every time, the cut file too
    assert not partial.exists() and (dest / ".maskrcnn-staged").is_file()
    # files whose copy was already right were not copied again
    assert (dest / "train2017" / "000000000003.jpg").stat().st_ino == inode

    again = _stage(src, dest)
    assert again.returncode == 0 and again.stdout.strip() == "already staged", again.stdout + again.stderr


def test_an_outdated_copy_is_brought_up_to_date_in_place(tmp_path):
    src = _source(tmp_path)
    dest = tmp_path / "nvme" / "coco"
    assert _stage(src, dest).stdout.strip() == "staged"
    kept = (dest / "train2017" / "000000000001.jpg").stat().st_ino
    (src / "train2017" / "000000000005.jpg").write_bytes(b"re-encoded")   # changed: size and time
    (src / "train2017" / "000000000006.jpg").unlink()
    (src / "train2017" / "000000000099.jpg").write_bytes(b"new")

    result = _stage(src, dest)
    assert result.returncode == 0 and result.stdout.strip() == "staged", result.stderr
    assert _tree(dest) == _tree(src)
    assert (dest / "train2017" / "000000000001.jpg").stat().st_ino == kept


def test_a_file_name_the_listing_cannot_hold_is_refused_with_its_name(tmp_path):
    src = _source(tmp_path)
    (src / "train2017" / "tab\there.jpg").write_bytes(b"x")
    result = _stage(src, tmp_path / "nvme" / "coco")
    assert result.returncode == 1
    assert "a file name with a tab or a newline (./train2017/tab\there.jpg)" in result.stderr
    assert not (tmp_path / "nvme" / "coco").exists()


# --- where a run reads its dataset: a named dataset, the check before queueing, the node's copy ---

def _custom_dataset(root: Path) -> Path:
    """A real COCO-format dataset outside the COCO layout: labels/train.json, photos/train/."""
    from training.data import synthetic
    synthetic.generate(root / "gen", synthetic.SyntheticSpec(train=3, val=1, size=64, max_object_size=32, seed=2))
    (root / "mine" / "labels").mkdir(parents=True)
    os.replace(root / "gen" / "annotations" / "instances_train2017.json", root / "mine" / "labels" / "train.json")
    os.replace(root / "gen" / "train2017", root / "mine" / "photos")
    return root / "mine"


def test_a_named_dataset_is_read_from_fsx_when_imported_there_else_from_efs(tmp_path):
    efs, fsx, nvme = tmp_path / "efs", tmp_path / "fsx", tmp_path / "nvme"
    env = {"EFS_MOUNT": str(efs), "FSX_MOUNT": str(fsx), "LOCAL_NVME": str(nvme)}
    (fsx / "coco" / "annotations").mkdir(parents=True)
    plan = choose_data(env, data_dir=None, stage_to_nvme=True, dataset="parts")
    # not on FSx: EFS's folder of that name, copied to the node's NVMe
    assert plan == DataPlan(train_dir=str(nvme / "maskrcnn-data" / str(efs / "data/parts").lstrip("/")),
                            stage_from=str(efs / "data/parts"))
    (fsx / "parts").mkdir()
    assert choose_data(env, data_dir=None, stage_to_nvme=True, dataset="parts").stage_from is not None  # empty
    (fsx / "parts" / "labels.json").write_text("{}")
    assert choose_data(env, data_dir=None, stage_to_nvme=True, dataset="parts") == DataPlan(str(fsx / "parts"))
    assert choose_data(env, data_dir=None, stage_to_nvme=True) == DataPlan(str(fsx / "coco"))


def test_the_check_before_queueing_names_a_split_that_is_not_there(tmp_path):
    mine = _custom_dataset(tmp_path)
    train, val = "DATA.TRAIN=('labels/train.json:photos',)", "DATA.VAL=()"
    assert dataset_problem(str(mine), [train, val]) is None
    problem = dataset_problem(str(mine), [train])   # DATA.VAL left at COCO's coco_val2017
    assert problem.startswith("no annotation file for split 'coco_val2017': tried ") and "stage the dataset" in problem
    assert "image folder" in dataset_problem(str(mine), ["DATA.TRAIN=('labels/train.json:pictures',)", val])
    assert "not a .json file" in dataset_problem(str(mine), ["DATA.TRAIN=('labels:photos',)", val])
    assert "unknown config key" in dataset_problem(str(mine), ["DATA.TRAINS=('x',)"])
    # a user's DATA.BASEDIR is where training reads, so it is where the splits are looked for
    assert dataset_problem(str(tmp_path), [f"DATA.BASEDIR={str(mine)!r}", train, val]) is None


def test_splits_given_by_absolute_paths_are_read_from_the_nodes_copy(tmp_path):
    from training.data import coco
    mine = _custom_dataset(tmp_path)
    dest = tmp_path / "nvme" / "mine"
    plan = DataPlan(train_dir=str(dest), stage_from=str(mine))
    assert _stage(mine, dest).returncode == 0
    user = [f"DATA.TRAIN=('{mine}/labels/train.json:{mine}/photos',)", "DATA.VAL=('labels/train.json:photos',)",
            "DATA.NUM_WORKERS=0"]
    overrides = staged_overrides(user, plan)
    assert overrides == [*user, f"DATA.TRAIN=('{dest}/labels/train.json:{dest}/photos',)"]
    assert staged_overrides(user, DataPlan(train_dir=str(mine))) == user          # nothing copied: as given
    assert staged_overrides(user[1:], plan) == user[1:]                           # relative: moves with BASEDIR
    from training.config import new_config
    cfg = new_config()
    cfg.update_args([f"DATA.BASEDIR={str(dest)!r}", *overrides])
    (split,) = coco.load_splits(cfg.DATA.BASEDIR, cfg.DATA.TRAIN)
    assert split.image_dir == dest / "photos" and len(split.roidb) == 3
    assert all(r["file_name"].startswith(str(dest)) for r in split.roidb)
