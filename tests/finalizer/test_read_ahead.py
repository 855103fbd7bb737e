"""The finalizer's read-ahead of tile results: bounded in bytes, dropped job by job."""

from __future__ import annotations

import io
import tokenize
from contextlib import AsyncExitStack
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.finalizer.assemble import Finalizer
from services.finalizer.cache import ReadAhead, Result
from shared.core.errors import DecodeError
from shared.core.tiles import load_npy, to_npy
from shared.objectstore import DirectoryStore, ObjectStore
from shared.objectstore.s3 import S3Store
from shared.service.logs import Log


def _acc(nbytes: int) -> np.ndarray:
    return np.zeros((1, nbytes // 24, 3))  # float64: 24 bytes a pixel


def _finalizer(store: ObjectStore, budget: int) -> Finalizer:
    """A finalizer over just what deciding to read ahead looks at."""
    settings = SimpleNamespace(finalizer=SimpleNamespace(read_ahead_bytes=budget))
    rt = SimpleNamespace(store=store, settings=settings, log=Log("test.read_ahead"))
    return Finalizer(cast(Any, rt))


def test_results_are_read_ahead_from_a_remote_store_only(tmp_path: Path) -> None:
    local = DirectoryStore(tmp_path)
    remote = S3Store(None, "bucket", AsyncExitStack())  # (no client call is made)
    assert _finalizer(remote, 1 << 20).reads_ahead
    assert not _finalizer(local, 1 << 20).reads_ahead, "page-cache reads: at finalization"
    assert not _finalizer(remote, 0).reads_ahead, "no budget, no read-ahead"


def test_read_ahead_is_bounded_by_whole_jobs() -> None:
    cache = ReadAhead(budget=2400)
    cache.put("a", 0, Result("k0", "s0", _acc(960)))
    cache.put("b", 0, Result("k1", "s1", _acc(960)))
    cache.put("a", 1, Result("k2", "s2", _acc(240)))  # touches "a": "b" is now the oldest
    cache.put("c", 0, Result("k3", "s3", _acc(720)))  # 2880 bytes: drop "b" (960)
    assert cache.bytes == 1920 and not cache.has("b", 0) and cache.has("a", 1)
    cache.put("d", 0, Result("k4", "s4", _acc(2424)))  # larger than the budget: not held
    assert not cache.has("d", 0)
    held = cache.take("a")
    assert sorted(held) == [0, 1] and [held[0].key, held[1].key] == ["k0", "k2"]
    assert held[0].acc.nbytes == 960 and held[1].acc.nbytes == 240
    assert cache.bytes == 720 and cache.take("a") == {}


def test_only_a_float64_npy_array_parses_as_a_result() -> None:
    acc = np.arange(2 * 3 * 3, dtype=np.float64).reshape(2, 3, 3)
    np.testing.assert_array_equal(load_npy(to_npy(acc)), acc)
    archive = io.BytesIO()
    np.savez(archive, a=acc)  # an .npz loads as a lazy archive object, not an array
    with pytest.raises(DecodeError, match="npz"):
        load_npy(archive.getvalue())
    with pytest.raises(DecodeError, match="not a valid"):
        load_npy(to_npy(acc)[:-8])  # truncated
    with pytest.raises(DecodeError, match="expected float64"):
        load_npy(to_npy(acc[:, :, :2]))  # not (h, w, 3)
    mangled = to_npy(acc).replace(b", 'shape'", b", }shape'")  # numpy: a TokenError
    with pytest.raises(DecodeError, match="not a valid"):
        load_npy(mangled)


def _npy(arr: np.ndarray, version: tuple[int, int] | None) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, arr, version=version, allow_pickle=False)
    return buf.getvalue()


@settings(max_examples=300, deadline=None)
@given(
    h=st.integers(1, 9), w=st.integers(1, 9), fortran=st.booleans(),
    dtype=st.sampled_from(["<f8", ">f8", "<f4", "<i8"]),
    version=st.sampled_from([None, (1, 0), (2, 0), (3, 0)]),
    cut=st.integers(0, 400), flip=st.integers(0, 400),
)  # fmt: skip
def test_load_npy_answers_as_np_load(
    h: int,
    w: int,
    fortran: bool,
    dtype: str,
    version: tuple[int, int] | None,
    cut: int,
    flip: int,
) -> None:
    """The header parsed once per distinct header: for any .npy bytes — other dtypes, byte
    orders, Fortran order, every format version, truncated or with a byte changed — the array
    is np.load's, and an error is a DecodeError whenever np.load fails or the array is not a
    float64 (h, w, 3) accumulator."""
    arr = np.arange(h * w * 3).astype(dtype).reshape(h, w, 3)
    data = _npy(np.asfortranarray(arr) if fortran else arr, version)
    if cut:  # truncate or change one byte (the header's too)
        data = data[: len(data) - cut] if cut % 2 else data
        if flip % 3 == 0 and flip < len(data):
            data = data[:flip] + bytes([data[flip] ^ 0x5A]) + data[flip + 1 :]
    try:
        expected = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError, SyntaxError, tokenize.TokenError):
        expected = None
    ok = (
        isinstance(expected, np.ndarray) and expected.dtype == np.float64
        and expected.ndim == 3 and expected.shape[2] == 3
    )  # fmt: skip
    if not ok:
        with pytest.raises(DecodeError):
            load_npy(data)
        return
    got = load_npy(data)
    assert got.dtype == np.float64 and got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)


@settings(max_examples=200, deadline=None)
@given(
    h=st.integers(0, 40), w=st.integers(0, 40), fortran=st.booleans(), step=st.integers(1, 3),
    dtype=st.sampled_from(["<f8", ">f8", "<f4"]),
)  # fmt: skip
def test_to_npy_writes_np_saves_bytes(h: int, w: int, fortran: bool, step: int, dtype: str) -> None:
    """The header written once per shape: the bytes are np.save's of the float64 C-ordered
    array, whatever the accumulator's dtype, order or strides (tile results are content
    addressed, so a byte of difference would be a different result)."""
    arr = np.random.default_rng(h * 41 + w).normal(size=(h * step, w, 3)).astype(dtype)
    arr = arr[::step]
    if fortran:
        arr = np.asfortranarray(arr)
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(arr, dtype=np.float64), allow_pickle=False)
    assert to_npy(arr) == buf.getvalue()
