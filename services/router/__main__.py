"""`python -m services.router`: run the router service until SIGTERM."""

from services.router.config import RouterConfig
from services.router.service import NAME, build
from shared.runtime.main import run_service

if __name__ == "__main__":
    run_service(NAME, RouterConfig, build)
