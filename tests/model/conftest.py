"""A real SmolLM2 behind the real server, shared by the model tests of one session."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="model tests need the train extra")

from aiohttp.test_utils import TestClient, TestServer  # noqa: E402

from shared.llm.client import LLMClient  # noqa: E402
from shared.serving.engine import Engine  # noqa: E402
from shared.serving.server import ServeConfig, load  # noqa: E402
from tests.support.models import packaged_or_skip  # noqa: E402
from tests.support.served import client_on  # noqa: E402


@pytest.fixture(scope="session")
def loaded() -> Iterator[tuple[object, Engine]]:
    packaged_or_skip("smollm2")
    server, engine = load(ServeConfig(model="smollm2", max_batch=16, batch_window_ms=20, threads=2))
    engine.start()
    yield server, engine
    engine.stop()


@pytest.fixture
async def client(loaded: tuple[object, Engine]) -> AsyncIterator[TestClient]:
    server, _ = loaded
    async with TestClient(TestServer(server.app())) as c:  # type: ignore[attr-defined]
        yield c


@pytest.fixture
async def llm(loaded: tuple[object, Engine]) -> AsyncIterator[LLMClient]:
    """An LLM client on the real server (a real port, as the services use it)."""
    server, _ = loaded
    async with client_on(server.app()) as client:  # type: ignore[attr-defined]
        yield client


@pytest.fixture(scope="session")
def random_adapter(tmp_path_factory: pytest.TempPathFactory, loaded: tuple[object, Engine]) -> Path:
    """A LoRA adapter with random (non-zero) weights: it must change the model's outputs."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from shared.serving.model_files import resolve_model

    base = AutoModelForCausalLM.from_pretrained(resolve_model("smollm2"))
    torch.manual_seed(0)
    peft_model = get_peft_model(
        base,
        LoraConfig(
            r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False
        ),
    )
    out = tmp_path_factory.mktemp("adapter") / "random-lora"
    peft_model.save_pretrained(out)
    return out
