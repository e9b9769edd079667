"""Message ids stay bounded however long the chain of messages that produced them."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from shared.bus.delivery import MAX_ID, child_id, record_id


@given(
    st.text(min_size=1, max_size=2000),
    st.sampled_from(["rollout.completed", "train.requested"]),
    st.text(max_size=100),
)
def test_child_ids_are_short_and_deterministic(parent: str, kind: str, suffix: str) -> None:
    one = child_id(parent, kind, suffix)
    assert one == child_id(parent, kind, suffix)
    assert len(one) <= len(kind) + 33
    assert one != child_id(parent + "x", kind, suffix)


def test_a_long_chain_never_outgrows_the_column() -> None:
    msg_id = "cli/" + "0" * 36
    for hop in range(50):
        msg_id = child_id(msg_id, "capabilities.identified", f"{hop:036d}")
        assert len(record_id(msg_id)) <= 200


@given(st.text(max_size=1000))
def test_record_ids_fit_and_keep_short_ids(msg_id: str) -> None:
    recorded = record_id(msg_id)
    assert len(recorded) <= 200
    if len(msg_id) <= MAX_ID:
        assert recorded == msg_id
