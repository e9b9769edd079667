"""Environments from installed packages: the entry-point group `retrace.environments`.

A package declares its environments in its `pyproject.toml`:

    [project.entry-points."retrace.environments"]
    hotel-desk = "retrace_hotel_desk:HotelDesk"

The name on the left is the environment's reference (`--env hotel-desk`); the object on the
right is a factory called with no arguments (a class, or a function) that returns an
environment whose `name` is that same reference. Loading imports the package, builds the
environment and runs the conformance checks; every failure along the way is a
`BrokenEnvironmentError` that names the package.
"""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points

from shared.envs.conformance import REF, BrokenEnvironmentError, check
from shared.envs.protocol import Environment

GROUP = "retrace.environments"


def installed() -> dict[str, EntryPoint]:
    """Every plug-in environment declared by an installed package, by reference."""
    found: dict[str, EntryPoint] = {}
    for point in entry_points(group=GROUP):
        if point.name in found:
            raise BrokenEnvironmentError(
                f"environment {point.name!r} is declared twice: by {origin(found[point.name])} "
                f"and by {origin(point)}; uninstall one"
            )
        found[point.name] = point
    return found


def origin(point: EntryPoint) -> str:
    """`package <dist> (<module:attr>)`, for messages."""
    dist = point.dist.name if point.dist is not None else "an unknown distribution"
    return f"package {dist} ({point.value})"


def load(point: EntryPoint) -> Environment:
    """Import, build and check one plug-in environment."""
    where = origin(point)
    if not REF.match(point.name):
        raise BrokenEnvironmentError(
            f"environment {point.name!r} from {where}: the name must match {REF.pattern}"
        )
    try:
        factory = point.load()
    except Exception as exc:  # importing plug-in code: any failure is the plug-in's
        raise BrokenEnvironmentError(
            f"environment {point.name!r} from {where}: importing it failed: {exc!r}"
        ) from exc
    if not callable(factory):
        raise BrokenEnvironmentError(
            f"environment {point.name!r} from {where}: {point.value} is not callable; the entry "
            "point must name a class or a function that returns the environment"
        )
    try:
        env = factory()
    except Exception as exc:  # plug-in code
        raise BrokenEnvironmentError(
            f"environment {point.name!r} from {where}: building it raised {exc!r}"
        ) from exc
    name = getattr(env, "name", None)
    if name != point.name:
        raise BrokenEnvironmentError(
            f"environment {point.name!r} from {where}: the environment calls itself {name!r}; "
            "its name must be the entry point's name"
        )
    check(env, where)
    return env
