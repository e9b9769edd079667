"""The scenario families, one module each; `FAMILIES` maps a spec's `scenario` to one."""

from __future__ import annotations

from shared.envs.synthetic.families import (
    convert_and_report,
    look_up_contact_then_message,
    recover_from_rejected_call,
    reminder_with_missing_detail,
    send_message_to_contact,
    set_alarm_at_time,
)
from shared.envs.synthetic.scenario import Family
from shared.envs.synthetic.spec import SyntheticSpec
from shared.envs.synthetic.template import TEMPLATE, template_family

FAMILIES: dict[str, Family] = {
    module.FAMILY.name: module.FAMILY
    for module in (
        set_alarm_at_time,
        send_message_to_contact,
        convert_and_report,
        reminder_with_missing_detail,
        recover_from_rejected_call,
        look_up_contact_then_message,
    )
}
"""Looked up at generation time, so a test may swap one in."""


def family_of(spec: SyntheticSpec) -> Family | None:
    """The family a spec runs: its own template, or a hand-written one; None if unknown."""
    if spec.scenario == TEMPLATE:
        return template_family(spec.template) if spec.template is not None else None
    return FAMILIES.get(spec.scenario)
