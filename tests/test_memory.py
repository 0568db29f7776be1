"""The GPU backends' activation planning: blocks that several values share (aiomnn.memory.SharedArena)."""

from aiomnn.memory import Arena, Block, SharedArena, StorageType


def test_a_view_keeps_its_values_block_reserved_until_both_are_released():
    shared = SharedArena(Arena(64))
    a = shared.acquire(256)
    view = shared.within(a, 256)
    shared.release(a)
    b = shared.acquire(256)  # a's memory is still the view's
    assert b.offset != a.offset
    shared.release(view)
    c = shared.acquire(256)  # now it is free
    assert c.offset == a.offset
    assert not shared.owns(view)


def test_a_piece_lies_at_its_offset_in_the_root_and_views_of_views_share_the_root():
    shared = SharedArena(Arena(64))
    shared.acquire(128)
    whole = shared.acquire(1024)
    piece = shared.within(whole, 256, 512)
    inner = shared.within(piece, 128, 64)
    assert (piece.offset, inner.offset) == (whole.offset + 512, whole.offset + 576)
    assert shared.root(inner) is whole and shared.owns(inner)


def test_a_block_of_no_value_goes_with_its_last_member():
    shared = SharedArena(Arena(64))
    whole = shared.acquire(512, users=0)
    left, right = shared.within(whole, 256, 0), shared.within(whole, 256, 256)
    shared.release(left)
    assert shared.owns(right)
    shared.release(right)
    assert not shared.owns(whole)
    assert shared.acquire(512).offset == whole.offset


def test_a_release_waits_until_its_step_is_placed():
    shared = SharedArena(Arena(64))
    a = shared.acquire(256)
    shared.release(a, until=3)
    shared.placed(2)
    assert shared.acquire(256).offset != a.offset
    shared.placed(3)
    assert not shared.owns(a)
    shared.release(shared.acquire(64), until=1)  # a step already placed: released at once
    assert shared.arena.size == 512


def test_a_block_from_elsewhere_is_left_alone():
    shared = SharedArena(Arena(64))
    a = shared.acquire(64)
    shared.release(Block(64, StorageType.DYNAMIC_SEPARATE))
    assert shared.owns(a)
