"""OpenAI tool schemas derived from typed Python functions and their docstrings.

A tool is a function whose first parameter receives the episode's state and whose other
parameters are what the model fills in:

    def book_room(state: Hotel, room_id: str, nights: int = 1) -> dict[str, Any]:
        '''Book a room for the guest.

        Args:
            room_id: The room's id, as `search_rooms` lists it.
            nights: How many nights, at least 1.
        '''

The schema's description is the docstring's text before its sections; each parameter's
description comes from its `Args:` entry (Google, NumPy and reST styles are read). Supported
annotations: `str`, `int`, `float`, `bool`, `Literal[...]`, an `Enum`, `list[X]`,
`dict[str, X]`, and `X | None` (an optional argument that may also be null). Anything else is a
`ToolDefinitionError` naming the function and the parameter, raised when the environment is
defined, never when the model calls it.
"""

from __future__ import annotations

import enum
import inspect
import re
import types
import typing
from collections.abc import Callable
from typing import Any, Literal, Union

import docstring_parser

NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
"""OpenAI's rule for function names."""

_SCALARS: dict[type, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}


class ToolDefinitionError(TypeError):
    """A tool function that cannot be described to a model (its name, an annotation or its
    docstring)."""


def function_schema(fn: Callable[..., Any], *, name: str | None = None) -> dict[str, Any]:
    """The OpenAI tool schema of `fn`, its first (state) parameter left out."""
    tool = name or fn.__name__
    if not NAME.match(tool):
        raise ToolDefinitionError(f"tool name {tool!r} must match {NAME.pattern}")
    try:
        hints = typing.get_type_hints(fn)
    except (NameError, TypeError) as exc:
        raise ToolDefinitionError(f"tool {tool!r}: its annotations do not resolve: {exc}") from exc
    params = list(inspect.signature(fn).parameters.values())
    if not params or params[0].kind not in _POSITIONAL:
        raise ToolDefinitionError(
            f"tool {tool!r}: the first parameter must take the episode's state"
        )
    doc = docstring_parser.parse(inspect.getdoc(fn) or "")
    described = {p.arg_name: (p.description or "").strip() for p in doc.params}
    properties: dict[str, Any] = {}
    required: list[str] = []
    for param in params[1:]:
        if param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            raise ToolDefinitionError(
                f"tool {tool!r}: *args and **kwargs cannot be described to a model"
            )
        if param.kind is inspect.Parameter.POSITIONAL_ONLY:
            raise ToolDefinitionError(
                f"tool {tool!r}: parameter {param.name!r} is positional-only; tools are called "
                "with keyword arguments"
            )
        if param.name not in hints:
            raise ToolDefinitionError(f"tool {tool!r}: parameter {param.name!r} has no annotation")
        try:
            schema = annotation_schema(hints[param.name])
        except ToolDefinitionError as exc:
            raise ToolDefinitionError(f"tool {tool!r}, parameter {param.name!r}: {exc}") from None
        if described.get(param.name):
            schema["description"] = described[param.name]
        properties[param.name] = schema
        if param.default is inspect.Parameter.empty:
            required.append(param.name)
    unknown = sorted(set(described) - set(properties))
    if unknown:
        raise ToolDefinitionError(
            f"tool {tool!r}: its docstring describes parameters it does not have: "
            + ", ".join(unknown)
        )
    description = "\n\n".join(
        part.strip() for part in (doc.short_description, doc.long_description) if part
    )
    if not description:
        raise ToolDefinitionError(f"tool {tool!r} needs a docstring saying what it does")
    parameters: dict[str, Any] = {
        "type": "object",
        "properties": properties,
        "additionalProperties": False,
    }
    if required:
        parameters["required"] = required
    return {
        "type": "function",
        "function": {"name": tool, "description": description, "parameters": parameters},
    }


_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def annotation_schema(annotation: Any) -> dict[str, Any]:
    """The JSON schema of one parameter's annotation."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (Union, types.UnionType):
        present = [a for a in args if a is not type(None)]
        if len(present) != 1 or len(present) == len(args):
            raise ToolDefinitionError(f"{annotation!r}: only `X | None` unions are supported")
        return _nullable(annotation_schema(present[0]))
    if origin is Literal:
        kinds = {type(a) for a in args}
        if len(kinds) != 1 or not kinds <= set(_SCALARS):
            raise ToolDefinitionError(
                f"{annotation!r}: a Literal's values must all be str, int, float or bool"
            )
        return {"type": _SCALARS[kinds.pop()], "enum": list(args)}
    if origin is list:
        if len(args) != 1:
            raise ToolDefinitionError(f"{annotation!r}: a list needs its item type, e.g. list[str]")
        return {"type": "array", "items": annotation_schema(args[0])}
    if origin is dict:
        if len(args) != 2 or args[0] is not str:
            raise ToolDefinitionError(f"{annotation!r}: a dict needs str keys, e.g. dict[str, int]")
        return {"type": "object", "additionalProperties": annotation_schema(args[1])}
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        values = [member.value for member in annotation]
        return annotation_schema(Literal[tuple(values)])
    if annotation in _SCALARS:
        return {"type": _SCALARS[annotation]}
    raise ToolDefinitionError(
        f"{annotation!r} is not supported: use str, int, float, bool, Literal, an Enum, "
        "list[X], dict[str, X] or X | None"
    )


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    out = dict(schema)
    out["type"] = [schema["type"], "null"]
    if "enum" in schema:
        out["enum"] = [*schema["enum"], None]
    return out


def enum_arguments(fn: Callable[..., Any]) -> dict[str, type[enum.Enum]]:
    """Parameters annotated with an Enum (or `Enum | None`): the model sends their values, the
    tool receives the members."""
    out: dict[str, type[enum.Enum]] = {}
    for name, annotation in typing.get_type_hints(fn).items():
        present = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
        if len(present) == 1 and isinstance(present[0], type) and issubclass(present[0], enum.Enum):
            out[name] = present[0]
    return out
