"""Information tasks (`order_status`): report an order's status, the latest order, or a total.

Nothing may change; the agent must find the facts and tell them (communication checks).
"""

from __future__ import annotations

import random
from typing import Any

from shared.envs.helpdesk.db import Database, Order
from shared.envs.helpdesk.scenario import ANYTHING_ELSE, STYLES, Scenario
from shared.envs.helpdesk.text import money

SUBKINDS = ("status", "latest", "total")


def order_status(
    db_seed: int, db: Database, rng: random.Random, index: int
) -> dict[str, Any] | None:
    subkind = SUBKINDS[index % len(SUBKINDS)]
    if subkind == "latest":
        return _latest(db_seed, db, rng, index)
    if subkind == "total":
        candidates = [o for o in db.orders.values() if o.status != "cancelled" and len(o.items) > 1]
    else:
        candidates = list(db.orders.values())
    if not candidates:
        return None
    order = rng.choice(candidates)
    scn = Scenario(db_seed, db, rng, db.customers[order.customer_id], STYLES[index % 3])
    named = scn.name_order(order, ("given", "asked"))
    scn.authenticate()
    scn.ask()
    scn.look_up(order)
    oid = order.id
    if subkind == "total":
        total = money(order.total())
        scn.script.call("calculate", expression=" + ".join(money(i.price) for i in order.items))
        scn.script.say(f"The total of order {oid} is ${total}. {ANYTHING_ELSE}")
        openings = [
            f"Hi, how much did I pay in total for {named}?",
            f"Hello, can you tell me the total amount of {named}?",
        ]
        text, communicate = f"I'd like to know the total of order {oid}.", [total]
    else:
        scn.script.say(f"{_status_text(order)} {ANYTHING_ELSE}")
        openings = [
            f"Hi, can you tell me the status of {named}?",
            f"Hello, what's going on with {named}?",
            f"I'd like to know where {named} is.",
        ]
        text, communicate = f"I'd like to know the status of order {oid}.", _status_facts(order)
    request = {"action": "info", "order_id": oid, "text": text}
    return scn.data(subkind, scn.user(openings), request, communicate)


def _latest(db_seed: int, db: Database, rng: random.Random, index: int) -> dict[str, Any] | None:
    latest = []
    for customer in db.customers.values():
        orders = sorted(db.customer_orders(customer.id), key=lambda o: o.order_date)
        if len(orders) > 1 and orders[-1].order_date != orders[-2].order_date:
            latest.append(orders[-1])
    if not latest:
        return None
    order = rng.choice(latest)
    scn = Scenario(db_seed, db, rng, db.customers[order.customer_id], STYLES[index % 3])
    scn.order_mode = "described"
    scn.volunteered.append("order_id")
    scn.replies["order_id"] = "I don't know the order number; it's my most recent order."
    openings = [
        "Hi, can you tell me the status of my most recent order?",
        "Hello, what's happening with the last order I placed?",
    ]
    scn.authenticate()
    scn.look_up(order)
    scn.script.say(
        f"Your most recent order is {order.id}, placed on {order.order_date}. "
        f"{_status_text(order)} {ANYTHING_ELSE}"
    )
    request = {
        "action": "info",
        "order_id": order.id,
        "text": "I'd like to know the status of my most recent order.",
    }
    return scn.data("latest", scn.user(openings), request, [order.id, order.status])


def _status_facts(order: Order) -> list[str]:
    facts = [order.status]
    if order.status == "shipped" and order.tracking_number:
        facts.append(order.tracking_number)
    return facts


def _status_text(order: Order) -> str:
    text = f"Order {order.id} is currently {order.status}."
    if order.status == "shipped":
        text += f" The tracking number is {order.tracking_number}."
    if order.status == "delivered":
        text += f" It was delivered on {order.delivered_date}."
    return text
