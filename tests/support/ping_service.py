"""`python -m tests.support.ping_service`: a real service process running the Ping handler."""

from shared.config import ServiceConfig
from shared.runtime.main import run_service
from shared.runtime.service import Service
from tests.support.ping import Ping, handle_ping


def build(cfg: ServiceConfig) -> Service:
    return Service("pinger", cfg, {Ping: handle_ping}, default_port=0)


if __name__ == "__main__":
    run_service("pinger", ServiceConfig, build)
