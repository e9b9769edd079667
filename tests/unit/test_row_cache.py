"""The router's row cache: served only while the change feed is live, dropped when one of
its rows changes, never filled from a read that a change overtook, bounded in age and size.
The feed here is a stand-in with the two attributes the cache reads; the real one
(`shared.store.changes.ChangeFeed`) is exercised against Postgres in
tests/integration/test_change_feed.py."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from shared.store.changes import ChangeFeed, RowCache


@dataclass
class Feed:
    live: bool = True
    generation: int = 0


def cache(feed: Feed, ttl_s: float = 60.0, size: int = 100) -> RowCache[str, int]:
    return RowCache(feed, ttl_s, size)  # type: ignore[arg-type]


ROW = (("agents", "a1"),)


def test_a_value_is_served_until_its_row_changes() -> None:
    feed = Feed()
    c = cache(feed)
    c.put("bot", 1, ROW, feed.generation, now=0.0)
    assert c.get("bot", now=1.0) == 1
    c.changed("agents", "other")
    assert c.get("bot", now=1.0) == 1
    c.changed("agents", "a1")
    assert c.get("bot", now=1.0) is None and len(c) == 0


def test_nothing_is_served_while_the_feed_is_deaf_and_all_is_forgotten_on_reconnect() -> None:
    feed = Feed()
    c = cache(feed)
    c.put("bot", 1, ROW, 0, now=0.0)
    feed.live = False
    assert c.get("bot", now=0.0) is None
    c.put("other", 2, (("agents", "a2"),), 0, now=0.0)  # not kept while deaf
    feed.live = True
    assert c.get("other", now=0.0) is None
    c.changed(None, None)
    assert c.get("bot", now=0.0) is None and len(c) == 0


def test_a_read_overtaken_by_a_change_is_not_kept() -> None:
    feed = Feed()
    c = cache(feed)
    before = feed.generation
    feed.generation += 1  # a change was announced while the store was being read
    c.put("bot", 1, ROW, before, now=0.0)
    assert c.get("bot", now=0.0) is None


def test_age_and_size_are_bounded() -> None:
    feed = Feed()
    c = cache(feed, ttl_s=10.0, size=2)
    c.put("a", 1, (("agents", "1"),), 0, now=0.0)
    assert c.get("a", now=10.5) is None  # too old
    for i, key in enumerate("bcd"):
        c.put(key, i, (("agents", key),), 0, now=0.0)
    assert len(c) == 2 and c.get("b", now=0.0) is None and c.get("d", now=0.0) == 2


def test_no_cache_with_a_zero_age() -> None:
    feed = Feed()
    c = cache(feed, ttl_s=0.0)
    c.put("a", 1, ROW, 0, now=0.0)
    assert c.get("a", now=0.0) is None


@given(
    st.lists(st.tuples(st.sampled_from("abc"), st.sampled_from(["r1", "r2", "r3"])), max_size=30),
    st.lists(st.sampled_from(["r1", "r2", "r3"]), max_size=10),
)
def test_a_changed_row_leaves_no_value_read_from_it(
    puts: list[tuple[str, str]], changes: list[str]
) -> None:
    feed = Feed()
    c = cache(feed, size=2)
    origin: dict[str, str] = {}
    for key, row in puts:
        c.put(key, 0, (("agents", row),), 0, now=0.0)
        origin[key] = row
    for row in changes:
        c.changed("agents", row)
        assert all(origin[k] != row for k in "abc" if c.get(k, now=0.0) is not None)
    assert len(c) <= 2


def test_notifications_of_another_schema_are_ignored() -> None:
    seen: list[tuple[str | None, str | None]] = []
    feed = ChangeFeed("postgresql://unused", "mine", lambda t, r: seen.append((t, r)))
    feed._notified(None, 0, "retrace_changes", "theirs:agents:1")
    feed._notified(None, 0, "retrace_changes", "mine:agents:2")
    assert seen == [("agents", "2")] and feed.generation == 1
