"""The scripted helpdesk user: deterministic, rule-based, driven by the task's facts.

The user opens with its request (`user.openings[seed % n]`; topics named there count as given)
and then reads each assistant text (texts sent alongside tool calls are not shown to it). Rules,
first match wins:

1. Goal met -> thanks, done. A write goal is met once a write tool of the requested kind has
   succeeded on the requested order (the simulation reads the tool records, as a person reads
   the agent's report); an information goal once every required fact appeared in the texts.
2. Past `MAX_TURNS` replies -> gives up, done.
3. A question asks for something the user has not given yet -> answers it. Questions are the
   sentences ending in "?" or opening with a request ("please", "could you", ...); topics are
   found by keywords: email; name/zip; identity in general (answered with the user's preferred
   way, `user.auth`); order id/number; reason/why; which item(s); (shipping) address; size, color,
   option or variant. Several topics asked at once are answered together; a user who forgot its
   email gives name and zip instead.
4. A confirmation request (a question with "confirm", "proceed", "shall I", "would you like me
   to", ...): an offer to transfer is accepted only when refusing is right for the task; otherwise
   "yes" when the text names the requested kind of action (cancel, return, exchange, address),
   mentions no order id but the requested one and mentions every `request.must_mention`
   string; "no" with the request restated when it names a different action.
5. A question about something already given -> answers it again.
6. A refusal ("cannot", "unable", "unfortunately", ...) -> done when the task expects one
   (`request.accepts_refusal`); otherwise insists once, then gives up, done.
7. Any other question -> "not sure" plus the request, at most `MAX_UNKNOWN` times, then done.
8. A statement with nothing to answer -> restates the request, at most `MAX_RESTATE` times, then
   done (the agent's final text with nothing left to ask ends the conversation).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shared.envs.helpdesk.text import contains, normalize, order_ids, questions
from shared.envs.tools import CallRecord

MAX_TURNS = 15
MAX_UNKNOWN = 3
MAX_RESTATE = 2

ACTION_TOOLS = {
    "cancel": "cancel_pending_order",
    "address": "modify_pending_order_address",
    "exchange": "exchange_pending_order_items",
    "return": "return_delivered_order_items",
}
_ACTION_WORDS = {
    "cancel": ("cancel",),
    "address": ("address",),
    "exchange": ("exchange", "swap"),
    "return": ("return",),
}
_TOPIC_WORDS = {
    "email": ("email", "e-mail"),
    "name_zip": ("zip", "postal", "full name", "your name", "first name", "last name"),
    "identity": ("verify", "identity", "authenticate", "identify", "look up your account",
                 "locate your account", "find your account"),
    "order_id": ("order id", "order number", "order #", "which order", "order's id"),
    "reason": ("reason", "why"),
    "items": ("which item", "what item", "which product", "which of the items"),
    "address": ("address",),
    "variant": ("size", "color", "colour", "variant", "option", "instead"),
}  # fmt: skip
_AUTH = ("email", "name_zip", "identity")
_CONFIRM = ("confirm", "proceed", "shall i", "should i", "would you like me to",
            "do you want me to", "go ahead", "yes/no", "yes or no", "is that correct",
            "is this correct", "okay to", "ok to")  # fmt: skip
_REFUSAL = ("cannot", "can't", "can not", "unable", "not able", "not possible", "not eligible",
            "not allowed", "unfortunately", "sorry, but", "not associated", "i'm afraid",
            "won't be able")  # fmt: skip

THANKS = "Great, that's all I needed. Thank you!"
GIVE_UP = "This is taking too long. I'll try again later. Goodbye."
ACCEPT = "I see. Thanks for explaining. Goodbye."
YES = "Yes, please go ahead."
YES_TRANSFER = "Yes, please transfer me."


class ScriptedUser:
    """One user for one episode; `reply` is called with each assistant text."""

    def __init__(self, data: dict[str, Any], seed: int) -> None:
        self._user: dict[str, Any] = data["user"]
        self._request: dict[str, Any] = data["request"]
        self._communicate: list[str] = list(data.get("communicate", []))
        openings: list[str] = self._user["openings"]
        self.opening = openings[seed % len(openings)]
        self.done = False
        self._given: set[str] = set(self._user.get("volunteered", []))
        self._heard: list[str] = []
        self._turns = self._unknown = self._restated = self._refusals = 0

    def reply(self, text: str, calls: Sequence[CallRecord]) -> tuple[str, bool]:
        """The user's answer to one assistant text, and whether the conversation is over."""
        if self.done:
            return "", True
        self._turns += 1
        self._heard.append(text)
        if self._goal_met(calls):
            return self._end(THANKS)
        if self._turns > MAX_TURNS:
            return self._end(GIVE_UP)
        asked = self._asked(text)
        fresh = [t for t in asked if t not in self._given]
        if fresh:
            return self._answer(fresh), False
        verdict = self._confirmation(text)
        if verdict is not None:
            return verdict, False
        if asked:
            return self._answer(asked), False
        if any(w in normalize(text) for w in _REFUSAL):
            return self._refused()
        if questions(text):
            self._unknown += 1
            if self._unknown > MAX_UNKNOWN:
                return self._end(GIVE_UP)
            return f"I'm not sure what you mean. {self._request['text']}", False
        self._restated += 1
        if self._restated > MAX_RESTATE:
            return self._end("Okay. Goodbye.")
        return f"Okay. To be clear: {self._request['text']}", False

    # rules

    def _goal_met(self, calls: Sequence[CallRecord]) -> bool:
        action = self._request["action"]
        if action == "info":
            said = " ".join(self._heard)
            return all(contains(said, s) for s in self._communicate)
        tool = ACTION_TOOLS[action]
        return any(
            c.ok
            and c.name == tool
            and (c.arguments or {}).get("order_id") == self._request["order_id"]
            for c in calls
        )

    def _asked(self, text: str) -> list[str]:
        """The topics the text's questions ask about that this user can answer, in order."""
        replies = self._user["replies"]
        found: list[str] = []
        for q in questions(text):
            q = q.replace("email address", "email")
            for topic, words in _TOPIC_WORDS.items():
                answerable = topic in _AUTH or topic in replies
                if answerable and topic not in found and any(w in q for w in words):
                    found.append(topic)
        return found

    def _answer(self, topics: list[str]) -> str:
        replies = self._user["replies"]
        parts = []
        auth = [t for t in topics if t in _AUTH]
        if auth:
            way = auth[0] if auth[0] != "identity" else self._user["auth"]
            if way == "email" and not self._user["knows_email"]:
                parts.append(replies["forgot_email"])
                self._given.update(_AUTH)
            else:
                parts.append(replies[way])
                self._given.update((way, "identity"))
        for topic in topics:
            if topic not in _AUTH:
                parts.append(replies[topic])
                self._given.add(topic)
        return " ".join(parts)

    def _confirmation(self, text: str) -> str | None:
        if not any(p in q for q in questions(text) for p in _CONFIRM):
            return None
        low = normalize(text).replace("email address", "email")
        if "transfer" in low or "human agent" in low:
            if self._request.get("accepts_refusal"):
                return YES_TRANSFER
            return f"No, I don't want to be transferred. {self._request['text']}"
        kinds = {k for k, words in _ACTION_WORDS.items() if any(w in low for w in words)}
        if not kinds:
            return None
        action = self._request["action"]
        if (
            action in kinds
            and order_ids(text) <= {self._request["order_id"]}
            and all(contains(text, m) for m in self._request.get("must_mention", []))
        ):
            return YES
        return f"No, that's not what I asked for. {self._request['text']}"

    def _refused(self) -> tuple[str, bool]:
        if self._request.get("accepts_refusal") or self._refusals >= 1:
            return self._end(ACCEPT)
        self._refusals += 1
        return f"Are you sure? {self._request['text']}", False

    def _end(self, text: str) -> tuple[str, bool]:
        self.done = True
        return text, True
