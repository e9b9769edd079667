"""In-policy write tasks: cancel an order, change its address, exchange or return items.

Each builder takes `(db_seed, db, rng, index)` and returns the task data, or None when this
database has no order that fits (the caller then tries another seed).
"""

from __future__ import annotations

import random
from typing import Any

from shared.envs.helpdesk.db import CANCEL_REASONS, Database, options_text, random_address
from shared.envs.helpdesk.scenario import (
    ANYTHING_ELSE,
    STYLES,
    Scenario,
    days_since,
    describe,
    orders_where,
)
from shared.envs.helpdesk.text import money

REASON_REPLIES = {
    "no longer needed": "I don't need it anymore.",
    "ordered by mistake": "I ordered it by mistake.",
}
CONFIRM = "Do you confirm (yes/no)?"


def cancel_order(
    db_seed: int, db: Database, rng: random.Random, index: int
) -> dict[str, Any] | None:
    candidates = orders_where(db, "pending", "processing")
    if not candidates:
        return None
    order = rng.choice(candidates)
    scn = Scenario(db_seed, db, rng, db.customers[order.customer_id], STYLES[index % 3])
    reason = rng.choice(CANCEL_REASONS)
    named = scn.name_order(order)
    tail = _volunteer(scn, rng, {"reason": REASON_REPLIES[reason]})
    openings = [
        f"Hi, I'd like to cancel {named}.{tail}",
        f"Hello. Please cancel {named} for me.{tail}",
        f"I need to cancel {named}.{tail}",
    ]
    scn.authenticate()
    scn.ask("reason")
    scn.look_up(order)
    s, oid, pm, total = scn.script, order.id, order.payment_method_id, money(order.total())
    if len(order.items) > 1:
        s.call("calculate", expression=" + ".join(money(i.price) for i in order.items))
    s.say(
        f"Here is what I will do: cancel order {oid} with the reason '{reason}'. The full amount "
        f"of ${total} will be refunded to the original payment method ({pm}). {CONFIRM}"
    )
    s.write("cancel_pending_order", order_id=oid, reason=reason)
    s.say(f"Order {oid} has been cancelled, and ${total} will be refunded to {pm}. {ANYTHING_ELSE}")
    user = scn.user(openings, reason=REASON_REPLIES[reason])
    request = {"action": "cancel", "order_id": oid, "text": _restate("cancel", scn, oid, named)}
    return scn.data("cancel", user, request, [total])


def change_address(
    db_seed: int, db: Database, rng: random.Random, index: int
) -> dict[str, Any] | None:
    candidates = orders_where(db, "pending")
    if not candidates:
        return None
    order = rng.choice(candidates)
    customer = db.customers[order.customer_id]
    scn = Scenario(db_seed, db, rng, customer, STYLES[index % 3])
    saved = [a for a in customer.addresses if a != order.address]
    if saved and rng.random() < 0.6:
        new, subkind = saved[0], "saved_address"
        reply = f"Please ship it to my other saved address, the one on {new.street}."
    else:
        new, subkind = random_address(rng), "new_address"
        reply = f"Please ship it to {new.line()}."
    named = scn.name_order(order)
    tail = _volunteer(scn, rng, {"address": reply})
    openings = [
        f"Hi, I need to change the shipping address of {named}.{tail}",
        f"Hello, I'd like {named} to be delivered to a different address.{tail}",
        f"I moved recently and need to update the address on {named}.{tail}",
    ]
    scn.authenticate()
    scn.ask("address")
    scn.look_up(order)
    s, oid = scn.script, order.id
    if subkind == "saved_address":
        s.call("get_customer_details", customer_id=customer.id)
    s.say(f"I will change the shipping address of order {oid} to {new.line()}. {CONFIRM}")
    s.write("modify_pending_order_address", order_id=oid, street=new.street, city=new.city,
            state=new.state, zip=new.zip)  # fmt: skip
    s.say(f"The shipping address of order {oid} is now {new.line()}. {ANYTHING_ELSE}")
    user = scn.user(openings, address=reply)
    request = {
        "action": "address",
        "order_id": oid,
        "text": _restate("change the shipping address of", scn, oid, named),
        "must_mention": [new.street],
    }
    return scn.data(subkind, user, request, [])


def exchange_items(
    db_seed: int, db: Database, rng: random.Random, index: int
) -> dict[str, Any] | None:
    candidates = orders_where(db, "pending")
    if not candidates:
        return None
    order = rng.choice(candidates)
    scn = Scenario(db_seed, db, rng, db.customers[order.customer_id], STYLES[index % 3])
    items = rng.sample(order.items, min(len(order.items), rng.choice((1, 1, 2))))
    targets = []
    for item in items:
        product = db.products[item.product_id]
        options = [v for v in product.variants if v.available and v.item_id != item.item_id]
        if not options:
            return None
        targets.append(rng.choice(options))
    wanted = " and ".join(f"the {i.name} in {options_text(t.options)}" for i, t in
                          zip(items, targets, strict=True))  # fmt: skip
    facts = {
        "items": f"I want to exchange {describe(items)}.",
        "variant": f"I'd like {wanted} instead.",
    }
    named = scn.name_order(order)
    tail = _volunteer(scn, rng, facts)
    openings = [
        f"Hi, I'd like to exchange some items in {named}.{tail}",
        f"Hello, I ordered the wrong options in {named} and want to exchange them.{tail}",
        f"I want to exchange an item from {named} for a different option.{tail}",
    ]
    scn.authenticate()
    scn.ask("items_exchange", "variant")
    scn.look_up(order)
    s, oid, pm = scn.script, order.id, order.payment_method_id
    for item in items:
        s.call("get_product_details", product_id=item.product_id)
    diff = round(sum(t.price for t in targets) - sum(i.price for i in items), 2)
    if diff:
        new_sum = " + ".join(money(t.price) for t in targets)
        old_sum = " + ".join(money(i.price) for i in items)
        s.call("calculate", expression=f"({new_sum}) - ({old_sum})")
        way = "charged to" if diff > 0 else "refunded to"
        money_text = (
            f"The price difference of ${money(abs(diff))} will be {way} the original payment "
            f"method ({pm})."
        )
    else:
        money_text = "There is no price difference."
    news = " and ".join(f"the {i.name} ({options_text(t.options)})" for i, t in
                        zip(items, targets, strict=True))  # fmt: skip
    s.say(f"I will exchange {describe(items)} for {news} in order {oid}. {money_text} {CONFIRM}")
    s.write("exchange_pending_order_items", order_id=oid, item_ids=[i.item_id for i in items],
            new_item_ids=[t.item_id for t in targets])  # fmt: skip
    s.say(f"The exchange in order {oid} is done. {money_text} {ANYTHING_ELSE}")
    user = scn.user(openings, **facts)
    request = {
        "action": "exchange",
        "order_id": oid,
        "text": _restate("exchange items in", scn, oid, named),
    }
    subkind = "exchange_one" if len(items) == 1 else "exchange_two"
    return scn.data(subkind, user, request, [money(abs(diff))] if diff else [])


def return_items(
    db_seed: int, db: Database, rng: random.Random, index: int
) -> dict[str, Any] | None:
    candidates = [
        o for o in orders_where(db, "delivered") if days_since(db, o.delivered_date) <= 25
    ]
    if not candidates:
        return None
    order = rng.choice(candidates)
    scn = Scenario(db_seed, db, rng, db.customers[order.customer_id], STYLES[index % 3])
    items = rng.sample(order.items, min(len(order.items), rng.choice((1, 1, 2))))
    facts = {"items": f"I want to return {describe(items)}."}
    named = scn.name_order(order)
    tail = _volunteer(scn, rng, facts)
    openings = [
        f"Hi, I'd like to return some items from {named}.{tail}",
        f"Hello, I want to send back something from {named}.{tail}",
        f"I need to return an item I received in {named}.{tail}",
    ]
    scn.authenticate()
    scn.ask("items_return")
    scn.look_up(order)
    s, oid, pm = scn.script, order.id, order.payment_method_id
    s.call("get_current_date")
    refund = money(round(sum(i.price for i in items), 2))
    if len(items) > 1:
        s.call("calculate", expression=" + ".join(money(i.price) for i in items))
    s.say(
        f"I will return {describe(items)} from order {oid}. The refund of ${refund} will go to "
        f"the original payment method ({pm}). {CONFIRM}"
    )
    s.write("return_delivered_order_items", order_id=oid, item_ids=[i.item_id for i in items],
            payment_method_id=pm)  # fmt: skip
    s.say(f"The return is done: ${refund} will be refunded to {pm}. {ANYTHING_ELSE}")
    user = scn.user(openings, **facts)
    request = {
        "action": "return",
        "order_id": oid,
        "text": _restate("return items from", scn, oid, named),
    }
    subkind = "return_one" if len(items) == 1 else "return_two"
    return scn.data(subkind, user, request, [refund])


def _volunteer(scn: Scenario, rng: random.Random, facts: dict[str, str]) -> str:
    """Half the time the opening already states the facts; returns the text to append."""
    if rng.random() < 0.5:
        return ""
    scn.volunteered.extend(facts)
    return " " + " ".join(facts.values())


def _restate(verb: str, scn: Scenario, order_id: str, named: str) -> str:
    return f"I want to {verb} {named if scn.order_mode == 'described' else f'order {order_id}'}."
