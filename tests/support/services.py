"""Every retrace service built (not run) from a given environment, as `__main__` builds it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from services.contrast.config import ContrastConfig
from services.contrast.service import build as contrast
from services.evaluator.config import EvaluatorConfig
from services.evaluator.service import build as evaluator
from services.rollout.config import RolloutConfig
from services.rollout.service import build as rollout
from services.router.config import RouterConfig
from services.router.service import build as router
from services.synthesize.config import SynthesizeConfig
from services.synthesize.service import build as synthesize
from services.train.config import TrainConfig
from services.train.service import build as train
from shared.config import load_config
from shared.runtime.service import Service

BUILDERS: dict[str, tuple[Callable[[Any], Service], type]] = {
    "rollout": (rollout, RolloutConfig),
    "contrast": (contrast, ContrastConfig),
    "synthesize": (synthesize, SynthesizeConfig),
    "train": (train, TrainConfig),
    "evaluator": (evaluator, EvaluatorConfig),
    "router": (router, RouterConfig),
}


def built(name: str, env: Mapping[str, str]) -> Service:
    """The service `name` with its settings read from `env` under its own prefix."""
    make, cfg = BUILDERS[name]
    return make(load_config(cfg, service=name, env=env))
