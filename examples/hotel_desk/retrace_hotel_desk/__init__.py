"""A worked retrace plug-in environment: a hotel's front desk (docs/environments.md)."""

from retrace_hotel_desk.env import HotelDesk

__all__ = ["HotelDesk"]
