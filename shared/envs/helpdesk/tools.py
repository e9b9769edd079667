"""The helpdesk tools: reads, the four writes, and utilities, bound to one episode's database.

Write tools enforce the hard constraints (order status, items belonging to the order, variants
of the same product, the original payment method) by raising `ToolError`. Soft rules (the user
is authenticated, the user said yes, the 30-day return window, the cancellation reason the user
actually gave, whose order it is) are left to scoring, as in tau2.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from typing import Any

import msgspec

from shared.envs.helpdesk.db import (
    CANCEL_REASONS,
    Address,
    Database,
    Order,
    OrderItem,
    Transaction,
)
from shared.envs.tools import Tool, ToolBox, ToolError

WRITE_TOOLS = frozenset(
    {
        "cancel_pending_order",
        "modify_pending_order_address",
        "exchange_pending_order_items",
        "return_delivered_order_items",
    }
)
AUTH_TOOLS = frozenset({"find_customer_by_email", "find_customer_by_name_zip"})
TRANSFER_TOOL = "transfer_to_human_agent"

_STR: dict[str, Any] = {"type": "string"}
_IDS: dict[str, Any] = {"type": "array", "items": {"type": "string"}}


def build_toolbox(db: Database) -> ToolBox:
    """A `ToolBox` whose tools read and change `db` in place."""
    impl = _Impl(db)
    return ToolBox({tool.name: tool for tool in _tools(impl)})


def _params(**props: dict[str, Any]) -> dict[str, Any]:
    """A strict arguments schema: every property required, nothing else allowed."""
    return {
        "type": "object",
        "properties": props,
        "required": list(props),
        "additionalProperties": False,
    }


def _described(schema: dict[str, Any], text: str) -> dict[str, Any]:
    return {**schema, "description": text}


def _tools(impl: _Impl) -> list[Tool]:
    order_id = _described(_STR, "Order id, e.g. 'W1234567'.")
    customer_id = _described(_STR, "Customer id as returned by the find_customer tools.")
    spec: list[tuple[str, str, dict[str, Any], Callable[..., Any]]] = [
        ("find_customer_by_email", "Find a customer's id by email.",
         _params(email=_STR), impl.find_customer_by_email),
        ("find_customer_by_name_zip", "Find a customer's id by first name, last name and zip.",
         _params(first_name=_STR, last_name=_STR, zip=_STR), impl.find_customer_by_name_zip),
        ("get_customer_details", "A customer's profile: name, email, addresses, payment "
         "methods and order ids.", _params(customer_id=customer_id), impl.get_customer_details),
        ("list_customer_orders", "A customer's orders with their status and order date.",
         _params(customer_id=customer_id), impl.list_customer_orders),
        ("get_order_details", "An order's status, dates, items, address, payment method and "
         "transactions.", _params(order_id=order_id), impl.get_order_details),
        ("list_products", "Every product's id and name.", _params(), impl.list_products),
        ("get_product_details", "A product's variants: item id, options, price, availability.",
         _params(product_id=_STR), impl.get_product_details),
        ("get_current_date", "Today's date (YYYY-MM-DD).", _params(), impl.get_current_date),
        ("calculate", "Evaluate an arithmetic expression with + - * / and parentheses.",
         _params(expression=_STR), impl.calculate),
        ("cancel_pending_order", "Cancel a pending or processing order; the total is refunded "
         "to the original payment method.",
         _params(order_id=order_id, reason={"type": "string", "enum": list(CANCEL_REASONS)}),
         impl.cancel_pending_order),
        ("modify_pending_order_address", "Change the shipping address of a pending order.",
         _params(order_id=order_id, street=_STR, city=_STR,
                 state=_described(_STR, "Two-letter state code."),
                 zip=_described(_STR, "Five-digit zip code.")),
         impl.modify_pending_order_address),
        ("exchange_pending_order_items", "Exchange items of a pending order for other variants "
         "of the same products; item_ids[i] becomes new_item_ids[i]. The price difference is "
         "charged or refunded to the original payment method.",
         _params(order_id=order_id, item_ids=_IDS, new_item_ids=_IDS),
         impl.exchange_pending_order_items),
        ("return_delivered_order_items", "Return items of a delivered order; the refund goes "
         "to the payment method given, which must be the order's original one.",
         _params(order_id=order_id, item_ids=_IDS, payment_method_id=_STR),
         impl.return_delivered_order_items),
        (TRANSFER_TOOL, "Transfer the user to a human agent, with a summary of the issue. "
         "Only for requests that cannot be handled within the policy.",
         _params(summary=_STR), impl.transfer_to_human_agent),
    ]  # fmt: skip
    return [Tool(name, desc, params, fn) for name, desc, params, fn in spec]


class _Impl:
    """The tool bodies; each returns JSON-able data or raises `ToolError`."""

    def __init__(self, db: Database) -> None:
        self.db = db

    # reads

    def find_customer_by_email(self, email: str) -> str:
        wanted = email.strip().lower()
        for c in self.db.customers.values():
            if c.email == wanted:
                return c.id
        raise ToolError(f"no customer with email {email!r}")

    def find_customer_by_name_zip(self, first_name: str, last_name: str, zip: str) -> str:
        key = (first_name.strip().lower(), last_name.strip().lower(), zip.strip())
        for c in self.db.customers.values():
            if (c.first_name.lower(), c.last_name.lower(), c.zip) == key:
                return c.id
        raise ToolError("no customer with that first name, last name and zip code")

    def get_customer_details(self, customer_id: str) -> dict[str, Any]:
        c = self.db.customers.get(customer_id)
        if c is None:
            raise ToolError(f"no customer with id {customer_id!r}")
        return {
            "customer_id": c.id,
            "name": c.name,
            "email": c.email,
            "addresses": [msgspec.to_builtins(a) for a in c.addresses],
            "payment_methods": [msgspec.to_builtins(p) for p in c.payment_methods],
            "orders": list(c.order_ids),
        }

    def list_customer_orders(self, customer_id: str) -> list[dict[str, Any]]:
        if customer_id not in self.db.customers:
            raise ToolError(f"no customer with id {customer_id!r}")
        return [
            {"order_id": o.id, "status": o.status, "order_date": o.order_date}
            for o in self.db.customer_orders(customer_id)
        ]

    def get_order_details(self, order_id: str) -> dict[str, Any]:
        return msgspec.to_builtins(self._order(order_id))

    def list_products(self) -> list[dict[str, str]]:
        return [{"product_id": p.id, "name": p.name} for p in self.db.products.values()]

    def get_product_details(self, product_id: str) -> dict[str, Any]:
        p = self.db.products.get(product_id)
        if p is None:
            raise ToolError(f"no product with id {product_id!r}")
        variants = msgspec.to_builtins(p.variants)
        return {"product_id": p.id, "name": p.name, "variants": variants}

    def get_current_date(self) -> dict[str, str]:
        return {"date": self.db.today}

    def calculate(self, expression: str) -> dict[str, float]:
        return {"result": round(evaluate(expression), 2)}

    def transfer_to_human_agent(self, summary: str) -> str:
        return "Transfer successful. A human agent will take over the conversation."

    # writes

    def cancel_pending_order(self, order_id: str, reason: str) -> dict[str, Any]:
        order = self._order(order_id)
        if order.status not in ("pending", "processing"):
            raise ToolError(
                f"order {order_id} is {order.status}; only pending or processing orders can "
                "be cancelled"
            )
        order.status = "cancelled"
        order.cancel_reason = reason
        self._pay(order, "refund", order.total(), "cancellation")
        return msgspec.to_builtins(order)

    def modify_pending_order_address(
        self, order_id: str, street: str, city: str, state: str, zip: str
    ) -> dict[str, Any]:
        order = self._pending(order_id, "changed")
        order.address = Address(street, city, state, zip)
        return msgspec.to_builtins(order)

    def exchange_pending_order_items(
        self, order_id: str, item_ids: list[str], new_item_ids: list[str]
    ) -> dict[str, Any]:
        order = self._pending(order_id, "exchanged")
        if len(item_ids) != len(new_item_ids):
            raise ToolError("item_ids and new_item_ids must have the same length")
        items = self._items(order, item_ids)
        new = []
        for item, new_id in zip(items, new_item_ids, strict=True):
            variant = self.db.products[item.product_id].variant(new_id)
            if variant is None:
                raise ToolError(f"{new_id} is not a variant of {item.name} ({item.product_id})")
            if new_id == item.item_id:
                raise ToolError(f"{new_id} is the item being exchanged; pick another variant")
            if not variant.available:
                raise ToolError(f"variant {new_id} is not available")
            new.append(variant)
        diff = round(sum(v.price for v in new) - sum(i.price for i in items), 2)
        for item, variant in zip(items, new, strict=True):
            item.item_id, item.price = variant.item_id, variant.price
            item.options = dict(variant.options)
        if diff:
            self._pay(order, "charge" if diff > 0 else "refund", abs(diff), "exchange")
        return msgspec.to_builtins(order)

    def return_delivered_order_items(
        self, order_id: str, item_ids: list[str], payment_method_id: str
    ) -> dict[str, Any]:
        order = self._order(order_id)
        if order.status != "delivered":
            raise ToolError(f"order {order_id} is {order.status}; only delivered orders")
        if payment_method_id != order.payment_method_id:
            raise ToolError(f"refunds go to the original payment method {order.payment_method_id}")
        items = self._items(order, item_ids)
        if any(i.returned for i in items):
            raise ToolError("some of these items were already returned")
        for item in items:
            item.returned = True
        self._pay(order, "refund", round(sum(i.price for i in items), 2), "return")
        return msgspec.to_builtins(order)

    # helpers

    def _order(self, order_id: str) -> Order:
        order = self.db.orders.get(order_id)
        if order is None:
            raise ToolError(f"no order with id {order_id!r} (ids look like 'W1234567')")
        return order

    def _pending(self, order_id: str, what: str) -> Order:
        order = self._order(order_id)
        if order.status != "pending":
            raise ToolError(
                f"order {order_id} is {order.status}; only pending orders can be {what}"
            )
        return order

    def _items(self, order: Order, item_ids: list[str]) -> list[OrderItem]:
        if not item_ids:
            raise ToolError("item_ids must name at least one item")
        if len(set(item_ids)) != len(item_ids):
            raise ToolError("item_ids contains duplicates")
        by_id = {i.item_id: i for i in order.items}
        missing = [i for i in item_ids if i not in by_id]
        if missing:
            raise ToolError(f"items {missing} are not in order {order.id}")
        return [by_id[i] for i in item_ids]

    def _pay(self, order: Order, kind: str, amount: float, note: str) -> None:
        order.transactions.append(Transaction(kind, amount, order.payment_method_id, note))


_OPS: dict[type, Callable[..., float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def evaluate(expression: str) -> float:
    """The value of a + - * / expression over numbers; anything else is a `ToolError`."""
    if len(expression) > 200:
        raise ToolError("expression too long (200 characters at most)")
    try:
        tree = ast.parse(expression.replace("$", "").replace(",", ""), mode="eval")
        value = _eval(tree.body)
    except ZeroDivisionError as exc:
        raise ToolError("division by zero") from exc
    except (SyntaxError, ValueError, OverflowError, RecursionError, MemoryError) as exc:
        raise ToolError(f"cannot evaluate {expression!r}: use numbers, + - * / and ()") from exc
    if not math.isfinite(value):
        raise ToolError("the result is too large")
    return value


def _eval(node: ast.expr) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        if isinstance(node.value, bool):
            raise ValueError("not a number")
        return float(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.left), _eval(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.operand))
    raise ValueError("unsupported expression")
