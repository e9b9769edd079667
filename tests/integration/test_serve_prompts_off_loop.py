"""The model server tokenizes prompts on its prompt thread, never on the event loop that
answers health checks and other requests (issue 14: one 20 MB request held the loop 47 s)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch", reason="the model server needs the train extra")

from aiohttp.test_utils import TestClient, TestServer

import shared.serving.api as serving_api
from shared.serving.engine import Engine
from shared.serving.server import ServeConfig, load
from tests.support.tiny_model import save_tiny_model


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Engine]]:
    model = Path(save_tiny_model(tmp_path_factory.mktemp("tiny-model")))
    server, engine = load(ServeConfig(model=str(model), max_batch=1, batch_window_ms=1))
    engine.start()
    yield server, engine
    engine.stop()


class ThreadNoting:
    """The real tokenizer, noting the thread of each call."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.threads: list[str] = []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.threads.append(threading.current_thread().name)
        return self.real(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {"prompt": "Tell me a story about a lighthouse"}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi there"}]}),
    ],
)
async def test_prompts_are_tokenized_off_the_event_loop(
    served: tuple[Any, Engine], monkeypatch: pytest.MonkeyPatch, path: str, body: dict[str, Any]
) -> None:
    server, _ = served
    noting = ThreadNoting(server.prompts.tokenizer)
    monkeypatch.setattr(server.prompts, "tokenizer", noting)
    async with TestClient(TestServer(server.app())) as c:
        r = await c.post(path, json={"model": server.served_name, "max_tokens": 2, **body})
        assert r.status == 200, await r.text()
    assert noting.threads, "the tokenizer was not called"
    assert all(name.startswith("prompts") for name in noting.threads), noting.threads


@pytest.mark.parametrize(
    ("path", "body", "builds"),
    [
        ("/v1/completions", {"prompt": "Tell me", "logprobs": 5}, "_completion_choice"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "Hi"}], "logprobs": True, "top_logprobs": 5},
            "_choice",
        ),
    ],
)
async def test_replies_with_logprobs_are_built_off_the_event_loop(
    served: tuple[Any, Engine],
    monkeypatch: pytest.MonkeyPatch,
    path: str,
    body: dict[str, Any],
    builds: str,
) -> None:
    """Eight choices of 4,096 tokens with 20 alternatives each are 33,000 entries: 0.4 s of
    building and encoding on the event loop, which every other request and the health check
    waited behind (session 32's list)."""
    server, _ = served
    threads: list[str] = []
    owner: Any = server if builds == "_choice" else serving_api
    real = getattr(owner, builds)

    def noting(*args: Any, **kwargs: Any) -> Any:
        threads.append(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, builds, noting)
    async with TestClient(TestServer(server.app())) as c:
        r = await c.post(path, json={"model": server.served_name, "max_tokens": 3, **body})
        assert r.status == 200, await r.text()
        choice = (await r.json())["choices"][0]
        assert choice["logprobs"] is not None
        without = {k: v for k, v in body.items() if "logprobs" not in k}
        r = await c.post(path, json={"model": server.served_name, "max_tokens": 3, **without})
        assert r.status == 200, await r.text()
    assert len(threads) == 2
    assert threads[0].startswith("prompts")  # with logprobs: the prompt thread
    assert threads[1] == threading.current_thread().name  # without: at once, on the loop
