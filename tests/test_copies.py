"""aiomnn.copies: large host copies in pieces on a few threads (the GPU backends' staging memory)."""

import numpy as np

from aiomnn import copies


def test_pieces_cover_the_array_on_item_bounds(monkeypatch):
    monkeypatch.setattr(copies, "PIECE_MIN", 4096)
    nbytes = 3 * 40 * 37 * 4 * 8
    pieces = copies.pieces(nbytes, 4)
    assert 1 < len(pieces) <= copies.PIECES
    assert pieces[0][0] == 0 and pieces[-1][1] == nbytes
    assert all(a[1] == b[0] and a[1] % (4096 * 4) == 0 for a, b in zip(pieces, pieces[1:]))


def test_a_large_copy_in_pieces_equals_one_copy(monkeypatch):
    monkeypatch.setattr(copies, "SPLIT_BYTES", 1)
    monkeypatch.setattr(copies, "PIECE_MIN", 4096)
    monkeypatch.setattr(copies, "THREADS", 2)
    src = np.random.default_rng(0).standard_normal((8, 3, 50, 41)).astype(np.float32)
    dst = np.empty_like(src)
    got = list(copies.fill(dst, src))
    assert len(got) > 1 and got[0][0] == 0 and got[-1][1] == dst.nbytes
    np.testing.assert_array_equal(dst, src)
    half = np.empty(src.shape, np.float16)  # casts like np.copyto(casting="unsafe")
    copies.copy(half, src)
    np.testing.assert_array_equal(half, src.astype(np.float16))


def test_small_or_strided_arrays_are_copied_at_once(monkeypatch):
    monkeypatch.setattr(copies, "THREADS", 2)
    src = np.arange(24, dtype=np.float32).reshape(4, 6)
    dst = np.empty_like(src)
    assert list(copies.fill(dst, src)) == [(0, dst.nbytes)]  # under SPLIT_BYTES
    monkeypatch.setattr(copies, "SPLIT_BYTES", 1)
    strided = np.empty((4, 12), np.float32)[:, ::2]
    assert list(copies.fill(strided, src)) == [(0, strided.nbytes)]
    np.testing.assert_array_equal(strided, src)


def test_a_medium_copy_comes_in_pieces_from_this_thread(monkeypatch):
    monkeypatch.setattr(copies, "SEND_BYTES", 8192)
    monkeypatch.setattr(copies, "PIECE_MIN", 4096)
    monkeypatch.setattr(copies, "_threads", lambda: (_ for _ in ()).throw(AssertionError("no threads here")))
    src = np.random.default_rng(2).standard_normal((3, 40, 37)).astype(np.float32)
    dst = np.empty_like(src)
    assert copies.sent_in_pieces(dst.nbytes) and not copies.large(dst.nbytes)
    got = []
    for a, b in copies.fill(dst, src):
        np.testing.assert_array_equal(dst.reshape(-1)[a // 4:b // 4], src.reshape(-1)[a // 4:b // 4])  # filled when yielded
        got.append((a, b))
    assert len(got) > 1 and got[0][0] == 0 and got[-1][1] == dst.nbytes
    assert all(x[1] == y[0] for x, y in zip(got, got[1:]))
    np.testing.assert_array_equal(dst, src)
