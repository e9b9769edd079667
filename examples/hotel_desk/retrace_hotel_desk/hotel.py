"""The hotel: its rooms, its reservations, and the front-desk tools an agent works with."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any, Literal

from shared.envs.kit import ToolError

Kind = Literal["single", "double", "suite"]
TAX = 0.12
MAX_NIGHTS = 14


@dataclass(frozen=True)
class Room:
    id: str
    kind: Kind
    view: Literal["garden", "sea"]
    rate: int
    """Per night, in euros."""
    accessible: bool


ROOMS: tuple[Room, ...] = (
    Room("101", "single", "garden", 78, True),
    Room("102", "single", "garden", 82, False),
    Room("103", "double", "garden", 110, True),
    Room("104", "double", "garden", 118, False),
    Room("105", "double", "garden", 124, False),
    Room("201", "single", "sea", 96, False),
    Room("202", "double", "sea", 142, False),
    Room("203", "double", "sea", 151, True),
    Room("204", "suite", "sea", 260, False),
    Room("301", "suite", "sea", 285, True),
    Room("302", "double", "sea", 139, False),
    Room("303", "single", "sea", 99, True),
)


@dataclass
class Reservation:
    id: str
    guest: str
    room_id: str
    check_in: dt.date
    nights: int
    status: Literal["booked", "cancelled"] = "booked"

    @property
    def check_out(self) -> dt.date:
        return self.check_in + dt.timedelta(days=self.nights)

    def overlaps(self, check_in: dt.date, nights: int) -> bool:
        return (
            self.status == "booked"
            and self.check_in < check_in + dt.timedelta(days=nights)
            and check_in < self.check_out
        )

    def view(self, rooms: dict[str, Room]) -> dict[str, Any]:
        room = rooms[self.room_id]
        return {
            "reservation_id": self.id,
            "guest": self.guest,
            "room_id": self.room_id,
            "room_kind": room.kind,
            "check_in": self.check_in.isoformat(),
            "check_out": self.check_out.isoformat(),
            "nights": self.nights,
            "status": self.status,
        }


@dataclass
class Hotel:
    today: dt.date
    rooms: dict[str, Room] = field(default_factory=lambda: {r.id: r for r in ROOMS})
    reservations: dict[str, Reservation] = field(default_factory=dict)
    next_number: int = 4100
    expected: dict[str, Any] = field(default_factory=dict)
    """The answer key the reward reads, set when the episode starts (never shown to the agent)."""

    def free(self, room_id: str, check_in: dt.date, nights: int, ignore: str = "") -> bool:
        return not any(
            r.room_id == room_id and r.id != ignore and r.overlaps(check_in, nights)
            for r in self.reservations.values()
        )

    def add(self, guest: str, room_id: str, check_in: dt.date, nights: int) -> Reservation:
        self.next_number += 1
        reservation = Reservation(f"R{self.next_number}", guest, room_id, check_in, nights)
        self.reservations[reservation.id] = reservation
        return reservation


# -- tools: what the front-desk agent can do ---------------------------------------------------
def search_rooms(
    hotel: Hotel,
    check_in: str,
    nights: int,
    kind: Kind | None = None,
    accessible: bool | None = None,
) -> list[dict[str, Any]]:
    """List the rooms free for a stay, cheapest first, with the price of the whole stay.

    Args:
        check_in: Arrival date, YYYY-MM-DD.
        nights: Number of nights, 1 to 14.
        kind: Only rooms of this kind.
        accessible: true for wheelchair-accessible rooms only.
    """
    start = _date(check_in, hotel)
    _nights(nights)
    rooms = [
        room
        for room in hotel.rooms.values()
        if (kind is None or room.kind == kind)
        and (accessible is None or room.accessible == accessible)
        and hotel.free(room.id, start, nights)
    ]
    return [
        {
            "room_id": room.id,
            "kind": room.kind,
            "view": room.view,
            "accessible": room.accessible,
            "nightly_rate": room.rate,
            "stay_total_before_tax": room.rate * nights,
        }
        for room in sorted(rooms, key=lambda r: (r.rate, r.id))
    ]


def book_room(hotel: Hotel, guest: str, room_id: str, check_in: str, nights: int) -> dict[str, Any]:
    """Book a room for a guest.

    Args:
        guest: The guest's full name.
        room_id: The room to book, as search_rooms lists it.
        check_in: Arrival date, YYYY-MM-DD.
        nights: Number of nights, 1 to 14.
    """
    start = _date(check_in, hotel)
    _nights(nights)
    if room_id not in hotel.rooms:
        raise ToolError(f"there is no room {room_id!r}")
    if not guest.strip():
        raise ToolError("the guest's name is required")
    if not hotel.free(room_id, start, nights):
        raise ToolError(f"room {room_id} is not free for {nights} nights from {check_in}")
    return hotel.add(guest.strip(), room_id, start, nights).view(hotel.rooms)


def find_reservations(hotel: Hotel, guest: str) -> list[dict[str, Any]]:
    """Find a guest's reservations, cancelled ones included.

    Args:
        guest: The guest's full name (case does not matter).
    """
    wanted = " ".join(guest.lower().split())
    return [
        r.view(hotel.rooms)
        for r in hotel.reservations.values()
        if " ".join(r.guest.lower().split()) == wanted
    ]


def cancel_reservation(hotel: Hotel, reservation_id: str) -> dict[str, Any]:
    """Cancel a reservation.

    Args:
        reservation_id: The reservation's id, e.g. R4101.
    """
    reservation = _reservation(hotel, reservation_id)
    if reservation.status == "cancelled":
        raise ToolError(f"reservation {reservation_id} is already cancelled")
    reservation.status = "cancelled"
    return reservation.view(hotel.rooms)


def change_dates(hotel: Hotel, reservation_id: str, check_in: str, nights: int) -> dict[str, Any]:
    """Move a reservation to new dates in the same room.

    Args:
        reservation_id: The reservation's id, e.g. R4101.
        check_in: The new arrival date, YYYY-MM-DD.
        nights: The new number of nights, 1 to 14.
    """
    reservation = _reservation(hotel, reservation_id)
    if reservation.status == "cancelled":
        raise ToolError(f"reservation {reservation_id} is cancelled")
    start = _date(check_in, hotel)
    _nights(nights)
    if not hotel.free(reservation.room_id, start, nights, ignore=reservation.id):
        raise ToolError(
            f"room {reservation.room_id} is not free for {nights} nights from {check_in}"
        )
    reservation.check_in, reservation.nights = start, nights
    return reservation.view(hotel.rooms)


def get_bill(hotel: Hotel, reservation_id: str) -> dict[str, Any]:
    """The bill of a reservation: nightly rate, nights, tax and the total to pay.

    Args:
        reservation_id: The reservation's id, e.g. R4101.
    """
    reservation = _reservation(hotel, reservation_id)
    if reservation.status == "cancelled":
        raise ToolError(f"reservation {reservation_id} is cancelled: nothing to pay")
    return {"reservation_id": reservation.id, **bill(hotel, reservation)}


def bill(hotel: Hotel, reservation: Reservation) -> dict[str, Any]:
    rate = hotel.rooms[reservation.room_id].rate
    subtotal = rate * reservation.nights
    tax = round(subtotal * TAX, 2)
    return {
        "nightly_rate": rate,
        "nights": reservation.nights,
        "subtotal": subtotal,
        "tax": tax,
        "total": round(subtotal + tax, 2),
    }


TOOLS = (search_rooms, book_room, find_reservations, cancel_reservation, change_dates, get_bill)


def _date(text: str, hotel: Hotel) -> dt.date:
    try:
        day = dt.date.fromisoformat(text)
    except ValueError:
        raise ToolError(f"{text!r} is not a date; write it as YYYY-MM-DD") from None
    if day < hotel.today:
        raise ToolError(f"{text} is in the past (today is {hotel.today.isoformat()})")
    return day


def _nights(nights: int) -> None:
    if not 1 <= nights <= MAX_NIGHTS:
        raise ToolError(f"nights must be between 1 and {MAX_NIGHTS}, got {nights}")


def _reservation(hotel: Hotel, reservation_id: str) -> Reservation:
    reservation = hotel.reservations.get(reservation_id.strip().upper())
    if reservation is None:
        raise ToolError(f"there is no reservation {reservation_id!r}; find_reservations lists them")
    return reservation
