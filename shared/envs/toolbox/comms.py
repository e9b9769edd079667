"""Contact and messaging tools: search/get/add/update contacts, send and search text messages."""

from __future__ import annotations

import re
from dataclasses import asdict
from typing import Any

from shared.envs.toolbox import vocab
from shared.envs.toolbox.clock import fmt_moment
from shared.envs.toolbox.params import enum, integer, params, string
from shared.envs.toolbox.world import Contact, TextMessage, World
from shared.envs.tools import Tool, ToolError

_PHONE = re.compile(r"^\+[1-9]\d{7,14}$")
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[A-Za-z]{2,}$")
_PHONE_HELP = "use the international format +<country code><number>, e.g. +14155550134"


def normalize_phone(text: str) -> str:
    """`+1 (415) 555-0134` -> `+14155550134`; anything else is a `ToolError`."""
    compact = re.sub(r"[\s().\-]", "", text)
    if not _PHONE.match(compact):
        raise ToolError(f"invalid phone number {text!r}: {_PHONE_HELP}")
    return compact


def comms_tools(world: World) -> list[Tool]:
    def contact_or_error(contact_id: str) -> Contact:
        contact = world.contacts.get(contact_id)
        if contact is None:
            raise ToolError(f"no contact with id {contact_id!r}; use search_contacts to find ids")
        return contact

    def check_email(email: str) -> str:
        if not _EMAIL.match(email.strip()):
            raise ToolError(f"invalid email address {email!r}")
        return email.strip()

    def check_phone_free(phone: str, contact_id: str | None = None) -> None:
        owner = world.contact_by_phone(phone)
        if owner is not None and owner.id != contact_id:
            raise ToolError(f"{phone} already belongs to {owner.name} ({owner.id})")

    def search_contacts(query: str = "", relation: str | None = None) -> list[dict[str, Any]]:
        needle = query.strip().lower()
        digits = re.sub(r"\D", "", needle)
        found = []
        for contact in world.contacts.values():
            text = f"{contact.name} {contact.email or ''}".lower()
            hit = needle in text or (len(digits) >= 4 and digits in contact.phone)
            if hit and (relation is None or contact.relation == relation):
                found.append(asdict(contact))
        return sorted(found, key=lambda c: c["name"])

    def get_contact(contact_id: str) -> dict[str, Any]:
        return asdict(contact_or_error(contact_id))

    def add_contact(
        name: str, phone: str, email: str | None = None, relation: str | None = None
    ) -> dict[str, Any]:
        if not name.strip():
            raise ToolError("name must not be empty")
        number = normalize_phone(phone)
        check_phone_free(number)
        address = check_email(email) if email is not None else None
        contact = Contact(world.new_id("contact"), name.strip(), number, address, relation)
        world.contacts[contact.id] = contact
        return asdict(contact)

    def update_contact(
        contact_id: str,
        name: str | None = None,
        phone: str | None = None,
        email: str | None = None,
        relation: str | None = None,
    ) -> dict[str, Any]:
        contact = contact_or_error(contact_id)
        if name is None and phone is None and email is None and relation is None:
            raise ToolError("nothing to update: give at least one of name, phone, email, relation")
        if name is not None and not name.strip():
            raise ToolError("name must not be empty")
        number = normalize_phone(phone) if phone is not None else contact.phone
        check_phone_free(number, contact.id)
        contact.email = check_email(email) if email is not None else contact.email
        contact.name = name.strip() if name is not None else contact.name
        contact.phone = number
        contact.relation = relation if relation is not None else contact.relation
        return asdict(contact)

    def send_message(phone_number: str, body: str) -> dict[str, Any]:
        number = normalize_phone(phone_number)
        if not body.strip():
            raise ToolError("body must not be empty")
        message = TextMessage(world.new_id("msg"), "outbox", number, body, fmt_moment(world.now))
        world.messages[message.id] = message
        return {**_message_view(world, message), "status": "sent"}

    def search_messages(
        contact_id: str | None = None, query: str = "", direction: str = "any", limit: int = 10
    ) -> list[dict[str, Any]]:
        phone = contact_or_error(contact_id).phone if contact_id is not None else None
        needle = query.strip().lower()
        found = [
            m
            for m in world.messages.values()
            if (phone is None or m.phone == phone)
            and (direction == "any" or m.direction == direction)
            and needle in m.body.lower()
        ]
        found.sort(key=lambda m: (m.time, m.id), reverse=True)
        return [_message_view(world, m) for m in found[:limit]]

    relation = enum("Relationship to the user.", vocab.RELATIONS)
    return [
        Tool(
            "search_contacts",
            "Find contacts whose name or email contains `query` (or whose number contains its "
            "digits), optionally only those with a given relation. Empty query lists all.",
            params(query=string("Text to look for."), relation=relation),
            search_contacts,
        ),
        Tool(
            "get_contact",
            "Get one contact's full record by id.",
            params(["contact_id"], contact_id=string("Contact id, e.g. contact-123.")),
            get_contact,
        ),
        Tool(
            "add_contact",
            "Create a new contact.",
            params(
                ["name", "phone"],
                name=string("Full name."),
                phone=string("Phone number in international format, e.g. +14155550134."),
                email=string("Email address."),
                relation=relation,
            ),
            add_contact,
        ),
        Tool(
            "update_contact",
            "Change fields of an existing contact; fields left out stay as they are.",
            params(
                ["contact_id"],
                contact_id=string("Contact id."),
                name=string("New full name."),
                phone=string("New phone number, international format."),
                email=string("New email address."),
                relation=relation,
            ),
            update_contact,
        ),
        Tool(
            "send_message",
            "Send a text message to a phone number (international format, e.g. +14155550134).",
            params(
                ["phone_number", "body"],
                phone_number=string("Recipient's number."),
                body=string("Message text."),
            ),
            send_message,
        ),
        Tool(
            "search_messages",
            "Search sent and received text messages, newest first.",
            params(
                contact_id=string("Only messages with this contact."),
                query=string("Text the message body must contain."),
                direction=enum("inbox = received, outbox = sent.", ["inbox", "outbox", "any"]),
                limit=integer("Most messages to return.", 1, 50),
            ),
            search_messages,
        ),
    ]


def _message_view(world: World, message: TextMessage) -> dict[str, Any]:
    contact = world.contact_by_phone(message.phone)
    return {
        **asdict(message),
        "contact_id": contact.id if contact else None,
        "contact_name": contact.name if contact else None,
    }
