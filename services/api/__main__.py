"""`python -m services.api`: run the control API until SIGTERM."""

from services.api.config import ApiConfig
from services.api.service import NAME, build
from shared.runtime.main import run_service

if __name__ == "__main__":
    run_service(NAME, ApiConfig, build)
