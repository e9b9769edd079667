"""The learned static table's rows: read as written (int8, a scale a row), and refused with a
clear error where the file is absent, for another MiniLM, or not a table that fits."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

np = pytest.importorskip("numpy")

from shared.errors import ConfigError  # noqa: E402
from shared.routing import learned_table  # noqa: E402


def base(rows: int = 40, dim: int = 8) -> object:
    return np.random.default_rng(0).normal(size=(rows, dim)).astype(np.float32)


def test_only_the_changed_rows_are_written_and_read_back_close(tmp_path: Path) -> None:
    original = base()
    learned = original.copy()
    learned[[3, 17, 39]] += np.random.default_rng(1).normal(size=(3, 8)).astype(np.float32)
    path = tmp_path / "t.npz"
    assert learned_table.save(learned, original, "1.0", path) == 3
    got = learned_table.load(original, "1.0", path)
    assert np.abs(got - learned).max() <= np.abs(learned).max() / 127  # half a step and less
    untouched = [i for i in range(40) if i not in (3, 17, 39)]
    assert np.array_equal(got[untouched], original[untouched])  # the installed rows, exactly
    assert np.array_equal(original, base())  # the base itself is not written into


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.lists(st.floats(-50, 50, width=32), min_size=4, max_size=4), min_size=1, max_size=6)
)
def test_any_rows_come_back_within_half_a_quantisation_step(rows: list[list[float]]) -> None:
    import tempfile

    original = np.zeros((len(rows), 4), dtype=np.float32)
    learned = np.asarray(rows, dtype=np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.npz"
        learned_table.save(learned, original, "v", path, tolerance=0.0)
        got = learned_table.load(original, "v", path)
    step = np.abs(learned).max(axis=1, keepdims=True) / 127
    assert (np.abs(got - learned) <= step / 2 + 1e-6).all()


def test_a_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="learned static table is missing"):
        learned_table.load(base(), "1.0", tmp_path / "absent.npz")


def test_a_table_of_another_minilm_is_refused(tmp_path: Path) -> None:
    original = base()
    learned_table.save(original + 1, original, "1.0", tmp_path / "t.npz")
    with pytest.raises(ConfigError, match=r"learned from all-MiniLM-L6-v2 '1.0'.*'2.0'"):
        learned_table.load(original, "2.0", tmp_path / "t.npz")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"ids": np.array([1], np.int32)}, "no rows, scales, teacher_version"),
        (
            {
                "ids": np.array([40], np.int32),  # past the vocabulary
                "rows": np.zeros((1, 8), np.int8),
                "scales": np.ones(1, np.float32),
                "teacher_version": np.array("1.0"),
            },
            "do not fit",
        ),
        (
            {
                "ids": np.array([1], np.int32),
                "rows": np.zeros((1, 7), np.int8),  # another width
                "scales": np.ones(1, np.float32),
                "teacher_version": np.array("1.0"),
            },
            "do not fit",
        ),
        (
            {
                "ids": np.array([1], np.int32),
                "rows": np.zeros((1, 8), np.float32),  # not int8
                "scales": np.ones(1, np.float32),
                "teacher_version": np.array("1.0"),
            },
            "do not fit",
        ),
    ],
)
def test_a_file_that_is_not_a_fitting_table_is_refused(
    tmp_path: Path, fields: dict[str, object], message: str
) -> None:
    path = tmp_path / "t.npz"
    np.savez(path, **fields)
    with pytest.raises(ConfigError, match=message):
        learned_table.load(base(), "1.0", path)


def good_fields() -> dict[str, object]:
    return {
        "ids": np.array([1], np.int32),
        "rows": np.zeros((1, 8), np.int8),
        "scales": np.ones(1, np.float32),
        "teacher_version": np.array("1.0"),
    }


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"ids": np.array([1.0])}, "do not fit"),  # float ids would index as floats
        ({"ids": np.array([True])}, "do not fit"),  # a mask, not ids
        ({"scales": np.array(["1"])}, "do not fit"),
        ({"scales": np.array([np.nan], np.float32)}, "not all finite"),
        ({"scales": np.array([np.inf], np.float32)}, "not all finite"),
        ({"teacher_version": np.array([1, 0])}, "teacher_version is not a name"),
    ],
)
def test_fields_of_the_wrong_kind_are_refused(
    tmp_path: Path, change: dict[str, object], message: str
) -> None:
    path = tmp_path / "t.npz"
    np.savez(path, **{**good_fields(), **change})
    with pytest.raises(ConfigError, match=message):
        learned_table.load(base(), "1.0", path)


def test_a_member_that_is_not_an_array_is_refused(tmp_path: Path) -> None:
    import zipfile

    path = tmp_path / "t.npz"
    np.savez(path, **good_fields())
    with zipfile.ZipFile(path, "a") as archive:  # numpy reads a non-.npy member as bytes
        archive.writestr("teacher_version", b"garbage")
    with pytest.raises(ConfigError, match="not an array"):
        learned_table.load(base(), "1.0", path)


def bad_files(tmp_path: Path) -> list[Path]:
    good = tmp_path / "good.npz"
    np.savez(good, **good_fields())
    data = good.read_bytes()
    files = {
        "text.npz": b"not a numpy archive",
        "empty.npz": b"",
        "truncated.npz": data[: len(data) // 2],
        "corrupt.npz": data[:40] + bytes(b ^ 0xFF for b in data[40:80]) + data[80:],
    }
    for name, content in files.items():
        (tmp_path / name).write_bytes(content)
    np.save(tmp_path / "array.npy", np.zeros(3))
    return [tmp_path / name for name in files] + [tmp_path / "array.npy"]


def test_bytes_that_are_not_an_archive_are_refused(tmp_path: Path) -> None:
    """A truncated download, a corrupt archive, an empty file or a bare array: each a
    `ConfigError` that names the file, never numpy's or zipfile's own exception."""
    for path in bad_files(tmp_path):
        with pytest.raises(ConfigError, match="not a learned static table"):
            learned_table.load(base(), "1.0", path)


def test_save_writes_the_name_it_is_given(tmp_path: Path) -> None:
    original = base()
    learned_table.save(original + 1, original, "1.0", tmp_path / "rows")  # no .npz suffix
    assert [p.name for p in tmp_path.iterdir()] == ["rows"]
    assert learned_table.load(original, "1.0", tmp_path / "rows").shape == original.shape
