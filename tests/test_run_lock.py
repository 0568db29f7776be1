"""RunLock: the FIFO lock that serialises a session's runs (asyncio, uvloop and trio)."""

import anyio
import pytest

from aiomnn.run_lock import RunLock

pytestmark = pytest.mark.anyio


async def test_waiters_get_the_lock_in_arrival_order():
    lock, order = RunLock(), []

    async def user(i):
        async with lock:
            order.append(i)
            await anyio.sleep(0.001)

    async with anyio.create_task_group() as tg:
        for i in range(6):
            tg.start_soon(user, i)
            await anyio.sleep(0)  # each task reaches the lock before the next starts
    assert order == list(range(6))
    assert not lock.locked()


async def test_a_free_lock_is_taken_at_once_and_held_exclusively():
    lock, inside, most = RunLock(), 0, 0

    async def user():
        nonlocal inside, most
        async with lock:
            inside += 1
            most = max(most, inside)
            await anyio.sleep(0.001)
            inside -= 1

    async with anyio.create_task_group() as tg:
        for _ in range(5):
            tg.start_soon(user)
    assert most == 1 and not lock.locked()


async def test_a_waiter_cancelled_in_the_queue_leaves_it():
    lock = RunLock()
    got = []

    async def waiter(i):
        async with lock:
            got.append(i)

    async with lock:
        async with anyio.create_task_group() as tg:
            with anyio.CancelScope() as scope:
                tg.start_soon(waiter, 0)
                await anyio.sleep(0.01)
            tg.start_soon(waiter, 1)
            await anyio.sleep(0.01)
            scope.cancel()
            tg.cancel_scope.cancel()
    assert got == [] and not lock.locked()
    async with lock:  # still works
        pass


async def test_a_waiter_cancelled_after_the_hand_off_passes_the_lock_on():
    lock, got = RunLock(), []

    async def waiter(i, scope_box):
        with anyio.CancelScope() as scope:
            scope_box.append(scope)
            async with lock:
                got.append(i)

    first, second = [], []
    async with anyio.create_task_group() as tg:
        async with lock:
            tg.start_soon(waiter, 0, first)
            tg.start_soon(waiter, 1, second)
            await anyio.sleep(0.01)  # both queue
            first[0].cancel()  # the release below hands it the lock before it sees the cancellation
    assert got == [1] and not lock.locked()
