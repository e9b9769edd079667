"""The `tau2:<domain>` environments: tau2's tasks, policy, tools, user simulator and evaluator."""

from __future__ import annotations

import asyncio
from typing import Any

from shared.envs.protocol import TaskSpec
from shared.envs.tau2.config import Tau2Config
from shared.envs.tau2.episode import Tau2Episode, UserFactory
from shared.envs.tau2.library import DOMAINS, Tau2UnavailableError, require
from shared.envs.tau2.tasks import task_specs, tau2_task
from shared.envs.tau2.user import SimulatedUser
from shared.errors import PermanentError


class Tau2Environment:
    """One tau2 domain. `reset` opens an episode whose user is tau2's LLM user simulator at the
    configured endpoint (the opening user message is its first call: use `areset` from asyncio
    code). Tasks and splits are tau2's own (`split_tasks.json`)."""

    def __init__(self, domain: str, cfg: Tau2Config) -> None:
        if domain not in DOMAINS:
            raise Tau2UnavailableError(
                f"unknown tau2 domain {domain!r}; tau2 has {', '.join(DOMAINS)}"
            )
        require()
        self.domain = domain
        self.cfg = cfg
        self.name = f"tau2:{domain}"
        self._specs = task_specs(domain)

    def tasks(self) -> list[TaskSpec]:
        return list(self._specs)

    def reset(self, task: TaskSpec, seed: int) -> Tau2Episode:
        def simulated(tau2_task: Any, tools: list[Any] | None) -> SimulatedUser:
            return SimulatedUser(tau2_task, tools, self.cfg, seed)

        return self.episode(task, simulated)

    async def areset(self, task: TaskSpec, seed: int) -> Tau2Episode:
        """`reset` off the event loop: the opening user message is a call to the simulator."""
        return await asyncio.to_thread(self.reset, task, seed)

    def episode(self, task: TaskSpec, make_user: UserFactory) -> Tau2Episode:
        """An episode of `task` with any user (the gold replay's is a script)."""
        domain = str(task.data.get("domain", self.domain))
        if domain != self.domain:
            raise PermanentError(f"task {task.id} is a tau2 {domain} task, not {self.domain}")
        return Tau2Episode(self.domain, tau2_task(self.domain, task.id), make_user, self.cfg)
