"""helpdesk: a tau2-style retail support environment (policy, seeded database, scripted user).

Modules: `policy` (the rules), `catalog` + `db` (seeded data), `tools` (what the agent can
call), `scenario`, `changes`, `inquiries`, `refusals` + `tasks` (the task list), `user` (the
scripted user), `scoring` (the grade), `env` (the episode loop).
"""

from shared.envs.helpdesk.env import HelpdeskEnvironment, HelpdeskEpisode

__all__ = ["HelpdeskEnvironment", "HelpdeskEpisode"]
