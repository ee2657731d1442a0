"""The copy of the dataset to a node's NVMe (launch/cluster/stage.py's STAGE_SCRIPT), run for real
with bash and the coreutils/findutils an Ubuntu 22.04 image has: an interrupted copy completes on a
rerun, a complete one is skipped."""
import os
import subprocess
from pathlib import Path

from launch.cluster.stage import DataPlan, stage_argv

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
