"""Wake-ups from a writer thread to the event loop (lmsp/wakeups.py): a thread that holds sends
nothing until it releases, then everything in order, on the loop's thread; one reader's failing
callback strands nobody; a post from the loop's own thread still runs."""

from __future__ import annotations

import asyncio
import threading

from lmsp import wakeups


def _from_thread(body) -> None:
    t = threading.Thread(target=body)
    t.start()
    t.join(timeout=10)
    assert not t.is_alive()


async def _until(predicate, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "the callbacks never ran"
        await asyncio.sleep(0.005)


def test_held_posts_wait_for_release_then_run_in_order_on_the_loop():
    async def main() -> None:
        door = wakeups.channel(asyncio.get_running_loop())
        loop_thread = threading.get_ident()
        ran: list[tuple[int, int]] = []
        released = threading.Event()

        def writer() -> None:
            wakeups.hold()
            for i in range(5):
                door.post(lambda i=i: ran.append((i, threading.get_ident())))
            released.wait(5)
            wakeups.release()

        t = threading.Thread(target=writer)
        t.start()
        await asyncio.sleep(0.2)  # the loop is free to run them, had they been sent
        assert ran == []
        released.set()
        await _until(lambda: len(ran) == 5)
        t.join(timeout=5)
        assert [i for i, _ in ran] == [0, 1, 2, 3, 4]
        assert {who for _, who in ran} == {loop_thread}

    asyncio.run(main())


def test_a_post_without_hold_runs_at_once():
    async def main() -> None:
        door = wakeups.channel(asyncio.get_running_loop())
        ran: list[int] = []
        _from_thread(lambda: door.post(lambda: ran.append(1)))
        await _until(lambda: ran == [1])
        door.post(lambda: ran.append(2))  # from the loop's own thread too
        await _until(lambda: ran == [1, 2])

    asyncio.run(main())


def test_a_failing_callback_strands_nobody(caplog):
    async def main() -> None:
        door = wakeups.channel(asyncio.get_running_loop())
        ran: list[str] = []

        def failing() -> None:
            raise RuntimeError("a reader's bug")

        def writer() -> None:
            wakeups.hold()
            door.post(lambda: ran.append("before"))
            door.post(failing)
            door.post(lambda: ran.append("after"))
            wakeups.release()

        _from_thread(writer)
        await _until(lambda: ran == ["before", "after"])

    asyncio.run(main())
    assert "a wake-up callback failed" in caplog.text


def test_each_loop_has_its_own_channel_and_a_release_rings_all_it_posted_to():
    ran: list[str] = []
    doors: dict[str, wakeups.Channel] = {}
    ready = threading.Barrier(3)

    def serve(name: str) -> None:
        async def main() -> None:
            doors[name] = wakeups.channel(asyncio.get_running_loop())
            assert wakeups.channel(asyncio.get_running_loop()) is doors[name]
            ready.wait(5)
            await _until(lambda: name in ran)

        asyncio.run(main())

    loops = [threading.Thread(target=serve, args=(n,)) for n in ("a", "b")]
    for t in loops:
        t.start()
    ready.wait(5)
    assert doors["a"] is not doors["b"]
    wakeups.hold()
    doors["a"].post(lambda: ran.append("a"))
    doors["b"].post(lambda: ran.append("b"))
    wakeups.release()
    for t in loops:
        t.join(timeout=10)
        assert not t.is_alive()
    assert sorted(ran) == ["a", "b"]
