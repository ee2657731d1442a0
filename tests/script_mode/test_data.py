"""The generated digits: deterministic by seed, MNIST-shaped, saved and loaded intact."""
import numpy as np
import pytest

from script_mode import data


@pytest.fixture(scope="module")
def small():
    return data.generate(n_train=600, n_test=200, seed=7)


def test_same_seed_same_arrays(small):
    again = data.generate(n_train=600, n_test=200, seed=7)
    for name in ("x_train", "y_train", "x_test", "y_test"):
        np.testing.assert_array_equal(getattr(small, name), getattr(again, name))


def test_other_seed_other_arrays(small):
    other = data.generate(n_train=600, n_test=200, seed=8)
    assert not np.array_equal(small.x_train, other.x_train)
    assert not np.array_equal(small.y_test, other.y_test)


def test_test_set_does_not_depend_on_training_size(small):
    bigger = data.generate(n_train=900, n_test=200, seed=7)
    np.testing.assert_array_equal(small.x_test, bigger.x_test)
    np.testing.assert_array_equal(small.y_test, bigger.y_test)


def test_mnist_shape_and_content(small):
    assert small.x_train.shape == (600, 28, 28) and small.x_train.dtype == np.uint8
    assert small.x_test.shape == (200, 28, 28)
    assert set(np.unique(small.y_train)) == set(range(10))
    # Bright strokes on a dark background, and every image has a glyph in it.
    assert small.x_train.mean() < 80
    assert (small.x_train.reshape(600, -1).max(axis=1) > 200).all()
    # Same digit, different renderings: fonts, affine and noise vary.
    sevens = small.x_train[small.y_train == 7]
    assert len({s.tobytes() for s in sevens}) == len(sevens)


def test_save_load_roundtrip_leaves_no_temp_file(small, tmp_path):
    path = data.save(small, tmp_path / "sub" / data.DATA_FILE)
    assert sorted(p.name for p in path.parent.iterdir()) == [data.DATA_FILE]
    for loaded in (data.load(path), data.load(path.parent)):  # a file, or a channel folder
        np.testing.assert_array_equal(loaded.x_train, small.x_train)
        np.testing.assert_array_equal(loaded.y_test, small.y_test)


def test_ensure_keeps_an_existing_file(small, tmp_path):
    path = data.save(small, tmp_path / data.DATA_FILE)
    before = path.stat().st_mtime_ns
    data.ensure(path)
    assert path.stat().st_mtime_ns == before


def test_missing_file_and_bad_sizes_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="python -m script_mode.data --out"):
        data.load(tmp_path / "nothing.npz")
    with pytest.raises(ValueError, match="n_train=0"):
        data.generate(n_train=0, n_test=10)
