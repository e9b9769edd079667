"""Tool schemas derived from typed functions (shared.envs.kit.schema)."""

from __future__ import annotations

import enum
from typing import Any, Literal

import jsonschema
import pytest

from shared.envs.kit.schema import ToolDefinitionError, annotation_schema, function_schema


class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


def paint(
    state: object,
    wall: str,
    coats: int,
    colour: Colour,
    finish: Literal["matte", "gloss"] = "matte",
    area: float | None = None,
    rooms: list[str] | None = None,
    extras: dict[str, int] | None = None,
    dry_run: bool = False,
) -> dict[str, Any]:
    """Paint a wall.

    Uses the paint in stock.

    Args:
        wall: Which wall.
        coats: How many coats.
        colour: The colour.
        finish: The finish.
        area: Square metres, when known.
        rooms: Rooms to paint too.
        extras: Anything else, by name.
        dry_run: Only say what would be done.
    """
    return {}


def test_a_typed_function_becomes_an_openai_schema_without_its_state() -> None:
    schema = function_schema(paint)
    function = schema["function"]
    assert schema["type"] == "function" and function["name"] == "paint"
    assert function["description"] == "Paint a wall.\n\nUses the paint in stock."
    params = function["parameters"]
    assert "state" not in params["properties"]
    assert params["required"] == ["wall", "coats", "colour"]
    assert params["additionalProperties"] is False
    props = params["properties"]
    assert props["wall"] == {"type": "string", "description": "Which wall."}
    assert props["coats"]["type"] == "integer"
    assert props["colour"]["enum"] == ["red", "blue"]
    assert props["finish"] == {
        "type": "string",
        "enum": ["matte", "gloss"],
        "description": "The finish.",
    }
    assert props["area"]["type"] == ["number", "null"]
    assert props["rooms"]["type"] == ["array", "null"] and props["rooms"]["items"] == {
        "type": "string"
    }
    assert props["extras"]["additionalProperties"] == {"type": "integer"}
    assert props["dry_run"]["type"] == "boolean"
    jsonschema.Draft202012Validator.check_schema(params)
    validator = jsonschema.Draft202012Validator(params)
    assert validator.is_valid({"wall": "north", "coats": 2, "colour": "red", "area": None})
    assert not validator.is_valid({"wall": "north", "coats": "2", "colour": "red"})
    assert not validator.is_valid({"wall": "north", "coats": 2, "colour": "green"})
    assert not validator.is_valid({"wall": "north", "coats": 2, "colour": "red", "extra": 1})


def _no_doc(state: object, x: int) -> int:
    return x


def _untyped(state: object, x) -> int:  # type: ignore[no-untyped-def]
    """Untyped."""
    return 0


def _stray_doc(state: object, x: int) -> int:
    """Stray.

    Args:
        x: fine.
        y: not a parameter.
    """
    return x


def _kwargs(state: object, **more: int) -> int:
    """Anything."""
    return 0


def _tuple(state: object, pair: tuple[int, int]) -> int:
    """A tuple."""
    return 0


def _no_state() -> int:
    """Nothing."""
    return 0


@pytest.mark.parametrize(
    ("fn", "problem"),
    [
        (_no_doc, "needs a docstring"),
        (_untyped, "parameter 'x' has no annotation"),
        (_stray_doc, "describes parameters it does not have: y"),
        (_kwargs, r"\*args and \*\*kwargs"),
        (_tuple, "parameter 'pair'.*not supported"),
        (_no_state, "first parameter must take the episode's state"),
    ],
)
def test_a_tool_that_cannot_be_described_is_refused_with_its_name(fn: Any, problem: str) -> None:
    with pytest.raises(ToolDefinitionError, match=problem) as caught:
        function_schema(fn)
    assert fn.__name__ in str(caught.value)


def test_names_must_be_what_openai_accepts() -> None:
    with pytest.raises(ToolDefinitionError, match="must match"):
        function_schema(paint, name="paint the wall")


@pytest.mark.parametrize(
    "annotation",
    [int | str, Literal["a", 1], list, dict[int, str], set[str], object],
)
def test_unsupported_annotations_say_what_is_supported(annotation: Any) -> None:
    with pytest.raises(ToolDefinitionError):
        annotation_schema(annotation)


def test_an_enum_parameter_reaches_the_tool_as_its_member(tmp_path: Any) -> None:
    import random
    from pathlib import Path

    from shared.envs.kit import TaskFileEnvironment
    from shared.envs.protocol import Message, ToolCall, ToolCallFunction

    seen: list[object] = []

    def pick(state: dict[str, Any], colour: Colour, other: Colour | None = None) -> str:
        """Pick a colour."""
        seen.extend([colour, other])
        return colour.value

    tasks = Path(tmp_path) / "tasks.jsonl"
    tasks.write_text(
        '{"id": "a", "split": "train", "prompt": "p"}\n'
        '{"id": "b", "split": "test", "prompt": "q"}\n',
        encoding="utf-8",
    )

    class Env(TaskFileEnvironment[dict[str, Any]]):
        name = "colours"
        task_file = tasks
        tools = (pick,)

        def initial_state(self, task: Any, rng: random.Random) -> dict[str, Any]:
            return {}

        def reward(self, task: Any, transcript: Any) -> float:
            return 0.0

    episode = Env().reset(Env().tasks()[0], 0)
    call = ToolCall(id="c", function=ToolCallFunction(name="pick", arguments='{"colour": "red"}'))
    [answer] = episode.step(Message(role="assistant", tool_calls=[call])).messages
    assert answer.content == '"red"' and seen == [Colour.RED, None]
