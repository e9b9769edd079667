"""The router's memory of the conversations it answered (`conversations.Recent`): found only
at a request's longest tip and only for the caller, moved on by each reply, a turn that was
overtaken told to branch, the oldest forgotten first, and nothing of it for the garbage
collector to walk."""

from __future__ import annotations

import gc
import uuid

from hypothesis import given
from hypothesis import strategies as st

from services.router.conversations import Known, Recent

AGENT, KEY, OTHER_KEY = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()


def known(tip: str = "t1", key: uuid.UUID | None = KEY, agent: uuid.UUID = AGENT) -> Known:
    return Known(uuid.uuid4(), agent, key, None, {"mode": "embedding"}, tip, 1)


def test_found_at_its_tip_by_the_caller_only() -> None:
    recent = Recent(10)
    c = recent.remember(known())
    assert recent.find(AGENT, KEY, None, "t1") == c
    assert recent.find(AGENT, OTHER_KEY, None, "t1") is None  # another key's conversation
    assert recent.find(uuid.uuid4(), KEY, None, "t1") is None  # another agent's
    assert recent.find(AGENT, KEY, None, "t0") is None  # not its tip: ask the store
    assert recent.find(AGENT, KEY, None, None) is None  # a request that continues nothing


def test_a_named_conversation_is_found_only_at_the_requests_longest_tip() -> None:
    recent = Recent(10)
    c = recent.remember(known())
    assert recent.find(AGENT, OTHER_KEY, c.id, "t1") == c  # named: the id is the credential
    assert recent.find(AGENT, KEY, c.id, "t2") is None  # moved on elsewhere: the store decides
    assert recent.find(uuid.uuid4(), KEY, c.id, "t1") is None  # not this agent's


def test_a_reply_moves_the_conversation_on_and_an_overtaken_turn_branches() -> None:
    recent = Recent(10)
    c = recent.remember(known(tip=""))
    assert recent.find(AGENT, KEY, None, "") is None  # an unanswered opening has no tip yet
    assert recent.answered(c, "", "t1") is c and (c.tip, c.turns) == ("t1", 2)
    assert recent.find(AGENT, KEY, None, "t1") == c
    # two turns found it at t1, each with its own copy; the first answered moves it to t2,
    # the second must branch
    first, second = recent.find(AGENT, KEY, None, "t1"), recent.find(AGENT, KEY, None, "t1")
    assert first is not None and second is not None and first is not second
    assert recent.answered(first, "t1", "t2") is first
    assert recent.answered(second, "t1", "t2b") is None
    assert recent.find(AGENT, KEY, None, "t1") is None
    assert recent.find(AGENT, KEY, None, "t2") == first and first.turns == 3


def test_the_oldest_is_forgotten_first_and_size_zero_keeps_nothing() -> None:
    recent = Recent(2)
    a, b = recent.remember(known("a")), recent.remember(known("b"))
    assert recent.find(AGENT, KEY, None, "a") == a  # a is now the newest
    c = recent.remember(known("c"))
    assert len(recent) == 2
    assert recent.find(AGENT, KEY, None, "b") is None  # evicted, and its tip with it
    assert recent.find(AGENT, KEY, None, "a") == a and recent.find(AGENT, KEY, None, "c") == c
    assert b.tip == "b"
    off = Recent(0)
    off.remember(known("a"))
    assert len(off) == 0 and off.find(AGENT, KEY, None, "a") is None


@given(st.lists(st.tuples(st.integers(0, 5), st.sampled_from("abcdef")), max_size=60))
def test_the_tip_index_always_names_a_kept_conversation_at_that_tip(
    steps: list[tuple[int, str]],
) -> None:
    recent = Recent(3)
    pool = [known(tip="") for _ in range(6)]
    for which, new_tip in steps:
        c = pool[which]
        if recent.find(AGENT, KEY, c.id, c.tip) is None:
            recent.remember(c)
        recent.answered(c, c.tip, new_tip + str(which))
    assert len(recent) <= 3
    for c in pool:
        found = recent.find(AGENT, KEY, None, c.tip) if c.tip else None
        assert found is None or found == c


def test_what_it_keeps_is_nothing_the_garbage_collector_walks() -> None:
    """Its conversations were `Known` objects, ids and index keys the collector tracked:
    each full collection walked them all, every request in flight waiting (up to 72 ms in a
    router that kept 26,000, session 26)."""
    recent = Recent(10_000)
    agents = [uuid.uuid4() for _ in range(3)]
    gc.collect()
    before = len(gc.get_objects())
    for n in range(5_000):
        c = Known(
            uuid.uuid4(),
            agents[n % 3],
            KEY if n % 2 else None,
            uuid.uuid4() if n % 5 else None,
            {"mode": "embedding", "adapter": "a", "scores": {"a": 0.5, "b": 0.25}},
            f"tip{n}",
            n,
        )
        recent.remember(c)
        if n % 3 == 0:
            assert recent.answered(c, c.tip, f"next{n}") is c
    del c
    gc.collect()
    assert len(gc.get_objects()) - before < 50  # not thousands
    assert recent.find(agents[0], None, None, "next0") is not None
    found = recent.find(agents[1], KEY, None, "tip1")
    assert found is not None and found.route["scores"] == {"a": 0.5, "b": 0.25}
