"""A pantry assistant environment speaking retrace's HTTP environment protocol (version 1),
written with the Python standard library only, to show what a server in any language does:

    python examples/http_pantry/server.py --port 8601
    retrace env check http://127.0.0.1:8601
    retrace agent create pantry-bot --model qwen2.5-coder-0.5b --env http://127.0.0.1:8601

The protocol is in docs/environment-http.json; docs/environments.md explains it.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

FOODS = ("apples", "eggs", "milk", "rice", "lentils", "onions", "tomatoes", "oats")
SYSTEM = (
    "You manage the user's pantry with the pantry tools. Check what is there before answering "
    "about it, change only what the user asks, and say in one sentence what you did or found."
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "list_items",
            "description": "Everything in the pantry with its quantity.",
            "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "add_item",
            "description": "Add a quantity of an item.",
            "parameters": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "quantity": {"type": "integer", "minimum": 1},
                },
                "required": ["name", "quantity"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "remove_item",
            "description": "Remove a quantity of an item (all of it if more).",
            "parameters": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "quantity": {"type": "integer", "minimum": 1},
                },
                "required": ["name", "quantity"],
                "additionalProperties": False,
            },
        },
    },
]


def make_tasks() -> list[dict[str, Any]]:
    rng = random.Random(7)
    tasks = []
    for n in range(24):
        food = FOODS[n % len(FOODS)]
        qty = rng.randint(2, 6)
        kind = ("add", "remove", "count")[n % 3]
        prompt = {
            "add": f"I just bought {qty} {food}, please add them.",
            "remove": f"I used {qty} {food} today, take them out of the pantry.",
            "count": f"How many {food} do I have left?",
        }[kind]
        tasks.append(
            {
                "id": f"{kind}-{n:02d}",
                "split": "test" if n % 4 == 3 else "train",
                "kind": kind,
                "data": {"food": food, "quantity": qty, "prompt": prompt},
            }
        )
    return tasks


TASKS = {t["id"]: t for t in make_tasks()}


class Episode:
    def __init__(self, task: dict[str, Any], seed: int) -> None:
        rng = random.Random(f"{task['id']}:{seed}")
        self.task = task
        self.start = {f: rng.randint(0, 9) for f in FOODS}
        self.start[task["data"]["food"]] = rng.randint(7, 12)  # enough to take some out
        self.pantry = dict(self.start)
        self.answers: list[dict[str, Any]] = []
        self.reply = ""
        self.calls = 0
        self.lock = threading.Lock()

    def call(self, name: str, raw: str) -> str:
        try:
            args = json.loads(raw or "{}")
        except json.JSONDecodeError:
            return json.dumps({"error": "arguments are not valid JSON"})
        if not isinstance(args, dict):
            return json.dumps({"error": "arguments must be a JSON object"})
        item, qty = str(args.get("name", "")).lower().strip(), args.get("quantity")
        if name == "list_items":
            self.calls += 1
            return json.dumps({k: v for k, v in sorted(self.pantry.items()) if v})
        if name not in ("add_item", "remove_item"):
            return json.dumps({"error": f"unknown tool {name!r}"})
        if not item or not isinstance(qty, int) or qty < 1:
            return json.dumps(
                {"error": "name (text) and quantity (a whole number, at least 1) are required"}
            )
        self.calls += 1
        have = self.pantry.get(item, 0)
        self.pantry[item] = have + qty if name == "add_item" else max(0, have - qty)
        return json.dumps({"name": item, "quantity": self.pantry[item]})

    def step(self, message: dict[str, Any]) -> dict[str, Any]:
        if message.get("content"):
            self.reply = message["content"]
        calls = message.get("tool_calls") or []
        if not calls:
            return {"messages": [], "done": True}
        out = [
            {
                "role": "tool",
                "tool_call_id": c["id"],
                "name": c["function"]["name"],
                "content": self.call(c["function"]["name"], c["function"].get("arguments", "")),
            }
            for c in calls
        ]
        return {"messages": out, "done": False}

    def score(self) -> dict[str, Any]:
        data, kind = self.task["data"], self.task["kind"]
        food, qty = data["food"], data["quantity"]
        changed = {
            k
            for k in set(self.pantry) | set(self.start)
            if self.pantry.get(k, 0) != self.start.get(k, 0)
        }
        if kind == "count":
            said = re.findall(r"\d+", self.reply)
            right = self.calls > 0 and str(self.start[food]) in said
            reward = 1.0 if right and not changed else 0.0  # a question changes nothing
            parts = {"answered": reward}
        else:
            want = self.start[food] + qty if kind == "add" else max(0, self.start[food] - qty)
            done = self.pantry.get(food, 0) == want
            reward = (0.8 if done else 0.0) + (0.2 if done and self.reply else 0.0)
            if changed - {food}:
                reward = 0.0
            parts = {"updated": 0.8 if done else 0.0, "reported": reward - (0.8 if done else 0.0)}
        return {"reward": reward, "success": reward >= 1.0, "breakdown": parts, "notes": []}


EPISODES: dict[str, Episode] = {}


class Handler(BaseHTTPRequestHandler):
    def _send(self, status: int, body: dict[str, Any]) -> None:
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def _error(self, status: int, kind: str, message: str) -> None:
        self._send(status, {"error": {"message": message, "type": kind}})

    def log_message(self, *_: Any) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        if self.path != "/v1/tasks":
            return self._error(404, "not_found", self.path)
        self._send(200, {"name": "pantry", "tasks": list(TASKS.values())})

    def do_POST(self) -> None:
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        except json.JSONDecodeError:
            return self._error(400, "invalid_request", "the body is not JSON")
        if self.path == "/v1/reset":
            task = TASKS.get(body.get("task_id"))
            if task is None:
                return self._error(404, "unknown_task", f"no task {body.get('task_id')!r}")
            episode_id = uuid.uuid4().hex
            EPISODES[episode_id] = Episode(task, int(body.get("seed", 0)))
            return self._send(
                200,
                {
                    "episode_id": episode_id,
                    "system_prompt": SYSTEM,
                    "tools": TOOLS,
                    "messages": [{"role": "user", "content": task["data"]["prompt"]}],
                },
            )
        episode = EPISODES.get(body.get("episode_id"))
        if episode is None:
            return self._error(404, "unknown_episode", f"no episode {body.get('episode_id')!r}")
        if self.path == "/v1/score":
            return self._send(200, episode.score())
        if self.path != "/v1/step":
            return self._error(404, "not_found", self.path)
        with episode.lock:
            turn = body.get("turn")
            if not isinstance(turn, int) or turn < 0 or turn > len(episode.answers):
                return self._error(
                    409, "turn_out_of_order", f"turn {turn} sent before turn {len(episode.answers)}"
                )
            if turn < len(episode.answers):  # a retry: the answer it had
                return self._send(200, episode.answers[turn])
            episode.answers.append(episode.step(body.get("message") or {}))
            return self._send(200, episode.answers[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8601)
    args = parser.parse_args()
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    print(f"pantry environment on http://{args.host}:{args.port}/v1", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
