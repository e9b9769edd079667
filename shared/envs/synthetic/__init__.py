"""synthetic: training environments built from a spec, each isolating one capability.

A spec (spec.py) is data: a scenario family, the target tools it offers, difficulty knobs and
weighted checks. `SyntheticEnvironment` runs it over the toolbox's real tools and world;
`validate` and `check_deterministic` gate it; `calibrate` and `adjust` tune it on rollouts.
"""

from shared.envs.synthetic.calibration import (
    CalibrationConfig,
    CalibrationResult,
    adjust,
    calibrate,
)
from shared.envs.synthetic.defaults import default_spec, family_for, family_spec
from shared.envs.synthetic.determinism import check_deterministic
from shared.envs.synthetic.env import SyntheticEnvironment, SyntheticEpisode
from shared.envs.synthetic.spec import (
    Capability,
    CheckSpec,
    InvalidSpecError,
    Knobs,
    SyntheticSpec,
    ToolRef,
)
from shared.envs.synthetic.target import toolbox_schemas
from shared.envs.synthetic.validation import validate

__all__ = [
    "CalibrationConfig",
    "CalibrationResult",
    "Capability",
    "CheckSpec",
    "InvalidSpecError",
    "Knobs",
    "SyntheticEnvironment",
    "SyntheticEpisode",
    "SyntheticSpec",
    "ToolRef",
    "adjust",
    "calibrate",
    "check_deterministic",
    "default_spec",
    "family_for",
    "family_spec",
    "toolbox_schemas",
    "validate",
]
