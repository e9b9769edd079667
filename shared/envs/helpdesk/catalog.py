"""Fixed word lists and the product catalog the seeded database draws from (no external data)."""

from __future__ import annotations

FIRST_NAMES: tuple[str, ...] = (
    "Mia", "Liam", "Olivia", "Noah", "Emma", "Ethan", "Ava", "Lucas", "Sofia", "Mason",
    "Isabella", "Yusuf", "Amelia", "Mateo", "Harper", "Omar", "Chloe", "Daniel", "Aisha", "James",
    "Mei", "Ivan", "Priya", "Jonas", "Fatima", "Leo", "Nora", "Hiro", "Elena", "Samuel",
)  # fmt: skip

LAST_NAMES: tuple[str, ...] = (
    "Garcia", "Smith", "Kim", "Nguyen", "Patel", "Johnson", "Lopez", "Muller", "Rossi", "Silva",
    "Brown", "Khan", "Ito", "Novak", "Davis", "Moreau", "Wilson", "Ahmed", "Costa", "Jensen",
    "Taylor", "Chen", "Kowalski", "Okafor", "Haddad", "Larsen", "Romero", "Sato", "Fischer", "Cho",
)  # fmt: skip

STREET_NAMES: tuple[str, ...] = (
    "Oak Street", "Maple Avenue", "Cedar Lane", "Pine Road", "Elm Street", "Willow Way",
    "Lakeview Drive", "Hillcrest Road", "Sunset Boulevard", "River Road", "Park Avenue",
    "Chestnut Street", "Birch Court", "Highland Avenue", "Meadow Lane", "Spruce Street",
)  # fmt: skip

CITIES: tuple[tuple[str, str], ...] = (
    ("Springfield", "IL"), ("Portland", "OR"), ("Austin", "TX"), ("Denver", "CO"),
    ("Madison", "WI"), ("Raleigh", "NC"), ("Boise", "ID"), ("Tucson", "AZ"),
    ("Albany", "NY"), ("Columbus", "OH"), ("Richmond", "VA"), ("Omaha", "NE"),
)  # fmt: skip

CARD_BRANDS: tuple[str, ...] = ("visa", "mastercard", "amex")

PRODUCTS: tuple[tuple[str, float, dict[str, tuple[str, ...]]], ...] = (
    ("T-Shirt", 24.0, {"color": ("black", "white", "blue", "red"), "size": ("S", "M", "L", "XL")}),
    ("Running Shoes", 95.0, {"color": ("black", "white", "grey"), "size": ("8", "9", "10", "11")}),
    ("Backpack", 60.0, {"color": ("black", "green", "navy"), "capacity": ("20L", "30L")}),
    (
        "Water Bottle",
        18.0,
        {"capacity": ("500ml", "750ml", "1L"), "color": ("steel", "blue", "pink")},
    ),
    ("Desk Lamp", 45.0, {"color": ("black", "white", "silver"), "bulb": ("LED", "halogen")}),
    (
        "Headphones",
        120.0,
        {"color": ("black", "white", "red"), "connection": ("wired", "wireless")},
    ),
    (
        "Coffee Maker",
        80.0,
        {"capacity": ("4 cups", "8 cups", "12 cups"), "color": ("black", "steel")},
    ),
    ("Yoga Mat", 30.0, {"thickness": ("4mm", "6mm", "8mm"), "color": ("purple", "blue", "black")}),
    ("Wall Clock", 35.0, {"style": ("modern", "classic"), "color": ("black", "white", "wood")}),
    ("Sunglasses", 70.0, {"frame": ("metal", "plastic"), "lens": ("polarized", "standard")}),
    ("Hoodie", 55.0, {"color": ("grey", "black", "navy"), "size": ("S", "M", "L", "XL")}),
    ("Phone Case", 20.0, {"model": ("A12", "A13", "B5"), "color": ("clear", "black", "blue")}),
)
"""(name, base price, option name -> values); every combination of options is one variant."""
