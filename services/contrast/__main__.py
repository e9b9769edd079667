"""`python -m services.contrast`: run the contrast service until SIGTERM."""

from services.contrast.config import ContrastConfig
from services.contrast.service import NAME, build
from shared.runtime.main import run_service

if __name__ == "__main__":
    run_service(NAME, ContrastConfig, build)
