"""HTTP routes of `retrace serve-model`: the OpenAI chat API, model listing, and vLLM's runtime
LoRA endpoints. Every request is validated; a bad one gets a 4xx with an OpenAI error body."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
import uuid
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import msgspec
from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    generate_latest,
)

from shared import openapi
from shared.envs.protocol import ToolCall, ToolCallFunction
from shared.errors import UNDECODABLE
from shared.llm.errors_http import json_errors, openai_error
from shared.llm.openai_types import (
    MAX_N,
    ChatRequest,
    ChatResponse,
    Choice,
    ChoiceLogprobs,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    ErrorBody,
    ErrorResponse,
    LoadAdapterRequest,
    ModelCard,
    ModelList,
    ResponseMessage,
    TokenLogprob,
    TopLogprob,
    UnloadAdapterRequest,
    Usage,
)
from shared.llm.tool_format import offered_tools, parse_reply
from shared.logging import get_logger
from shared.runtime.deadlines import (
    BODY_TIMEOUT_S,
    WRITE_TIMEOUT_S,
    CallerStalled,
    end_within,
    read_body,
    write_within,
)
from shared.serving.access import ModelAccess, OutsideStore
from shared.serving.constrain import Grammar, for_request
from shared.serving.engine import AdapterUnloaded, Delta, Engine, Output
from shared.serving.openapi import ServerHealth, model_server_openapi
from shared.serving.prompts import PromptBuilder, Unrenderable
from shared.serving.sampling import SamplingParams

log = get_logger(__name__)
MIN_TEMPERATURE = 1e-3
"""Below this, float32 logits overflow when divided by the temperature."""
MAX_SEED = 2**63 - MAX_N
"""Each of n samples seeds its own generator with seed + i, which torch takes up to 2**63."""
DEFAULT_MAX_TOKENS = 512
MAX_STOPS = 16
"""Stop strings a request may give (OpenAI's API takes 4; vLLM's more)."""
MAX_STOP_CHARS = 256
MAX_STOP_TOKEN_IDS = 64
T = TypeVar("T")


class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


@web.middleware
async def errors(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as exc:
        return openai_error(exc.status, exc.message, exc.kind)
    except AdapterUnloaded as exc:
        return openai_error(404, str(exc), "not_found_error")
    except web.HTTPException:
        raise  # `json_errors` writes it as JSON
    except Exception:
        log.exception("request failed", path=request.path)
        return openai_error(500, "internal error (logged by the model server)", "server_error")


MAX_BODY_BYTES = 4 << 20
"""Largest request body (413 above): far more text than any context window served here holds,
and a 20 MB body blocked the event loop for 47 s (issue 14)."""


class ModelServer:
    def __init__(
        self,
        engine: Engine,
        prompts: PromptBuilder,
        served_name: str,
        max_context: int,
        max_body_bytes: int = MAX_BODY_BYTES,
        api_key: str | None = None,
        body_timeout_s: float = BODY_TIMEOUT_S,
        admin_key: str | None = None,
        adapter_dirs: Sequence[Path] | None = None,
        api_key_file: Path | None = None,
        admin_key_file: Path | None = None,
    ) -> None:
        self.access = ModelAccess(
            api_key,
            admin_key,
            adapter_dirs,
            api_key_file=api_key_file,
            admin_key_file=admin_key_file,
        )
        """Its key, its admin key and where adapters load from (`shared.serving.access`)."""
        self.engine = engine
        self.prompts = prompts
        self.served_name = served_name
        self.max_context = max_context
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s
        """A request body must arrive within this (408 after)."""
        # templating and tokenizing a long conversation takes seconds: one thread of its own
        # (the tokenizer is not shared between threads), never the event loop
        self._prompt_thread = ThreadPoolExecutor(1, thread_name_prefix="prompts")
        self._changing = asyncio.Lock()
        """Held by a load or an unload of an adapter, from its check to its end."""
        self.created = int(time.time())
        self.vocab = engine.model.get_input_embeddings().num_embeddings
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "retrace_model_requests_total",
            "Chat requests",
            ["model", "status"],
            registry=self.registry,
        )
        self.tokens = Gauge(
            "retrace_model_generated_tokens", "Tokens generated since start", registry=self.registry
        )
        self.batches = Gauge(
            "retrace_model_batches", "Batches run since start", registry=self.registry
        )
        self.prompt_tokens = Gauge(
            "retrace_model_prompt_tokens",
            "Prompt tokens received since start",
            registry=self.registry,
        )
        self.prefilled = Gauge(
            "retrace_model_prefilled_tokens",
            "Prompt tokens run through the model since start (the rest came from the prefix cache)",
            registry=self.registry,
        )

    def app(self) -> web.Application:
        app = web.Application(
            middlewares=[json_errors, self.access.authorized, errors],
            client_max_size=self.max_body_bytes,
        )
        app.cleanup_ctx.append(self.access.watching_keys)  # key files re-read when changed
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/load_lora_adapter", self.load_adapter)
        app.router.add_post("/v1/unload_lora_adapter", self.unload_adapter)
        app.router.add_get("/healthz", self.health)
        app.router.add_get("/health", self.health)  # vLLM's path
        app.router.add_get("/metrics", self.metrics)
        openapi.serve(app, model_server_openapi())
        return app

    async def _decode(self, request: web.Request, kind: type[T]) -> T:
        """The request's body as `kind`: a 400 saying what is wrong, a 408 when it does not
        arrive within the body timeout."""
        body = await read_body(request, self.body_timeout_s)
        try:
            return msgspec.json.decode(body, type=kind)
        except UNDECODABLE as exc:
            raise ApiError(400, f"invalid request: {exc}") from exc

    # -- chat -------------------------------------------------------------------------------
    async def chat(self, request: web.Request) -> web.StreamResponse:
        req = await self._decode(request, ChatRequest)
        _applied(await self._decode(request, Unapplied))
        for i, tool in enumerate(req.tools or ()):
            if _deeper_than(tool, MAX_TOOL_DEPTH):
                raise ApiError(400, f"tools[{i}] is nested deeper than {MAX_TOOL_DEPTH} levels")
        if req.stream and (req.logprobs or req.top_logprobs):
            raise ApiError(400, "serve-model does not stream logprobs: ask without stream")
        adapter = self._adapter_for(req.model)
        params = self._params(req)
        loop = asyncio.get_running_loop()
        try:
            prompt_ids, prefix = await loop.run_in_executor(
                self._prompt_thread, self.prompts.build, req
            )
        except Unrenderable as exc:
            raise ApiError(400, str(exc)) from exc
        self._check_fits(prompt_ids, params)
        if req.stream:
            return await self._stream(request, req, prompt_ids, prefix, params, adapter)
        outputs = await self.engine.generate(prompt_ids, params, adapter=adapter, n=req.n)
        self._count(req.model, "ok")
        body = await self._written(params, self._chat_body, req, outputs, prompt_ids, prefix)
        return web.Response(body=body, content_type="application/json")

    async def _written(
        self, params: SamplingParams, write: Callable[..., bytes], *args: Any
    ) -> bytes:
        """A reply's body from `write(*args)`: with logprobs on the prompt thread, not the
        event loop (eight choices of 4,096 tokens with 20 alternatives each are 33,000
        entries, 0.37 to 0.48 s of building and encoding in a micro-benchmark, docs/benchmarks.md,
        which held every other request and the health check); without them at once."""
        if not params.logprobs:
            return write(*args)
        return await asyncio.get_running_loop().run_in_executor(self._prompt_thread, write, *args)

    def _chat_body(
        self, req: ChatRequest, outputs: list[Output], prompt_ids: list[int], prefix: str
    ) -> bytes:
        tools = offered_tools(req)
        completion = sum(len(o.token_ids) for o in outputs)
        response = ChatResponse(
            id=f"chatcmpl-{uuid.uuid4().hex}",
            created=int(time.time()),
            model=req.model,
            choices=[
                self._choice(i, o, prefix, tools, req.parallel_tool_calls is False)
                for i, o in enumerate(outputs)
            ],
            usage=Usage(
                prompt_tokens=len(prompt_ids),
                completion_tokens=completion,
                total_tokens=len(prompt_ids) + completion,
            ),
        )
        return msgspec.json.encode(response)

    async def _broken_off(
        self, http: web.Request, response: web.StreamResponse, model: str, exc: Exception
    ) -> web.StreamResponse:
        """A stream whose generation failed after its 200 went out ends with an error
        event, OpenAI's way (an error response then was written into the stream raw)."""
        if isinstance(exc, AdapterUnloaded):
            body = ErrorBody(message=str(exc), type="not_found_error", code=404)
        else:
            log.error("generation failed mid-stream", model=model, error=repr(exc))
            message = "internal error (logged by the model server)"
            body = ErrorBody(message=message, type="server_error", code=500)
        self._count(model, "failed")
        with contextlib.suppress(ConnectionResetError, CallerStalled):
            failed = msgspec.json.encode(ErrorResponse(error=body))
            await write_within(http, response, b"data: " + failed + b"\n\n", CALLER_WRITE_S)
            await end_within(http, response, CALLER_WRITE_S)
        return response

    def _adapter_for(self, model: str) -> str | None:
        if model == self.served_name:
            return None
        if model in self.engine.adapters:
            return model
        # not naming what is loaded: every tenant's adapters are, and a router relays the
        # endpoint's 404 to the tenant who asked
        raise ApiError(
            404, f"model {model!r} not found (GET /v1/models lists them)", "not_found_error"
        )

    def _params(self, req: ChatRequest) -> SamplingParams:
        if not req.messages:
            raise ApiError(400, "messages must not be empty")
        _neutral(
            ("top_k", req.top_k, (-1, 0)),
            ("min_p", req.min_p, (0.0,)),
            ("repetition_penalty", req.repetition_penalty, (1.0,)),
        )
        top = req.top_logprobs or 0
        params = _sampling(
            n=req.n,
            temperature=req.temperature,
            top_p=req.top_p,
            seed=req.seed,
            max_tokens=next(
                (m for m in (req.max_completion_tokens, req.max_tokens) if m is not None),
                DEFAULT_MAX_TOKENS,
            ),
            stop=req.stop,
            logprobs=req.logprobs or bool(top),
            top_logprobs=top,
        )
        return dataclasses.replace(params, grammar=_grammar(req))

    def _choice(
        self, index: int, out: Output, prefix: str, tools: tuple[str, ...], single: bool
    ) -> Choice:
        text = prefix + out.text
        message, finish = _message(text, tools, single)
        logprobs = None
        if out.logprobs:
            logprobs = ChoiceLogprobs(
                content=[
                    TokenLogprob(
                        token=t.token,
                        logprob=t.logprob,
                        top_logprobs=[TopLogprob(token=a, logprob=b) for a, b in t.top],
                    )
                    for t in out.logprobs
                ]
            )
        reason = "tool_calls" if finish == "tool_calls" else out.finish_reason
        return Choice(index=index, message=message, finish_reason=reason, logprobs=logprobs)  # type: ignore[arg-type]

    async def _stream(
        self,
        http: web.Request,
        req: ChatRequest,
        prompt_ids: list[int],
        prefix: str,
        params: SamplingParams,
        adapter: str | None,
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(http)
        ident, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        tools = offered_tools(req)
        held: dict[int, str] = {}
        """Per choice: text held back because it may be the start of a tool call."""
        chunks: list[bytes] = []
        usage = req.stream_options is not None and bool(req.stream_options.include_usage)

        def event(choices: list[dict[str, Any]], **extra: Any) -> bytes:
            payload = {
                "id": ident,
                "object": "chat.completion.chunk",
                "created": created,
                "model": req.model,
                "choices": choices,
                **extra,
            }
            return b"data: " + json.dumps(payload).encode() + b"\n\n"

        def chunk(index: int, delta: dict[str, Any], finish: str | None = None) -> bytes:
            # asked for usage, every chunk has the field, null but in the last (OpenAI's way)
            extra = {"usage": None} if usage else {}
            return event([{"index": index, "delta": delta, "finish_reason": finish}], **extra)

        def on_delta(d: Delta) -> None:
            index, text = d
            if tools:
                held[index] = held.get(index, prefix) + text
                return  # tool calls are sent whole at the end
            chunks.append(chunk(index, {"content": text}))

        for i in range(req.n):
            # with tools every text is held back (it may be a call) and sent whole at the end,
            # the forced opening of a call with it: the first chunk carries only the role
            chunks.append(chunk(i, {"role": "assistant", "content": ""}))
        job = asyncio.ensure_future(
            self.engine.generate(prompt_ids, params, adapter=adapter, n=req.n, on_delta=on_delta)
        )

        async def write(piece: bytes) -> None:
            await write_within(http, response, piece, CALLER_WRITE_S)

        try:
            while not job.done() or chunks:
                while chunks:
                    await write(chunks.pop(0))
                if not job.done():
                    await asyncio.wait([job], timeout=0.02)
        except (ConnectionResetError, CallerStalled) as exc:
            return self._left(response, req.model, exc)
        finally:
            job.cancel()  # done already, or its caller gone: the engine drops its rows
        try:
            outputs = job.result()
        except Exception as exc:  # noqa: BLE001  the status went out: an error event ends it
            return await self._broken_off(http, response, req.model, exc)
        try:
            for i, out in enumerate(outputs):
                message, finish = _message(
                    prefix + out.text, tools, req.parallel_tool_calls is False
                )
                delta: dict[str, Any] = {}
                if tools:
                    delta = msgspec.to_builtins(message)
                    delta.pop("role", None)
                    for number, call in enumerate(delta.get("tool_calls") or []):
                        call["index"] = number  # a streamed call is addressed by its index
                reason = "tool_calls" if finish == "tool_calls" else out.finish_reason
                await write(chunk(i, delta, reason))
            if usage:
                completion = sum(len(o.token_ids) for o in outputs)
                counted = Usage(
                    prompt_tokens=len(prompt_ids),
                    completion_tokens=completion,
                    total_tokens=len(prompt_ids) + completion,
                )
                await write(event([], usage=msgspec.to_builtins(counted)))
            await write(b"data: [DONE]\n\n")
            await end_within(http, response, CALLER_WRITE_S)  # aiohttp's own has no limit
        except (ConnectionResetError, CallerStalled) as exc:
            return self._left(response, req.model, exc)
        self._count(req.model, "ok")
        return response

    def _left(self, response: web.StreamResponse, model: str, why: Exception) -> web.StreamResponse:
        """A stream whose caller hung up, or read nothing for `CALLER_WRITE_S` (its
        connection aborted): counted, and its generation already cancelled."""
        stalled = isinstance(why, CallerStalled)
        log.debug(
            "caller stopped reading a stream" if stalled else "caller left a stream", model=model
        )
        self._count(model, "caller_stalled" if stalled else "caller_left")
        return response

    # -- completions ----------------------------------------------------------------------------
    async def completions(self, request: web.Request) -> web.Response:
        """Plain completions; a prompt of token ids is generated from as it is, and
        `return_token_ids` gives each choice's tokens, the stop token included (as vLLM)."""
        req = await self._decode(request, CompletionRequest)
        _applied(await self._decode(request, Unapplied))
        if req.stream:
            raise ApiError(
                400, "serve-model does not stream /v1/completions; stream /v1/chat/completions"
            )
        adapter = self._adapter_for(req.model)
        # off the event loop, as chat prompts are: a 4 MiB prompt takes seconds to tokenize
        prompt_ids = await asyncio.get_running_loop().run_in_executor(
            self._prompt_thread, self._prompt_ids, req.prompt
        )
        stop_ids = tuple(req.stop_token_ids or ())
        self._check_ids(list(stop_ids), "stop_token_ids")
        _neutral(
            ("top_k", req.top_k, (-1, 0)),
            ("min_p", req.min_p, (0.0,)),
            ("repetition_penalty", req.repetition_penalty, (1.0,)),
        )
        if req.logprobs is not None and req.logprobs < 0:
            raise ApiError(400, "logprobs must be between 0 and 20")
        params = _sampling(
            n=req.n,
            temperature=req.temperature,
            top_p=req.top_p,
            seed=req.seed,
            max_tokens=req.max_tokens,
            stop=req.stop,
            logprobs=req.logprobs is not None,
            top_logprobs=req.logprobs or 0,
            stop_token_ids=stop_ids,
        )
        self._check_fits(prompt_ids, params)
        outputs = await self.engine.generate(prompt_ids, params, adapter=adapter, n=req.n)
        self._count(req.model, "ok")
        body = await self._written(params, _completion_body, req, outputs, prompt_ids)
        return web.Response(body=body, content_type="application/json")

    def _prompt_ids(self, prompt: list[int] | str) -> list[int]:
        if isinstance(prompt, str):
            ids = list(self.prompts.tokenizer(prompt)["input_ids"])
        else:
            ids = prompt
            self._check_ids(ids, "prompt")
        if not ids:
            raise ApiError(400, "prompt must not be empty")
        return ids

    def _check_fits(self, prompt_ids: list[int], params: SamplingParams) -> None:
        if len(prompt_ids) + params.max_tokens > self.max_context:
            raise ApiError(
                400,
                f"prompt ({len(prompt_ids)} tokens) + max_tokens ({params.max_tokens}) "
                f"exceeds the context window of {self.max_context}",
            )

    def _check_ids(self, ids: list[int], what: str) -> None:
        bad = next((t for t in ids if not 0 <= t < self.vocab), None)
        if bad is not None:
            raise ApiError(
                400, f"{what} holds token id {bad}, outside the vocabulary [0, {self.vocab})"
            )

    def _count(self, model: str, status: str) -> None:
        self.requests.labels(model, status).inc()

    # -- models and adapters ---------------------------------------------------------------------
    async def models(self, _: web.Request) -> web.Response:
        cards = [ModelCard(id=self.served_name, created=self.created, root=self.served_name)]
        cards += [
            ModelCard(id=name, created=self.created, root=path, parent=self.served_name)
            for name, path in self.engine.adapters.items()
        ]
        return web.Response(
            body=msgspec.json.encode(ModelList(data=cards)), content_type="application/json"
        )

    async def load_adapter(self, request: web.Request) -> web.Response:
        req = await self._decode(request, LoadAdapterRequest)
        if req.lora_name == self.served_name:
            raise ApiError(400, "an adapter cannot take the base model's name")
        if req.lora_name in self.engine.adapters:
            raise ApiError(400, f"adapter {req.lora_name!r} is already loaded")
        try:
            path = await self.access.adapter_path(req.lora_path)
        except OutsideStore as exc:
            raise ApiError(403, exc.message, "permission_error") from exc
        try:
            found = (path / "adapter_config.json").exists()
        except (OSError, ValueError):  # a name too long for the filesystem: it was a 500
            found = False
        if not found:
            raise ApiError(400, f"no PEFT adapter at {path} (adapter_config.json missing)")
        await self._changed(self._loaded(req.lora_name, path))
        log.info("adapter loaded", name=req.lora_name, path=str(path))
        return web.Response(text=f"Success: LoRA adapter '{req.lora_name}' added successfully.")

    async def _changed(self, change: Coroutine[Any, Any, None]) -> None:
        """Run a load or unload to its end whatever happens to the request that asked (the
        server cancels a request whose caller left: the lock was given back while the
        engine still changed the adapters, and a second change of the name got past its
        check)."""
        task = asyncio.ensure_future(change)
        # its outcome, where nobody waits for it any more, is taken (and logged, above)
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        await asyncio.shield(task)

    async def _loaded(self, name: str, path: Path) -> None:
        async with self._changing:  # one load or unload at a time: each checks, then acts
            if name in self.engine.adapters:
                raise ApiError(400, f"adapter {name!r} is already loaded")
            try:
                await self.engine.run_on_engine(lambda: self._load(name, str(path)))
            except Exception as exc:  # any reason its files do not load: the admin's 400
                log.warning("adapter not loaded", name=name, error=repr(exc)[:2000])
                raise ApiError(400, f"cannot load adapter {name!r}: {str(exc)[:500]}") from exc

    async def _unloaded(self, name: str) -> None:
        async with self._changing:
            if name not in self.engine.adapters:
                raise ApiError(404, f"adapter {name!r} is not loaded", "not_found_error")
            await self.engine.run_on_engine(lambda: self._unload(name))

    def _load(self, name: str, path: str) -> None:
        """Load an adapter; one that fails to load leaves the model as it was. (PEFT puts
        the LoRA layers in before it reads the weights: a first adapter whose weights did not
        fit left the base model holding them, and every request failed until a restart.)"""
        from peft import PeftConfig, PeftModel, get_peft_model

        model = self.engine.model
        if isinstance(model, PeftModel):
            try:
                model.load_adapter(path, adapter_name=name)
            except BaseException:
                if name in model.peft_config:
                    model.delete_adapter(name)
                    if self.engine.adapters:
                        model.set_adapter(next(iter(self.engine.adapters)))
                raise
        else:
            wrapped = get_peft_model(model, PeftConfig.from_pretrained(path), adapter_name=name)
            try:
                wrapped.load_adapter(path, adapter_name=name)
            except BaseException:
                self.engine.model = wrapped.unload()  # the LoRA layers out again
                raise
            self.engine.model = wrapped
        self.engine.model.eval()
        self.engine.adapters[name] = path
        self.engine.kv.drop(name)

    async def unload_adapter(self, request: web.Request) -> web.Response:
        req = await self._decode(request, UnloadAdapterRequest)
        await self._changed(self._unloaded(req.lora_name))
        log.info("adapter unloaded", name=req.lora_name)
        return web.Response(text=f"Success: LoRA adapter '{req.lora_name}' removed successfully.")

    def _unload(self, name: str) -> None:
        remaining = [a for a in self.engine.adapters if a != name]
        if remaining:
            self.engine.model.delete_adapter(name)
            self.engine.model.set_adapter(remaining[0])
        else:
            # The last adapter: strip the LoRA layers and serve the plain base model again.
            self.engine.model = self.engine.model.unload()
        del self.engine.adapters[name]
        self.engine.kv.drop(name)

    async def health(self, _: web.Request) -> web.Response:
        """200 while the engine generates; 503 once its thread has stopped (every request
        would then wait for ever: health said ok all the same)."""
        alive = self.engine.alive
        health = ServerHealth(
            status="ok" if alive else "engine stopped",
            model=self.served_name,
            adapters=len(self.engine.adapters),
        )
        return web.Response(
            body=msgspec.json.encode(health),
            status=200 if alive else 503,
            content_type="application/json",
        )

    async def metrics(self, _: web.Request) -> web.Response:
        self.tokens.set(self.engine.stats.generated_tokens)
        self.batches.set(self.engine.stats.batches)
        self.prompt_tokens.set(self.engine.stats.prompt_tokens)
        self.prefilled.set(self.engine.stats.prefilled_tokens)
        return web.Response(
            body=generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )


def _completion_choice(index: int, out: Output, req: CompletionRequest) -> CompletionChoice:
    ids = out.token_ids + ([out.stop_token] if out.stop_token is not None else [])
    logprobs = None
    if req.logprobs is not None:
        logprobs = CompletionLogprobs(
            tokens=[t.token for t in out.logprobs],
            token_logprobs=[t.logprob for t in out.logprobs],
            top_logprobs=[dict(t.top) for t in out.logprobs] if req.logprobs else None,
        )
    return CompletionChoice(
        index=index,
        text=out.text,
        finish_reason=out.finish_reason,
        logprobs=logprobs,
        token_ids=ids if req.return_token_ids else None,
    )


def _completion_body(req: CompletionRequest, outputs: list[Output], prompt_ids: list[int]) -> bytes:
    choices = [_completion_choice(i, o, req) for i, o in enumerate(outputs)]
    written = sum(len(o.token_ids) + (o.stop_token is not None) for o in outputs)
    response = CompletionResponse(
        id=f"cmpl-{uuid.uuid4().hex}",
        created=int(time.time()),
        model=req.model,
        choices=choices,
        usage=Usage(
            prompt_tokens=len(prompt_ids),
            completion_tokens=written,
            total_tokens=len(prompt_ids) + written,
        ),
    )
    return msgspec.json.encode(response)


def _grammar(req: ChatRequest) -> Grammar | None:
    """What `tool_choice` and `response_format` make the reply follow, checked: a named
    function must be one of the tools, and a JSON schema is refused rather than ignored."""
    offered = offered_tools(req)
    if isinstance(req.tool_choice, dict):
        name = req.tool_choice["function"]["name"]
        if name not in offered:
            raise ApiError(400, f"tool_choice names {name!r}, which is not among the tools")
    elif req.tool_choice == "required" and not offered:
        raise ApiError(400, 'tool_choice "required" needs tools')
    kind = req.response_format.type if req.response_format else None
    if kind == "json_schema":
        raise ApiError(
            400,
            'response_format "json_schema" is not supported by this server (replies can be '
            'held to "json_object"); ask an endpoint with schema-guided decoding (vLLM)',
        )
    return for_request(req.tool_choice, offered, kind)


def _sampling(
    *,
    n: int,
    temperature: float,
    top_p: float,
    seed: int | None,
    max_tokens: int,
    stop: str | list[str] | None,
    logprobs: bool,
    top_logprobs: int,
    stop_token_ids: tuple[int, ...] = (),
) -> SamplingParams:
    """Sampling settings of a chat or completion request, each checked with a clear error."""
    if not 1 <= n <= MAX_N:
        raise ApiError(400, f"n must be between 1 and {MAX_N}")
    if temperature < 0 or temperature > 5 or 0 < temperature < MIN_TEMPERATURE:
        raise ApiError(400, f"temperature must be 0 (greedy) or between {MIN_TEMPERATURE} and 5")
    if seed is not None and not 0 <= seed < MAX_SEED:
        raise ApiError(400, f"seed must be between 0 and {MAX_SEED - 1}")
    if not 0 < top_p <= 1:
        raise ApiError(400, "top_p must be in (0, 1]")
    if max_tokens < 1:
        raise ApiError(400, "max_tokens must be at least 1")
    if not 0 <= top_logprobs <= 20:
        raise ApiError(400, "top_logprobs must be between 0 and 20")
    stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
    if len(stops) > MAX_STOPS or any(len(s) > MAX_STOP_CHARS for s in stops):
        # each is looked for after every token of every row: 280,000 of them held the
        # engine 40 ms a token for every request in the batch
        raise ApiError(
            400, f"stop takes {MAX_STOPS} strings at most, each {MAX_STOP_CHARS} characters"
        )
    if len(stop_token_ids) > MAX_STOP_TOKEN_IDS:
        raise ApiError(400, f"stop_token_ids takes {MAX_STOP_TOKEN_IDS} ids at most")
    return SamplingParams(
        temperature=temperature,
        top_p=top_p,
        max_tokens=max_tokens,
        seed=seed,
        stop=stops,
        stop_token_ids=stop_token_ids,
        logprobs=logprobs,
        top_logprobs=top_logprobs,
    )


def _message(
    text: str, tools: tuple[str, ...], single: bool = False
) -> tuple[ResponseMessage, str | None]:
    """The assistant message for generated text; tool calls parsed when tools were offered
    (the first only where `single`: `parallel_tool_calls` false)."""
    if not tools:
        return ResponseMessage(content=text), None
    parsed = parse_reply(text, tools)
    calls = [
        ToolCall(
            id=f"call_{uuid.uuid4().hex[:24]}",
            function=ToolCallFunction(name=c.name, arguments=c.arguments),
        )
        for c in parsed.calls
    ][: 1 if single else None]
    errors = [f"{m.error}: {m.raw[:500]}" for m in parsed.malformed]
    message = ResponseMessage(
        content=parsed.content,
        tool_calls=calls or None,
        tool_call_errors=errors or None,
        tool_call_format=parsed.form,
    )
    return message, "tool_calls" if calls else None


CALLER_WRITE_S = WRITE_TIMEOUT_S
"""How long a stream's write waits for its caller to read: a caller who stopped reading held
its handler, and every token its rows went on generating, for ever."""
MAX_TOOL_DEPTH = 64
"""Levels a tool's definition may nest: a chat template renders it recursively, and one
nested 500 deep took the template past Python's recursion limit (a 500). Checked here, not
where every chat request is read (the router: three times the cost of reading the request
with two dozen tools)."""


def _deeper_than(value: Any, depth: int) -> bool:
    """Whether `value` nests objects and arrays more than `depth` levels deep."""
    level: list[Any] = [value]
    for _ in range(depth):
        level = [
            child
            for v in level
            for child in (v.values() if isinstance(v, dict) else v if isinstance(v, list) else ())
            if isinstance(child, dict | list)
        ]
        if not level:
            return False
    return True


class Unapplied(msgspec.Struct, kw_only=True, frozen=True):
    """Settings of OpenAI's and vLLM's requests that serve-model does not apply: given a
    value that would change the reply, a request is refused, not answered as if they had
    been (every request's body is read as this too; unknown fields are ignored)."""

    best_of: int | None = None
    min_tokens: int | None = None
    ignore_eos: bool | None = None
    typical_p: float | None = None
    length_penalty: float | None = None
    use_beam_search: bool | None = None
    echo: bool | None = None
    suffix: str | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    structured_outputs: Any = None


def _applied(u: Unapplied) -> None:
    _neutral(
        ("best_of", u.best_of, (1,)),
        ("min_tokens", u.min_tokens, (0,)),
        ("ignore_eos", u.ignore_eos, (False,)),
        ("typical_p", u.typical_p, (1.0,)),
        ("length_penalty", u.length_penalty, (1.0,)),
        ("use_beam_search", u.use_beam_search, (False,)),
        ("echo", u.echo, (False,)),
        ("suffix", u.suffix or None, (None,)),
        ("presence_penalty", u.presence_penalty, (0.0,)),
        ("frequency_penalty", u.frequency_penalty, (0.0,)),
        ("logit_bias", {t: b for t, b in (u.logit_bias or {}).items() if b} or None, (None,)),
        ("guided_json", u.guided_json, (None,)),
        ("guided_regex", u.guided_regex, (None,)),
        ("guided_choice", u.guided_choice, (None,)),
        ("guided_grammar", u.guided_grammar, (None,)),
        ("structured_outputs", u.structured_outputs, (None,)),
    )


def _neutral(*settings: tuple[str, object, tuple[object, ...]]) -> None:
    """A 400 for a sampling setting serve-model does not apply, given a value that would
    change what is drawn (ignoring it would answer as if it had: vLLM applies them)."""
    for name, value, neutral in settings:
        if value is not None and value not in neutral:
            unset = "leave it unset" + ("" if neutral[0] is None else f" or {neutral[0]}")
            raise ApiError(400, f"serve-model samples without {name}: {unset}")
