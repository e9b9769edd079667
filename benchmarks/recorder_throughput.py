"""How many production turns a second the router's recorder writes to Postgres: the
statements of `services.router.recorder.write_batch`, batch after batch, on one connection
held outside a transaction as the recorder holds it, on the local
server, in the mix the router benchmark sends (each conversation opened, then continued
once in the next batch), with the CPU time the writing process spends a turn (what the
router's event loop gives to recording).

    python -m benchmarks.recorder_throughput --turns 20000 --batch 512

The router answers a turn before it is written, so its sustained rate is only real where the
recorder writes at least as many turns a second (else the queue grows until its limit).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy import func, select

from benchmarks.router_overhead import _drop, _setup, conversation
from services.router.conversations import Known, tip
from services.router.recorder import Answered, Opening, Turn, write_batch
from shared.config import DatabaseConfig
from shared.store import Store
from shared.store.migrate import upgrade_async
from shared.store.models import Agent, Conversation, Trajectory


def _answered(
    tenant: str, agent_id: uuid.UUID, key_id: uuid.UUID | None, n: int, known: Known | None
) -> tuple[Answered, Known]:
    """Conversation `n`'s first turn (no `known`) or second, as the router queues it."""
    turn_no = 0 if known is None else 1
    messages = [*conversation(n, turn_no), {"role": "assistant", "content": "Done."}]
    if known is None:
        route = {"mode": "embedding", "adapter": None, "confidence": 0.4, "scores": {}}
        known = Known(uuid.uuid4(), agent_id, key_id, None, route, "", 0)
        turn = Turn(tenant, known, "", 0, opening=Opening(agent_id, None, key_id, route))
    else:
        turn = Turn(tenant, known, known.tip, known.turns)
    new_tip = tip(messages)
    answered = Answered(turn, "smollm2", messages, new_tip, 2, 1.5)
    moved = Known(known.id, agent_id, key_id, None, known.route, new_tip, known.turns + 1)
    return answered, moved


async def main(args: argparse.Namespace) -> dict[str, Any]:
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    await upgrade_async(args.database_url, schema)
    store = Store.connect(DatabaseConfig(url=args.database_url, schema=schema), args.database_url)
    try:
        await _setup(store)
        async with store.tenant("bench") as session:
            agent_id = await session.scalar(select(Agent.id))
        assert agent_id is not None
        opened: list[Known] = []
        n = 0
        written = 0
        seconds = cpu_s = 0.0
        # one connection outside a transaction, held from batch to batch: as the recorder
        async with store.engine.connect() as conn:
            await conn.execution_options(isolation_level="AUTOCOMMIT")
            while written < args.turns:
                batch: list[Answered] = []
                for known in opened:  # last batch's conversations go on
                    batch.append(_answered("bench", agent_id, None, 0, known)[0])
                fresh: list[Known] = []
                while len(batch) < args.batch:
                    answered, moved = _answered("bench", agent_id, None, n, None)
                    batch.append(answered)
                    fresh.append(moved)
                    n += 1
                opened = fresh[: args.batch // 2]
                started, cpu = time.perf_counter(), time.process_time()
                apart = await write_batch(conn, "bench", batch)
                assert not apart, "every turn of the mix fits the batched statements"
                seconds += time.perf_counter() - started
                cpu_s += time.process_time() - cpu
                written += len(batch)
        async with store.tenant("bench") as session:
            turns = await session.scalar(select(func.sum(Conversation.turns)))
            trajectories = await session.scalar(select(func.count()).select_from(Trajectory))
    finally:
        await store.close()
        await _drop(args.database_url, schema)
    return {
        "turns": written,
        "batch": args.batch,
        "seconds": seconds,
        "turns_per_s": written / seconds,
        "router_cpu_us_per_turn": cpu_s / written * 1e6,
        "turns_recorded": int(turns or 0),
        "trajectories": int(trajectories or 0) - 12,  # _setup's diagnosed failures
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--out", type=Path)
    ns = parser.parse_args()
    out = asyncio.run(main(ns))
    print(json.dumps(out, indent=2))
    if ns.out:
        ns.out.write_text(json.dumps(out, indent=2) + "\n")
