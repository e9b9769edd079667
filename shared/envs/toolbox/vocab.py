"""Fixed word lists the toolbox world and its tasks are drawn from (no external data).

Most lists come in two disjoint pools: `TASK_*` values appear only in a task's own fixture
(the people, labels and cities a request talks about), `BACKGROUND_*` values only in the
seeded filler around it. A request that names "Chiara" or "my sister" or "Lisbon" therefore
matches exactly the entity the task put there, whatever the episode seed adds.
"""

from __future__ import annotations

from typing import Any

TASK_FIRST_NAMES = (
    "Amara", "Bruno", "Chiara", "Dmitri", "Elif", "Farah", "Goran", "Hiroshi", "Ingrid",
    "Jamal", "Keiko", "Lorenzo", "Mireille", "Nikhil", "Olga", "Priya", "Quentin", "Rafael",
    "Sofia", "Tomasz", "Ulrike", "Valentina", "Wendell", "Ximena", "Yusuf", "Zainab",
)  # fmt: skip
BACKGROUND_FIRST_NAMES = (
    "Aaron", "Beatriz", "Carmen", "Derek", "Esther", "Felix", "Gloria", "Hector", "Irene",
    "Jonas", "Karen", "Marta", "Noel", "Oscar", "Paula", "Rosa", "Simon", "Tessa", "Victor",
    "Wanda", "Yvonne",
)  # fmt: skip
LAST_NAMES = (
    "Abara", "Becker", "Castillo", "Dubois", "Eriksen", "Fontaine", "Haddad", "Ivanova",
    "Jensen", "Kowalski", "Lindqvist", "Moreau", "Nakamura", "Okafor", "Petrov", "Quispe",
    "Rossi", "Silva", "Tanaka", "Urquhart", "Varga", "Weber", "Yilmaz", "Zhang",
)  # fmt: skip

TASK_RELATIONS = ("mother", "father", "sister", "brother", "partner", "boss", "doctor")
BACKGROUND_RELATIONS = ("friend", "coworker", "neighbor")
RELATIONS = TASK_RELATIONS + BACKGROUND_RELATIONS

TASK_ALARM_LABELS = (
    "Gym", "Meditation", "Take medication", "Pick up kids", "Water the plants", "Stand-up",
    "Bake bread", "Run", "Yoga", "Feed the cat", "Piano practice", "Laundry",
)  # fmt: skip
BACKGROUND_ALARM_LABELS = ("Wake up", "Alarm", "Weekday", "Nap", "Bedtime")

TASK_EVENT_TITLES = (
    "Dentist appointment", "Team offsite", "Parent-teacher meeting", "Haircut",
    "Book club", "Car service", "Tennis lesson", "Budget review", "Vet visit",
    "Guitar lesson", "Lunch with investors", "Eye exam", "Pottery class", "Interview",
)  # fmt: skip
BACKGROUND_EVENT_TITLES = (
    "Weekly sync",
    "Flight",
    "Birthday party",
    "Conference call",
    "Workshop",
    "Concert",
)

TASK_CHORES = (
    ("pay the electricity bill", "electricity"),
    ("renew my passport", "passport"),
    ("call the plumber", "plumber"),
    ("buy a birthday gift for grandma", "gift"),
    ("return the library books", "library"),
    ("book a table for Saturday", "table"),
    ("submit the expense report", "expense"),
    ("pick up the dry cleaning", "dry cleaning"),
    ("order printer ink", "printer"),
    ("schedule a flu shot", "flu shot"),
    ("cancel the gym trial", "gym trial"),
    ("send the rent transfer", "rent"),
)
BACKGROUND_CHORES = (
    "check the mail",
    "clean the fridge",
    "update the budget sheet",
    "back up photos",
)

# (sentence the user wants sent, words the sent message must contain)
MESSAGE_BODIES = (
    ("I'm running about 15 minutes late", ("late",)),
    ("dinner is moved to 8 pm", ("dinner", "8")),
    ("the meeting is cancelled today", ("cancel",)),
    ("I left the keys with the neighbor", ("keys",)),
    ("can you pick up bread on the way home", ("bread",)),
    ("happy birthday, have a wonderful day", ("birthday",)),
    ("the package arrived this morning", ("package",)),
    ("I'll call you back after lunch", ("call", "lunch")),
    ("the train is delayed, see you at the station", ("train",)),
    ("don't forget the concert tickets", ("tickets",)),
    ("I booked the restaurant for Friday", ("restaurant", "friday")),
    ("thanks for the flowers", ("flowers",)),
)
BACKGROUND_MESSAGES = (
    "See you tomorrow!", "Ok, sounds good.", "Did you get my email?", "Call me when you can.",
    "Thanks!", "On my way.", "Let's catch up soon.",
)  # fmt: skip
# Inbox messages a report task asks about: (body, a word the answer must contain)
INBOX_FACTS = (
    ("The spare key is under the blue flowerpot.", "flowerpot"),
    ("My new address is 12 Harbour Street.", "Harbour"),
    ("The wifi password is sunflower42.", "sunflower42"),
    ("Our flight lands at gate B17.", "B17"),
    ("I left your umbrella at the reception.", "umbrella"),
    ("The booking reference is QX7TZ.", "QX7TZ"),
    ("Bring the red folder to the meeting.", "folder"),
    ("Parking is on level 4.", "level 4"),
)

TASK_NOTE_TOPICS = (
    ("Groceries", "eggs, flour, spinach and oat milk"),
    ("Gift ideas", "a scarf for Mom and a puzzle for Leo"),
    ("Packing list", "charger, passport, sunscreen"),
    ("Book list", "Dune, Middlemarch, The Overstory"),
    ("Garden", "plant tomatoes in April"),
    ("Wifi guest", "network Lighthouse, password tidepool9"),
    ("Recipe", "two cups of rice, three of water"),
    ("Car", "next oil change at 60000 km"),
)
BACKGROUND_NOTE_TOPICS = (("Ideas", "start a podcast"), ("Todo", "fix the bike"), ("Misc", "..."))

TASK_CITIES = (
    "Lisbon", "Nairobi", "Oslo", "Kyoto", "Lima", "Tunis", "Hanoi", "Quito", "Tallinn",
    "Dakar", "Reykjavik", "Montevideo", "Valletta", "Kathmandu",
)  # fmt: skip
BACKGROUND_CITIES = ("Berlin", "Madrid", "Toronto", "Sydney", "Chicago", "Mumbai", "Cairo")
# condition -> words a reply may use for it
WEATHER_CONDITIONS: dict[str, tuple[str, ...]] = {
    "sunny": ("sunny", "sun", "sunshine", "clear"),
    "cloudy": ("cloudy", "clouds", "overcast"),
    "rainy": ("rainy", "rain", "raining"),
    "windy": ("windy", "wind"),
    "foggy": ("foggy", "fog"),
    "snowing": ("snowing", "snow", "snowy"),
    "stormy": ("stormy", "storm", "storms", "thunderstorm"),
}

# Units of each currency per 1 USD (a plausible level; worlds jitter around it)
CURRENCIES: dict[str, tuple[str, float]] = {
    "USD": ("US dollars", 1.0),
    "EUR": ("euros", 0.92),
    "GBP": ("British pounds", 0.79),
    "JPY": ("Japanese yen", 149.5),
    "CHF": ("Swiss francs", 0.88),
    "CAD": ("Canadian dollars", 1.36),
    "AUD": ("Australian dollars", 1.52),
    "MXN": ("Mexican pesos", 17.1),
    "BRL": ("Brazilian reais", 4.95),
    "INR": ("Indian rupees", 83.2),
    "SEK": ("Swedish kronor", 10.4),
    "ZAR": ("South African rand", 18.7),
}
UNSUPPORTED_CURRENCIES = (
    "Bitcoin", "Dogecoin", "Argentine pesos", "Nigerian naira", "Vietnamese dong",
    "Icelandic kronur", "Ethereum",
)  # fmt: skip

# name -> its type (bool, int with a range, or enum with values) and how a user says it
SETTINGS: dict[str, dict[str, Any]] = {
    "wifi": {"type": "bool", "phrase": "Wi-Fi"},
    "bluetooth": {"type": "bool", "phrase": "Bluetooth"},
    "do_not_disturb": {"type": "bool", "phrase": "Do Not Disturb"},
    "location_services": {"type": "bool", "phrase": "location services"},
    "dark_mode": {"type": "bool", "phrase": "dark mode"},
    "low_power_mode": {"type": "bool", "phrase": "low power mode"},
    "brightness": {"type": "int", "min": 0, "max": 100, "phrase": "screen brightness"},
    "volume": {"type": "int", "min": 0, "max": 100, "phrase": "volume"},
    "ringtone": {
        "type": "enum",
        "values": ["Chimes", "Marimba", "Radar", "Signal", "Beacon"],
        "phrase": "ringtone",
    },
}
BOOL_SETTINGS = tuple(k for k, v in SETTINGS.items() if v["type"] == "bool")
LEVEL_SETTINGS = tuple(k for k, v in SETTINGS.items() if v["type"] == "int")

# Requests no tool can serve (the right answer is to say so)
UNSUPPORTED_REQUESTS = (
    "Order me a large pepperoni pizza.",
    "Book me a taxi to the airport.",
    "Play some jazz on the living room speaker.",
    "Post my last photo on Instagram.",
    "Turn on the flashlight.",
    "Turn on my mobile hotspot.",
    "Change my wallpaper to the beach photo.",
    "Transfer 50 dollars to my savings account.",
    "Lock the front door.",
    "Translate my last note into German and print it.",
)
UNSUPPORTED_WITH_CONTACT = (
    "Call {name} right now.",
    "Email {name} my packing list.",
    "Start a video call with {name}.",
    "Share my live location with {name}.",
)
