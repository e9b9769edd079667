"""`python -m services.evaluator`: run the evaluator service until SIGTERM."""

from services.evaluator.config import EvaluatorConfig
from services.evaluator.service import NAME, build
from shared.runtime.main import run_service

if __name__ == "__main__":
    run_service(NAME, EvaluatorConfig, build)
