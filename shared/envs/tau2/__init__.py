"""tau2-bench's domains (airline, retail, telecom) as retrace environments `tau2:<domain>`.

Needs the `tau2` extra (`pip install 'retrace[tau2]'`). Nothing here imports tau2 until an
environment is built (`shared.envs.registry`), so retrace runs without the extra installed.
"""

from shared.envs.tau2.library import DOMAINS, Tau2UnavailableError

__all__ = ["DOMAINS", "Tau2UnavailableError"]
