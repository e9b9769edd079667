"""`retrace model-gate` in front of a real engine: `retrace serve-model` on a tiny random model,
keyed with the engine's own key, on a real port. Through the gate: chat (whole and streamed),
completions, an adapter loaded from the artifact store with the admin key, chatted with and
unloaded; the gate as a process drains a stream in flight at SIGTERM; and schemathesis finds
no request the gate's document allows or breaks that gets a 5xx."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer

torch = pytest.importorskip("torch", reason="the model server needs the train extra")
schemathesis = pytest.importorskip("schemathesis", reason="a dev dependency")

from hypothesis import HealthCheck, settings  # noqa: E402

from shared.serving.gate import ModelGate  # noqa: E402
from shared.serving.openapi import model_gate_openapi  # noqa: E402
from shared.serving.server import ServeConfig, load  # noqa: E402
from tests.integration.test_delivery import eventually  # noqa: E402
from tests.support.gate import (  # noqa: E402
    ADMIN,
    ADMIN_KEY,
    ENGINE_KEY,
    SERVICE,
    SERVICE_KEY,
    gate_config,
)
from tests.support.served import on_a_thread  # noqa: E402
from tests.support.tiny_model import save_tiny_model, smollm2_tokenizer, tiny_llama  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = int(os.environ.get("RETRACE_SCHEMA_EXAMPLES", "25"))


def chat(model: str, **extra: object) -> dict[str, object]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "Say hello."}],
        "temperature": 0,
        "max_tokens": 8,
        **extra,
    }


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An artifact store holding one adapter of the tiny model, with random weights."""
    from peft import LoraConfig, get_peft_model

    root = tmp_path_factory.mktemp("artifacts")
    torch.manual_seed(0)
    adapted = get_peft_model(
        tiny_llama(smollm2_tokenizer(), seed=0),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
    )
    adapted.save_pretrained(root / "acme" / "alarms")
    return root


@pytest.fixture(scope="module")
def engine_url(tmp_path_factory: pytest.TempPathFactory, store: Path) -> Iterator[str]:
    """The tiny model served as `retrace serve-model` serves it, with its own key, on its own
    loop and thread."""
    directory: Path = save_tiny_model(tmp_path_factory.mktemp("tiny"))
    server, engine = load(
        ServeConfig(model=str(directory), served_name="tiny", api_key=ENGINE_KEY, max_batch=8)
    )
    engine.start()
    try:
        with on_a_thread(server.app()) as url:
            yield f"{url}/v1"
    finally:
        engine.stop()


@pytest.fixture
async def gate(engine_url: str, store: Path) -> AsyncIterator[TestClient]:
    async with TestClient(TestServer(ModelGate(gate_config(engine_url, store)).app())) as c:
        yield c


async def test_generation_passes_through_under_the_engine_s_key(gate: TestClient) -> None:
    answered = await gate.post("/v1/chat/completions", json=chat("tiny"), headers=SERVICE)
    body = await answered.json()
    assert answered.status == 200, body
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert body["usage"]["completion_tokens"] >= 1
    streamed = await gate.post(
        "/v1/chat/completions", json=chat("tiny", stream=True), headers=SERVICE
    )
    events = [e for e in (await streamed.text()).split("\n\n") if e]
    assert streamed.status == 200 and events[-1] == "data: [DONE]"
    assert json.loads(events[0].removeprefix("data: "))["object"] == "chat.completion.chunk"
    completed = await gate.post(
        "/v1/completions",
        json={"model": "tiny", "prompt": [1, 2, 3], "max_tokens": 4, "return_token_ids": True},
        headers=SERVICE,
    )
    assert completed.status == 200 and (await completed.json())["choices"][0]["token_ids"]
    # the engine's 4xx comes back as the engine wrote it (the OpenAI shape)
    unknown = await gate.post("/v1/chat/completions", json=chat("nope"), headers=SERVICE)
    assert unknown.status == 404 and "not found" in (await unknown.json())["error"]["message"]


async def test_an_adapter_from_the_store_is_loaded_used_and_unloaded(
    gate: TestClient, store: Path, tmp_path: Path
) -> None:
    name = "acme/bot--alarms--v1--0001"
    load = {"lora_name": name, "lora_path": str(store / "acme" / "alarms")}
    refused = await gate.post("/v1/load_lora_adapter", json=load, headers=SERVICE)
    assert refused.status == 403
    outside = tmp_path / "copy"
    shutil.copytree(store / "acme" / "alarms", outside)  # a real adapter, outside the store
    link = store / "acme" / f"escape-{uuid.uuid4().hex}"
    link.symlink_to(outside, target_is_directory=True)  # inside by name only
    for path in (outside, link):
        escaped = await gate.post(
            "/v1/load_lora_adapter", json={**load, "lora_path": str(path)}, headers=ADMIN
        )
        assert escaped.status == 403, path
    loaded = await gate.post("/v1/load_lora_adapter", json=load, headers=ADMIN)
    assert loaded.status == 200, await loaded.text()
    try:
        listed = await (await gate.get("/v1/models", headers=SERVICE)).json()
        assert name in [m["id"] for m in listed["data"]]
        base = await (
            await gate.post("/v1/chat/completions", json=chat("tiny"), headers=SERVICE)
        ).json()
        adapted = await gate.post("/v1/chat/completions", json=chat(name), headers=SERVICE)
        assert adapted.status == 200
        # random LoRA weights change what the model says
        assert (await adapted.json())["choices"][0]["message"] != base["choices"][0]["message"]
    finally:
        unloaded = await gate.post(
            "/v1/unload_lora_adapter", json={"lora_name": name}, headers=ADMIN
        )
    assert unloaded.status == 200
    listed = await (await gate.get("/v1/models", headers=SERVICE)).json()
    assert name not in [m["id"] for m in listed["data"]]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _gate_process(
    engine_url: str, store: Path, port: int, *args: str, **env: str
) -> asyncio.subprocess.Process:
    """`retrace model-gate` as a process in front of `engine_url`, keyed as `gate_config`
    keys the gate, with `args` and `env` added."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "shared.cli.main",
        "model-gate",
        "--upstream",
        engine_url,
        "--port",
        str(port),
        "--adapter-dir",
        str(store),
        *args,
        cwd=REPO,
        env={
            **os.environ,
            "RETRACE_MODEL_API_KEY": SERVICE_KEY,
            "RETRACE_MODEL_ADMIN_KEY": ADMIN_KEY,
            "RETRACE_MODEL_UPSTREAM_KEY": ENGINE_KEY,
            "RETRACE_LOG_FORMAT": "json",
            **env,
        },
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )


async def _serving(proc: asyncio.subprocess.Process, http: aiohttp.ClientSession, url: str) -> None:
    """Wait until the gate process at `url` answers its health check (its output if it exits)."""

    async def up() -> bool:
        if proc.returncode is not None:
            raise AssertionError(proc.stdout and (await proc.stdout.read()).decode())
        try:
            async with http.get(f"{url}/healthz") as r:
                return r.status == 200
        except aiohttp.ClientError:
            return False

    await eventually(up, within=60)


async def test_sigterm_lets_a_stream_in_flight_finish(engine_url: str, store: Path) -> None:
    """The gate as `retrace model-gate` runs it: a stream it is passing on when SIGTERM
    arrives ends whole; a connection made after it is refused."""
    port = _free_port()
    proc = await _gate_process(engine_url, store, port)
    url = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession() as http:
        try:
            await _serving(proc, http, url)
            long = chat("tiny", stream=True, max_tokens=1500)
            async with http.post(f"{url}/v1/chat/completions", json=long, headers=SERVICE) as resp:
                assert resp.status == 200
                first = await resp.content.readline()
                assert first.startswith(b"data: ")
                proc.send_signal(signal.SIGTERM)
                await asyncio.sleep(0.5)  # the gate has stopped listening, not streaming
                async with aiohttp.ClientSession() as fresh:
                    with pytest.raises(aiohttp.ClientConnectionError):
                        await fresh.get(f"{url}/healthz")
                rest = (await resp.content.read()).decode()
            assert rest.count("data: ") > 100  # most of the stream came after SIGTERM
            assert rest.rstrip().endswith("data: [DONE]"), rest[-300:]
            assert await asyncio.wait_for(proc.wait(), 30) == 0
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


async def test_a_key_rotated_in_its_file_takes_effect_without_a_restart(
    engine_url: str, store: Path, tmp_path: Path
) -> None:
    """The service key rotated as docs/serving.md says: the new key listed beside the old,
    the callers moved, the old line deleted; SIGHUP has the gate read the file at once. Chat
    through the gate works with whichever keys are listed at each step, and the process is
    the same one throughout (no restart, no adapter reloaded)."""
    old, new = "rotated-old-0123456789", "rotated-new-0123456789"
    keys = tmp_path / "service-keys"
    keys.write_text(f"# the services' keys\n{old}\n")
    keys.chmod(0o600)
    port = _free_port()
    proc = await _gate_process(
        engine_url, store, port, "--api-key-file", str(keys), RETRACE_MODEL_API_KEY=""
    )
    url = f"http://127.0.0.1:{port}"

    async with aiohttp.ClientSession() as http:

        async def status(key: str) -> int:
            headers = {"Authorization": f"Bearer {key}"}
            async with http.post(
                f"{url}/v1/chat/completions", json=chat("tiny", max_tokens=2), headers=headers
            ) as resp:
                return resp.status

        async def rotate_to(*listed: str) -> None:
            partial = tmp_path / "partial"
            partial.write_text("".join(f"{k}\n" for k in listed))
            partial.replace(keys)
            proc.send_signal(signal.SIGHUP)

            async def taken() -> bool:
                return [await status(k) for k in (old, new)] == [
                    200 if k in listed else 401 for k in (old, new)
                ]

            await eventually(taken, within=10)

        try:
            await _serving(proc, http, url)
            assert [await status(old), await status(new), await status(SERVICE_KEY)] == [
                200,
                401,
                401,
            ]
            await rotate_to(old, new)
            await rotate_to(new)
            keys.write_text("short\n")  # a bad edit: refused, the keys in force stay
            proc.send_signal(signal.SIGHUP)
            await asyncio.sleep(0.5)
            assert [await status(old), await status(new)] == [401, 200]
            assert proc.returncode is None
        finally:
            proc.send_signal(signal.SIGTERM)
            output = (await asyncio.wait_for(proc.communicate(), 30))[0].decode()
        assert proc.returncode == 0, output
        assert output.count('"key file reloaded"') == 2, output
        assert "line 1: a key needs at least" in output
        assert old not in output and new not in output and "short" not in output


schema = schemathesis.openapi.from_dict(model_gate_openapi())


@pytest.fixture(scope="module")
def gate_url(engine_url: str, store: Path) -> Iterator[str]:
    """The gate on a real port, on its own loop and thread (schemathesis calls synchronously)."""
    with on_a_thread(ModelGate(gate_config(engine_url, store)).app()) as url:
        yield url


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_request_the_gate_s_document_allows_or_breaks_gets_a_5xx(
    case: object, gate_url: str
) -> None:
    headers = ADMIN if "lora" in case.path else SERVICE  # type: ignore[attr-defined]
    response = case.call(base_url=gate_url, headers=headers, timeout=60)  # type: ignore[attr-defined]
    assert response.status_code < 500, (case, response.status_code, response.text[:500])
