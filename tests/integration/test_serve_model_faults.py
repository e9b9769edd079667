"""`retrace serve-model` as an attacker and a careless admin would try it (session 32's
review), on a tiny random model with SmolLM2's tokenizer, the real server and engine: an
adapter that does not load leaves the server serving, a stream whose adapter is unloaded
ends with an error event, loads and unloads of one name at once are answered one by one,
and requests the server cannot honour get a 400, not a 500 or a silent answer."""

from __future__ import annotations

import asyncio
import gzip
import json
import shutil
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="the model server needs the train extra")

from aiohttp.test_utils import TestClient, TestServer  # noqa: E402

from shared.serving.engine import Engine  # noqa: E402
from shared.serving.server import ServeConfig, load  # noqa: E402
from tests.support.tiny_model import save_tiny_model, smollm2_tokenizer, tiny_llama  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

KEY, ADMIN = "faults-key-0123456789", "faults-admin-0123456789"
HI = [{"role": "user", "content": "hi"}]
BASE = "tiny"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The artifact store: a good adapter, one whose tensor has the wrong shape, and one
    whose weights file is cut short."""
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file, save_file

    root = tmp_path_factory.mktemp("artifacts")
    config = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    get_peft_model(tiny_llama(smollm2_tokenizer()), config).save_pretrained(root / "good")
    shutil.copytree(root / "good", root / "misshapen")
    weights = load_file(root / "misshapen" / "adapter_model.safetensors")
    last = sorted(k for k in weights if "lora_B" in k)[-1]
    weights[last] = torch.zeros(3, 3)  # read after the others: the layers are in by then
    save_file(weights, root / "misshapen" / "adapter_model.safetensors")
    shutil.copytree(root / "good", root / "truncated")
    cut = root / "truncated" / "adapter_model.safetensors"
    cut.write_bytes(cut.read_bytes()[:200])
    return root


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(save_tiny_model(tmp_path_factory.mktemp("tiny")))


@pytest.fixture
def served(tiny: Path, store: Path) -> Iterator[tuple[Any, Engine]]:
    cfg = ServeConfig(
        model=str(tiny),
        served_name=BASE,
        api_key=KEY,
        admin_key=ADMIN,
        adapter_dirs=(store,),
        max_batch=4,
    )
    server, engine = load(cfg)
    engine.start()
    yield server, engine
    engine.stop()


@pytest.fixture
async def client(served: tuple[Any, Engine]) -> AsyncIterator[TestClient[Any, Any]]:
    server, _ = served
    async with TestClient(TestServer(server.app())) as c:
        yield c


async def _post(c: TestClient[Any, Any], path: str, body: Any, key: str = KEY) -> tuple[int, Any]:
    async with c.post(path, json=body, headers={"Authorization": f"Bearer {key}"}) as r:
        text = await r.text()
        return r.status, json.loads(text) if r.content_type == "application/json" else text


async def _chat(c: TestClient[Any, Any], model: str, **extra: Any) -> tuple[int, Any]:
    body = {"model": model, "messages": HI, "max_tokens": 3, **extra}
    return await _post(c, "/v1/chat/completions", body)


async def _load(c: TestClient[Any, Any], name: str, path: Path) -> tuple[int, Any]:
    return await _post(
        c, "/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(path)}, ADMIN
    )


async def test_an_adapter_that_does_not_load_leaves_the_server_serving(
    client: TestClient[Any, Any], served: tuple[Any, Engine], store: Path, tiny: Path
) -> None:
    """A first adapter whose weights did not fit left PEFT's layers in the base model:
    every request after it was a 500 until a restart, the base model's included."""
    for broken in ("misshapen", "truncated"):  # as the first adapter
        status, body = await _load(c := client, f"acme--{broken}", store / broken)
        assert status == 400 and "cannot load adapter" in body["error"]["message"], body
        assert (await _chat(c, BASE))[0] == 200
    assert served[1].adapters == {}
    assert (await _load(c, "acme--good", store / "good"))[0] == 200
    assert (await _chat(c, "acme--good"))[0] == 200
    status, _ = await _load(c, "acme--misshapen", store / "misshapen")  # as the second
    assert status == 400
    assert (await _chat(c, "acme--good"))[0] == 200 and (await _chat(c, BASE))[0] == 200
    assert list(served[1].adapters) == ["acme--good"]


async def test_an_adapter_whose_files_link_out_of_the_store_is_refused(
    client: TestClient[Any, Any], store: Path, tmp_path: Path
) -> None:
    """Only the adapter's directory was checked: a weights file inside it linked to any
    file the server could read was loaded from there."""
    outside = tmp_path / "elsewhere.safetensors"
    shutil.copy(store / "good" / "adapter_model.safetensors", outside)
    linked = store / "linked"
    shutil.copytree(store / "good", linked, dirs_exist_ok=True)
    (linked / "adapter_model.safetensors").unlink()
    (linked / "adapter_model.safetensors").symlink_to(outside)
    status, body = await _load(client, "acme--linked", linked)
    assert status == 403 and body["error"]["type"] == "permission_error", body


async def test_loads_and_unloads_of_one_name_at_once_are_answered_one_by_one(
    client: TestClient[Any, Any], store: Path
) -> None:
    """Two loads of one name both said 'added'; of two unloads the second was a 500."""
    loads = await asyncio.gather(*(_load(client, "acme--twice", store / "good") for _ in range(2)))
    assert sorted(s for s, _ in loads) == [200, 400]
    unload = {"lora_name": "acme--twice"}
    unloads = await asyncio.gather(
        *(_post(client, "/v1/unload_lora_adapter", unload, ADMIN) for _ in range(2))
    )
    assert sorted(s for s, _ in unloads) == [200, 404]


async def test_an_adapter_unloaded_under_a_waiting_request_ends_it_cleanly(
    client: TestClient[Any, Any], served: tuple[Any, Engine], store: Path
) -> None:
    """A stream's generation that failed after its 200 went out had a 500 response written
    into it raw (a second status line inside the chunked body); a whole reply was a 500."""
    _, engine = served
    assert (await _load(client, "acme--gone", store / "good"))[0] == 200
    hold = asyncio.ensure_future(engine.run_on_engine(lambda: time.sleep(0.5)))
    await asyncio.sleep(0.05)
    headers = {"Authorization": f"Bearer {KEY}"}
    body = {"model": "acme--gone", "messages": HI, "max_tokens": 3}
    stream = asyncio.ensure_future(
        client.post("/v1/chat/completions", json={**body, "stream": True}, headers=headers)
    )
    whole = asyncio.ensure_future(_post(client, "/v1/chat/completions", body))
    await asyncio.sleep(0.1)
    unload = asyncio.ensure_future(
        _post(client, "/v1/unload_lora_adapter", {"lora_name": "acme--gone"}, ADMIN)
    )
    await hold
    async with await stream as r:
        assert r.status == 200
        text = await r.text()
    events = [line.removeprefix("data: ") for line in text.split("\n\n") if line]
    assert "HTTP/1.1" not in text
    assert json.loads(events[-1])["error"]["type"] == "not_found_error", events
    status, refused = await whole
    assert status == 404 and "was unloaded" in refused["error"]["message"], refused
    assert (await unload)[0] == 200


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        # a tool schema the chat template cannot take was a 500 from inside the template
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "str"}}]},
         "parameters must be a JSON Schema object"),
        ({"tools": [{"type": "function", "function": {"name": "f", "description": 5}}]},
         "description must be text"),
        ({"tools": [{"type": "function", "function": {
            "name": "f", "parameters": {"type": "object", "properties": {"a": "x"}}}}]},
         "chat template cannot render"),
        ({"tools": [{"type": "function", "function": {
            "name": "f", "parameters": {"a": json.loads("[" * 500 + "]" * 500)}}}]},
         "nested deeper than 64"),
        # settings it does not apply were answered as if it had
        ({"stream": True, "logprobs": True}, "does not stream logprobs"),
        ({"best_of": 2}, "without best_of"),
        ({"ignore_eos": True}, "without ignore_eos"),
        ({"guided_json": {"type": "object"}}, "without guided_json"),
        # each stop string is looked for after every token of every row
        ({"stop": [f"s{i}" for i in range(17)]}, "16 strings at most"),
        ({"stop": ["x" * 257]}, "256 characters"),
    ],
)  # fmt: skip
async def test_what_the_server_cannot_honour_is_a_400(
    client: TestClient[Any, Any], tiny: Path, extra: dict[str, Any], says: str
) -> None:
    status, body = await _chat(client, BASE, **extra)
    assert status == 400 and says in body["error"]["message"], body


async def test_completions_refuse_what_they_do_not_apply(
    client: TestClient[Any, Any], tiny: Path
) -> None:
    for extra, says in (
        ({"presence_penalty": 1.5}, "presence_penalty"),
        ({"logit_bias": {"5": 100}}, "logit_bias"),
        ({"echo": True}, "echo"),
        ({"suffix": "end"}, "suffix"),
        ({"stop_token_ids": list(range(65))}, "64 ids at most"),
    ):
        body = {"model": BASE, "prompt": [5, 6, 7], "max_tokens": 2, **extra}
        status, answer = await _post(client, "/v1/completions", body)
        assert status == 400 and says in answer["error"]["message"], answer
    body = {"model": BASE, "prompt": [5, 6, 7], "max_tokens": 2, "logit_bias": {"5": 0}}
    assert (await _post(client, "/v1/completions", body))[0] == 200  # zeros change nothing


async def test_a_body_that_is_not_the_encoding_it_says_is_a_400(
    client: TestClient[Any, Any], tiny: Path
) -> None:
    headers = {"Authorization": f"Bearer {KEY}", "Content-Encoding": "gzip"}
    broken = {**headers, "Connection": "close"}  # what follows it on the connection is lost
    async with client.post("/v1/chat/completions", data=b"0123456789", headers=broken) as r:
        assert r.status == 400 and r.content_type == "application/json"
        assert "could not be read" in (await r.json())["error"]["message"]
    body = json.dumps({"model": BASE, "messages": HI, "max_tokens": 2}).encode()
    async with client.post("/v1/chat/completions", data=gzip.compress(body), headers=headers) as r:
        assert r.status == 200  # real gzip is read


async def test_health_says_when_the_engine_has_stopped(
    client: TestClient[Any, Any], served: tuple[Any, Engine]
) -> None:
    """A dead generation thread left every request waiting while health said ok."""
    async with client.get("/healthz") as r:
        assert r.status == 200 and (await r.json())["status"] == "ok"
    served[1].stop()
    async with client.get("/healthz") as r:
        assert r.status == 503 and (await r.json())["status"] == "engine stopped"


def test_a_negative_batch_window_is_refused(tiny: Path) -> None:
    """`--batch-window-ms -1` killed the engine's thread on its first batch."""
    with pytest.raises(ValueError, match="batch window"):
        load(ServeConfig(model=str(tiny), batch_window_ms=-1))
