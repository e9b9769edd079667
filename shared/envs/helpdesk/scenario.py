"""The parts every helpdesk task shares: persona, order naming, reference steps, task data.

A `Scenario` collects the user's facts and replies while the builder writes the reference
solution; `data()` assembles the task data, replaying the reference's writes on a fresh
database to record the expected changes.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import date
from typing import Any

from shared.envs.helpdesk.db import Customer, Database, Order, diff, generate
from shared.envs.helpdesk.reference import Script
from shared.envs.helpdesk.tools import build_toolbox

STYLES = ("email", "name_zip", "forgot_email")
"""How the user authenticates: offers its email, offers name and zip, or forgot its email."""

QUESTIONS = {
    "order_id": "Which order is this about? Please share the order id.",
    "reason": "What is the reason for the cancellation?",
    "items_return": "Which items would you like to return?",
    "items_exchange": "Which items would you like to exchange?",
    "address": "What is the new shipping address?",
    "variant": "Which options would you like instead?",
}
ANYTHING_ELSE = "Is there anything else I can help you with?"


@dataclass
class Scenario:
    """A task being written: its database, user, and the reference solution so far."""

    db_seed: int
    db: Database
    rng: random.Random
    customer: Customer
    style: str
    order_mode: str = "given"
    """given (id in the opening), asked (the user knows it when asked), described (by product)."""
    replies: dict[str, str] = field(default_factory=dict)
    volunteered: list[str] = field(default_factory=list)
    script: Script = field(default_factory=Script)

    def __post_init__(self) -> None:
        c = self.customer
        self.replies["email"] = f"My email is {c.email}."
        self.replies["name_zip"] = f"My name is {c.name} and my zip code is {c.zip}."
        self.replies["forgot_email"] = (
            f"I don't remember which email I used. My name is {c.name} and my zip code is {c.zip}."
        )

    def name_order(
        self, order: Order, modes: tuple[str, ...] = ("given", "asked", "described")
    ) -> str:
        """Picks how the user names `order`; returns the words the opening uses for it."""
        product = _unique_product(self.db, order)
        choices = [m for m in modes if m != "described" or product is not None]
        self.order_mode = self.rng.choice(choices)
        if self.order_mode == "described":
            self.replies["order_id"] = (
                f"I don't know the order number, but it's the order with the {product} in it."
            )
            self.volunteered.append("order_id")
            return f"my order with the {product} in it"
        self.replies["order_id"] = f"The order id is {order.id}."
        if self.order_mode == "given":
            self.volunteered.append("order_id")
            return f"my order {order.id}"
        return "one of my orders"

    def authenticate(self) -> None:
        c, s = self.customer, self.script
        if self.style == "name_zip":
            s.say(
                "Hello! I can help with that. First, could you please tell me your first name, "
                "last name and zip code so I can verify your identity?"
            )
        else:
            s.say(
                "Hello! I can help with that. First, could you please share the email address "
                "on your account so I can verify your identity?"
            )
        if self.style == "email":
            s.call("find_customer_by_email", email=c.email)
        else:
            s.call("find_customer_by_name_zip", first_name=c.first_name, last_name=c.last_name,
                   zip=c.zip)  # fmt: skip

    def ask(self, *questions: str) -> None:
        """Asks, in one message, for the order id and each named detail not yet volunteered."""
        wanted = ["order_id", *questions] if self.order_mode == "asked" else list(questions)
        needed = [q for q in wanted if _topic(q) not in self.volunteered]
        if needed:
            self.script.say(" ".join(QUESTIONS[q] for q in needed))

    def look_up(self, order: Order) -> None:
        if self.order_mode == "described":
            self.script.call("list_customer_orders", customer_id=self.customer.id)
        self.script.call("get_order_details", order_id=order.id)

    def user(self, openings: list[str], **facts: str) -> dict[str, Any]:
        c = self.customer
        replies = {**self.replies, **facts}
        return {
            "first_name": c.first_name,
            "last_name": c.last_name,
            "email": c.email,
            "zip": c.zip,
            "auth": "email" if self.style == "email" else "name_zip",
            "knows_email": self.style != "forgot_email",
            "openings": openings,
            "replies": replies,
            "volunteered": sorted(set(self.volunteered)),
        }

    def data(
        self,
        subkind: str,
        user: dict[str, Any],
        request: dict[str, Any],
        communicate: list[str],
        refusal: bool = False,
    ) -> dict[str, Any]:
        """The task data; expected changes come from replaying the reference's writes."""
        return {
            "db_seed": self.db_seed,
            "subkind": subkind,
            "customer_id": self.customer.id,
            "user": user,
            "request": {**request, "accepts_refusal": refusal},
            "expected": {"actions": self.script.writes, "changes": expected_changes(self)},
            "communicate": communicate,
            "forbidden": {"writes": refusal, "other_customers": True},
            "transfer_ok": refusal,
            "reference": self.script.messages,
        }


def expected_changes(scn: Scenario) -> list[dict[str, Any]]:
    db = generate(scn.db_seed)
    before = db.snapshot()
    box = build_toolbox(db)
    for action in scn.script.writes:
        box.tools[action["name"]].fn(**action["arguments"])
    return diff(before, db.snapshot())


def _topic(question: str) -> str:
    return "items" if question.startswith("items") else question


def orders_where(db: Database, *statuses: str) -> list[Order]:
    return [o for o in db.orders.values() if o.status in statuses]


def _unique_product(db: Database, order: Order) -> str | None:
    """A product name in `order` that no other order of the same customer contains."""
    others = {
        item.name
        for o in db.customer_orders(order.customer_id)
        if o.id != order.id
        for item in o.items
    }
    names = [i.name for i in order.items if i.name not in others]
    return names[0] if names else None


def days_since(db: Database, day: str | None) -> int:
    """Days from `day` to the database's today (a huge number when there is no date)."""
    if day is None:
        return 10**6
    return (date.fromisoformat(db.today) - date.fromisoformat(day)).days


def describe(items: list[Any]) -> str:
    """ "the A (opts)" or "the A (opts) and the B (opts)"."""
    return " and ".join(f"the {i.describe()}" for i in items)
