"""`python -m services.rollout`: run the rollout service until SIGTERM."""

from services.rollout.config import RolloutConfig
from services.rollout.service import NAME, build
from shared.runtime.main import run_service

if __name__ == "__main__":
    run_service(NAME, RolloutConfig, build)
