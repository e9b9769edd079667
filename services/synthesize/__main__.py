"""`python -m services.synthesize`: run the synthesize service until SIGTERM."""

from services.synthesize.config import SynthesizeConfig
from services.synthesize.service import NAME, build
from shared.runtime.main import run_service

if __name__ == "__main__":
    run_service(NAME, SynthesizeConfig, build)
