"""`python -m services.train`: run the train service until SIGTERM."""

from services.train.config import TrainConfig
from services.train.service import NAME, build
from shared.runtime.main import run_service

if __name__ == "__main__":
    run_service(NAME, TrainConfig, build)
