"""The helpdesk database: customers, products with variants and orders, generated from a seed.

`generate(seed)` is deterministic (one `random.Random(seed)`, fixed lists from `catalog`); the
state is plain dataclasses, so `copy.deepcopy` works and `snapshot()` gives JSON-able data whose
`digest()` is stable across processes.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import random
from dataclasses import dataclass, field, replace
from datetime import date, timedelta
from typing import Any

import msgspec

from shared.envs.helpdesk.catalog import (
    CARD_BRANDS,
    CITIES,
    FIRST_NAMES,
    LAST_NAMES,
    PRODUCTS,
    STREET_NAMES,
)

STATUSES = ("pending", "processing", "shipped", "delivered", "cancelled")
CANCEL_REASONS = ("no longer needed", "ordered by mistake")
_STATUS_WEIGHTS = (25, 15, 15, 35, 10)


@dataclass
class Address:
    street: str
    city: str
    state: str
    zip: str

    def line(self) -> str:
        return f"{self.street}, {self.city}, {self.state} {self.zip}"


@dataclass
class PaymentMethod:
    id: str
    kind: str
    """credit_card, paypal or gift_card."""
    description: str


@dataclass
class Customer:
    id: str
    first_name: str
    last_name: str
    email: str
    addresses: list[Address]
    payment_methods: list[PaymentMethod]
    order_ids: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.first_name} {self.last_name}"

    @property
    def zip(self) -> str:
        """The zip code of the first (default) address: the one authentication uses."""
        return self.addresses[0].zip


@dataclass
class Variant:
    item_id: str
    options: dict[str, str]
    price: float
    available: bool


@dataclass
class Product:
    id: str
    name: str
    variants: list[Variant]

    def variant(self, item_id: str) -> Variant | None:
        return next((v for v in self.variants if v.item_id == item_id), None)


@dataclass
class OrderItem:
    item_id: str
    product_id: str
    name: str
    options: dict[str, str]
    price: float
    returned: bool = False

    def describe(self) -> str:
        return f"{self.name} ({options_text(self.options)})"


@dataclass
class Transaction:
    kind: str
    """refund or charge."""
    amount: float
    payment_method_id: str
    note: str


@dataclass
class Order:
    id: str
    customer_id: str
    status: str
    order_date: str
    items: list[OrderItem]
    payment_method_id: str
    address: Address
    delivered_date: str | None = None
    tracking_number: str | None = None
    cancel_reason: str | None = None
    transactions: list[Transaction] = field(default_factory=list)

    def total(self) -> float:
        return round(sum(i.price for i in self.items), 2)


@dataclass
class Database:
    today: str
    customers: dict[str, Customer]
    products: dict[str, Product]
    orders: dict[str, Order]

    def snapshot(self) -> dict[str, Any]:
        """The whole state as JSON-able builtins."""
        result: dict[str, Any] = msgspec.to_builtins(self)
        return result

    def digest(self) -> str:
        """sha256 of the state in canonical JSON (sorted keys): equal states, equal digests."""
        return hashlib.sha256(msgspec.json.encode(self, order="sorted")).hexdigest()

    def copy(self) -> Database:
        return copy.deepcopy(self)

    def customer_orders(self, customer_id: str) -> list[Order]:
        customer = self.customers[customer_id]
        return [self.orders[o] for o in customer.order_ids]


def options_text(options: dict[str, str]) -> str:
    """How people name a variant: "color black, size 10"."""
    return ", ".join(f"{k} {v}" for k, v in options.items())


def generate(seed: int) -> Database:
    """A fresh database for `seed`: the same seed always gives the same state."""
    rng = random.Random(seed)
    today = date(2024, 5, 1) + timedelta(days=rng.randrange(120))
    ids = _Ids(rng)
    products = [_product(rng, ids, *spec) for spec in PRODUCTS]
    names = rng.sample(list(itertools.product(FIRST_NAMES, LAST_NAMES)), 24)
    customers = [_customer(rng, ids, first, last) for first, last in names]
    orders: dict[str, Order] = {}
    for customer in customers:
        for _ in range(rng.randint(2, 5)):
            order = _order(rng, ids, customer, products, today)
            orders[order.id] = order
            customer.order_ids.append(order.id)
    return Database(
        today=today.isoformat(),
        customers={c.id: c for c in customers},
        products={p.id: p for p in products},
        orders=orders,
    )


def diff(before: Any, after: Any, path: str = "") -> list[dict[str, Any]]:
    """Leaf-level differences between two snapshots: `[{path, before, after}]`, in path order.

    Only unequal branches are walked, so comparing two large, nearly equal states is cheap.
    """
    if before == after:
        return []
    if isinstance(before, dict) and isinstance(after, dict):
        keys = sorted(set(before) | set(after), key=str)
        pairs = [(k, before.get(k), after.get(k)) for k in keys]
    elif isinstance(before, list) and isinstance(after, list):
        n = max(len(before), len(after))
        pairs = [(k, _at(before, k), _at(after, k)) for k in range(n)]
    else:
        return [{"path": path, "before": before, "after": after}]
    out: list[dict[str, Any]] = []
    for key, a, b in pairs:
        out.extend(diff(a, b, f"{path}.{key}" if path else str(key)))
    return out


def _at(values: list[Any], index: int) -> Any:
    return values[index] if index < len(values) else None


class _Ids:
    """Unique random digit strings, so no two generated ids ever collide."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng
        self._seen: set[str] = set()

    def digits(self, n: int) -> str:
        while True:
            value = str(self._rng.randrange(10 ** (n - 1), 10**n))
            if value not in self._seen:
                self._seen.add(value)
                return value


def _product(
    rng: random.Random, ids: _Ids, name: str, base: float, options: dict[str, tuple[str, ...]]
) -> Product:
    keys = list(options)
    variants = []
    for combo in itertools.product(*(options[k] for k in keys)):
        price = round(base * rng.uniform(0.85, 1.15), 2)
        opts = dict(zip(keys, combo, strict=True))
        variants.append(Variant(ids.digits(10), opts, price, rng.random() < 0.75))
    return Product(ids.digits(10), name, variants)


def random_address(rng: random.Random) -> Address:
    city, state = rng.choice(CITIES)
    street = f"{rng.randint(1, 9999)} {rng.choice(STREET_NAMES)}"
    return Address(street, city, state, f"{rng.randint(10000, 99999)}")


def _customer(rng: random.Random, ids: _Ids, first: str, last: str) -> Customer:
    addresses = [random_address(rng) for _ in range(rng.randint(1, 2))]
    methods = []
    for kind in rng.sample(("credit_card", "paypal", "gift_card"), rng.randint(1, 3)):
        number = ids.digits(7)
        if kind == "credit_card":
            desc = f"{rng.choice(CARD_BRANDS)} ending in {number[-4:]}"
        elif kind == "paypal":
            desc = "paypal account"
        else:
            desc = f"gift card ending in {number[-4:]}"
        methods.append(PaymentMethod(f"{kind}_{number}", kind, desc))
    email = f"{first.lower()}.{last.lower()}{rng.randint(10, 99)}@example.com"
    cid = f"{first.lower()}_{last.lower()}_{ids.digits(4)}"
    return Customer(cid, first, last, email, addresses, methods)


def _order(
    rng: random.Random, ids: _Ids, customer: Customer, products: list[Product], today: date
) -> Order:
    status = rng.choices(STATUSES, weights=_STATUS_WEIGHTS)[0]
    items = []
    for product in rng.sample(products, rng.randint(1, 4)):
        v = rng.choice(product.variants)
        items.append(OrderItem(v.item_id, product.id, product.name, dict(v.options), v.price))
    order = Order(
        id=f"W{ids.digits(7)}",
        customer_id=customer.id,
        status=status,
        order_date="",
        items=items,
        payment_method_id=rng.choice(customer.payment_methods).id,
        address=replace(rng.choice(customer.addresses)),
    )
    ago = {"pending": (0, 2), "processing": (1, 4), "shipped": (3, 8), "cancelled": (5, 60)}
    if status == "delivered":
        delivered = today - timedelta(days=rng.randint(1, 90))
        order.delivered_date = delivered.isoformat()
        order.order_date = (delivered - timedelta(days=rng.randint(2, 7))).isoformat()
    else:
        low, high = ago[status]
        order.order_date = (today - timedelta(days=rng.randint(low, high))).isoformat()
    if status in ("shipped", "delivered"):
        order.tracking_number = ids.digits(12)
    if status == "cancelled":
        order.cancel_reason = rng.choice(CANCEL_REASONS)
    return order
