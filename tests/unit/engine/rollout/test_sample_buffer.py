import asyncio

import pytest

from engine.rollout.buffer import SampleBuffer
from engine.types import Trajectory, TrajStatus
from tests.simulated import on_simulated_clock
from tests.waiting import settled


def traj(group: str, i: int, start_version: int, status=TrajStatus.DONE, reward=1.0) -> Trajectory:
    return Trajectory(
        f"{group}.{i}", group, "t", 0, start_version=start_version, status=status, reward=reward
    )


async def fill(buf: SampleBuffer, group: str, n: int, start_version: int) -> None:
    for i in range(n):
        assert await buf.put(traj(group, i, start_version), group_size=n)


@on_simulated_clock
async def test_get_batch_blocks_until_enough_complete_groups():
    buf = SampleBuffer(alpha=1)
    await fill(buf, "a", 2, 0)
    await buf.put(traj("b", 0, 0), group_size=2)  # b is incomplete
    waiter = asyncio.ensure_future(buf.get_batch(2, current_version=0))
    await settled()
    assert not waiter.done()
    await buf.put(traj("b", 1, 0), group_size=2)
    batch = await asyncio.wait_for(waiter, 1)
    assert [g.group_id for g in batch] == ["a", "b"] and all(g.complete for g in batch)
    assert len(buf) == 0 and buf.stats.groups_returned == 2


@on_simulated_clock
async def test_version_bump_evicts_groups_older_than_the_bound():
    buf = SampleBuffer(alpha=1)
    await fill(buf, "v0", 2, 0)
    await fill(buf, "v1", 2, 1)
    await fill(buf, "v2", 2, 2)
    assert await buf.advance(2) == 2  # at v2 with alpha 1 a group must have started at >= v1
    assert [g.group_id for g in buf.complete_groups()] == ["v1", "v2"]
    assert buf.stats.evicted["stale"] == 2
    assert not await buf.put(traj("v0", 9, 0), group_size=2)  # a late member of an evicted group


@on_simulated_clock
async def test_get_batch_never_returns_a_group_beyond_the_bound():
    buf = SampleBuffer(alpha=1, evict_on_advance=False)
    await fill(buf, "v0", 2, 0)
    await fill(buf, "v2", 2, 2)
    batch = await buf.get_batch(1, current_version=3)  # trainer at v3: needs start >= v2
    assert [g.group_id for g in batch] == ["v2"]
    assert buf.stats.evicted["stale"] == 2 and len(buf) == 0
    with pytest.raises(TimeoutError):
        await buf.get_batch(1, current_version=3, timeout_s=0.05)


@on_simulated_clock
async def test_areal_style_buffer_keeps_old_groups():
    buf = SampleBuffer(alpha=1, evict_on_advance=False, check_on_get=False)
    await fill(buf, "v0", 2, 0)
    assert await buf.advance(5) == 0
    assert [g.start_version for g in await buf.get_batch(1, current_version=5)] == [0]


@on_simulated_clock
async def test_failed_members_and_dropped_groups_never_reach_a_batch():
    buf = SampleBuffer(alpha=0)
    assert not await buf.put(traj("a", 0, 0, status=TrajStatus.FAILED), group_size=2)
    assert not await buf.put(traj("a", 1, 0, reward=None), group_size=2)
    assert await buf.put(traj("b", 0, 0), group_size=2)
    assert await buf.drop_group("b", "group_incomplete") == 1
    assert not await buf.put(traj("b", 1, 0), group_size=2)
    assert buf.complete_groups() == [] and len(buf) == 0
    assert buf.stats.evicted == {"status_failed": 1, "unscored": 1, "group_incomplete": 1, "group_closed": 1}


@on_simulated_clock
async def test_batches_are_taken_in_launch_order_not_finish_order():
    buf = SampleBuffer(alpha=1)
    for gid in ("slow", "fast"):
        buf.expect(gid)
    await fill(buf, "fast", 2, 0)  # the later group finished first ...
    waiter = asyncio.ensure_future(buf.get_batch(1, current_version=0))
    await settled()
    assert not waiter.done()  # ... but does not overtake the older one
    await fill(buf, "slow", 2, 0)
    assert [g.group_id for g in await asyncio.wait_for(waiter, 1)] == ["slow"]
    assert [g.group_id for g in await buf.get_batch(1, current_version=0)] == ["fast"]
    assert buf.next_batch == 1  # the trainer at v0 took its batches: the next one is v1's


@on_simulated_clock
async def test_a_dropped_group_gives_its_place_in_line_to_the_next():
    buf = SampleBuffer(alpha=1)
    for gid in ("a", "b", "c"):
        buf.expect(gid)
    await fill(buf, "b", 2, 0)
    await fill(buf, "c", 2, 0)
    waiter = asyncio.ensure_future(buf.get_batch(2, current_version=0))
    await settled()
    assert not waiter.done()
    await buf.drop_group("a", "group_incomplete")
    assert [g.group_id for g in await asyncio.wait_for(waiter, 1)] == ["b", "c"]


@on_simulated_clock
async def test_a_late_member_of_a_returned_group_is_refused_not_started_again():
    buf = SampleBuffer(alpha=1)
    await fill(buf, "a", 2, 0)
    await buf.get_batch(1, current_version=0)
    assert not await buf.put(traj("a", 2, 0), group_size=2)
    assert len(buf) == 0 and buf.stats.evicted["group_closed"] == 1
