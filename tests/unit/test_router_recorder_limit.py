"""The recorder's limit of turns waiting for the store: a request holds a place for its turn
before it is answered, so the router refuses one it could not keep instead of answering it
and losing its turn (issue 14: the router benchmark lost 13,256 of 34,854 turns so)."""

from __future__ import annotations

from services.router.recorder import Recorder
from tests.unit.test_router_spool import _DownStore, _turn


async def test_places_are_held_before_the_reply_and_none_past_the_limit() -> None:
    recorder = Recorder(_DownStore(), limit=2)  # type: ignore[arg-type]
    assert recorder.reserve() and recorder.reserve()
    assert not recorder.reserve()  # two requests in progress hold the two places
    recorder.submit(_turn("one", True))
    recorder.submit(_turn("two", True))
    assert recorder.waiting == 2  # both kept
    recorder.release()
    recorder.release()
    assert not recorder.reserve()  # now the turns themselves fill the queue


async def test_a_request_that_ends_without_a_turn_gives_its_place_back() -> None:
    recorder = Recorder(_DownStore(), limit=1)  # type: ignore[arg-type]
    assert recorder.reserve()
    recorder.release()  # refused upstream: nothing submitted
    assert recorder.reserve() and recorder.waiting == 0


async def test_a_turn_without_a_place_is_still_refused_past_the_limit() -> None:
    recorder = Recorder(_DownStore(), limit=1)  # type: ignore[arg-type]
    recorder.submit(_turn("one", True))
    recorder.submit(_turn("two", True))  # logged as lost: nothing held a place for it
    assert recorder.waiting == 1
