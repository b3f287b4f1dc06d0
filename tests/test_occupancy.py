"""The build stage's occupancy: the compile baselines are told when the build cores free up and fill again."""

from __future__ import annotations

import asyncio

from oracle.occupancy import Occupancy


def test_told_once_per_change_not_per_holder_and_never_before_a_first_holder():
    async def main() -> list[bool]:
        told: list[bool] = []
        stage = Occupancy(told.append)
        first, second = asyncio.Event(), asyncio.Event()

        async def build(done: asyncio.Event) -> None:
            with stage.held():
                await done.wait()

        assert told == []
        tasks = [asyncio.create_task(build(first)), asyncio.create_task(build(second))]
        for _ in range(5):
            await asyncio.sleep(0)
        assert told == [False] and stage.count == 2  # filled by the first; the second changes nothing
        first.set()
        await tasks[0]
        assert told == [False]  # one is still in the stage
        second.set()
        await tasks[1]
        assert told == [False, True] and stage.count == 0
        with stage.held():
            pass
        return told

    assert asyncio.run(main()) == [False, True, False, True]


def test_a_holder_that_fails_still_leaves_the_stage():
    told: list[bool] = []
    stage = Occupancy(told.append)
    try:
        with stage.held():
            raise RuntimeError("the build raised")
    except RuntimeError:
        pass
    assert told == [False, True] and stage.count == 0
