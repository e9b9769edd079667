"""Settings of the router service (`RETRACE_*` blocks, plus `RETRACE_ROUTER_*`)."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from shared.config import ServiceConfig
from shared.embeddings import EmbedderKind
from shared.serving.packaged import DEFAULT_AGENT_MODEL

DEFAULT_PORT = 8080


class RouterConfig(ServiceConfig, kw_only=True, frozen=True):
    mode: Literal["embedding", "classifier", "learned", "base"] = "embedding"
    """How a conversation picks an adapter: `embedding` (the first user turn's similarity
    to each adapter's training scenarios and diagnosed failures), `classifier` (the base
    model's log-probabilities over capability labels), `learned` (the train tasks most like
    the request vote for the configuration that won them in the last promoting cycle;
    embedding until such a cycle exists) or `base` (never routes)."""
    embedder: EmbedderKind = "cascade-learned"
    """The text similarity of the `embedding` mode: `minilm` (the model through ONNX
    Runtime, 3 to 4 ms of one core a query on this project's CPU; PyTorch, 13 to 18 ms,
    where ONNX Runtime is not installed), `minilm-int8` (queries through its ONNX graph
    with int8 weights against the profiles' MiniLM vectors: 0.75 ms on a fast 2-core
    machine, 3.5 to 5.7 ms on a slow one; on the routing benchmark 56.2% of requests to the
    right kind against MiniLM's 54.9%, unrelated ones told apart as well), `static` (its
    token vectors averaged, 0.06 ms; it picks among adapters well but sends many unrelated
    requests to one, so only where every request belongs to some adapter) or
    `cascade-int8` / `cascade` (static where its best score is high enough that no
    unrelated request reached it, or so low that no request of an adapter's kind fell
    there, `minilm-int8` / `minilm` between: docs/benchmarks.md), or `cascade-distilled` /
    `distilled` (queries through a 2-layer encoder distilled from MiniLM,
    `shared.routing.query_encoder`: a third of the int8 graph's time; on the routing
    benchmark the cascade with it sent 63.0% of requests to the right kind against 67.9%
    with the int8 graph, and 2 of 60 unrelated ones to an adapter against 1), or
    `cascade-learned-int8` (the static vectors, then static vectors learned to give
    MiniLM's, each where its own bars say it is sure, then `minilm-int8`: MiniLM asked for
    8 to 11% of the router benchmark's new conversations), or, the default,
    `cascade-learned` / `learned` (the learned vectors on both sides between the static
    bars, `shared.routing.learned_table`: no model on the request path). Against
    `cascade-learned-int8` on the routing benchmark's 428 calibration and check requests
    the default sent 219 of 329 to the right kind against 220, and 4 of 99 unrelated ones
    to an adapter against 1; on a slow 2-core machine (MiniLM's graph 3.5 to 5.7 ms a query)
    the router's added p99 was 5 ms or less in 8 runs of 11 (5.3 to 6.8 in the machine's
    slow spells) against none of 9 (6.5 to 9.1 ms), its rate 1,244 to 1,347 requests/s
    against 1,104 to 1,194 (docs/benchmarks.md, session 26). `learned` mode compares with the
    MiniLM chosen (static vectors under `static`, the learned table under `cascade-learned`
    / `learned`). Keep the evaluator's `routing_embedder` equal."""
    classifier_model: str = DEFAULT_AGENT_MODEL
    """The model on the inference endpoint that classifies, in `classifier` mode."""
    min_confidence: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.5
    """Below this confidence the conversation goes to the base model."""
    profile_examples: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 32
    """Training-scenario requests per adapter the embedding mode compares against."""
    profile_ttl_s: Annotated[float, msgspec.Meta(ge=0)] = 60.0
    """How long an agent's adapter profiles are cached (a promotion shows after this)."""
    max_body_bytes: Annotated[int, msgspec.Meta(ge=1024)] = 4 * 1024 * 1024
    """Largest request body (413 above)."""
    tenant_rate: Annotated[float, msgspec.Meta(ge=0.001, le=1_000_000)] | None = None
    """Requests a second each tenant may make, sustained, through all the deployment's router
    processes together (they tell each other what they let through, over Postgres
    notifications: `services/router/limits.py`); 429 with Retry-After above; None: no
    limit."""
    tenant_burst: Annotated[int, msgspec.Meta(ge=1)] = 20
    """Requests a tenant may make at once after being idle, under `tenant_rate`."""
    upstream_connections: Annotated[int, msgspec.Meta(ge=1, le=100_000)] = 100
    """Connections this process holds to the model server at most; a request that finds
    them all in use waits for one within `model.request_timeout`, then gets a 503."""
    tenant_concurrency: Annotated[int, msgspec.Meta(ge=1)] | None = 50
    """Chat requests one tenant may have in progress at once in this process (a stream
    until its end); above, a 429 with Retry-After. Rates count requests begun, so without
    it one tenant's long or slowly read streams could hold every upstream connection
    (`upstream_connections`) and stall every other tenant; keep it below that. None: no
    limit."""
    tenant_tokens_per_min: Annotated[int, msgspec.Meta(ge=1, le=1_000_000_000)] | None = None
    """Tokens a minute each tenant may use, over all router processes, counted when a
    request is taken as Azure OpenAI counts them: its prompt's characters / 4 plus `n` x its
    `max_tokens` (`max_request_tokens` where it names none). 429 with Retry-After above; a
    request that alone asks for more than a minute's worth is refused saying so. A tenant's
    quota `tokens_per_min` overrides it; None: no limit."""
    max_request_tokens: Annotated[int, msgspec.Meta(ge=1)] | None = 65_536
    """Completion tokens one request may ask for, `n` times its `max_completion_tokens` (or
    `max_tokens`): above, a 400; a request that names no limit is sent with this one shared
    among its `n` choices (`RETRACE_ROUTER_MAX_REQUEST_TOKENS`; None: the endpoint's
    default). A tenant's rate counts requests, so without it one request could ask for the
    context window sixteen times over."""
    key_lookups_per_s: Annotated[float, msgspec.Meta(ge=0.001, le=1_000_000)] = 200.0
    """Store lookups a second, sustained, of presented keys this process does not hold in
    memory and does not know live (`key_index_s`): new or unknown ones; beyond it and
    `key_lookup_burst` such a request gets a 503 with Retry-After, so a flood of made-up keys
    costs Postgres no more than this. A token not shaped like a key is refused (401) without
    any lookup."""
    key_lookup_burst: Annotated[int, msgspec.Meta(ge=1)] = 1000
    """Such lookups at once: a restarted router meets every key in use anew."""
    key_index_s: Annotated[float, msgspec.Meta(ge=0)] = 10.0
    """How often the hashes of the live keys are read again (only when a key was issued,
    revoked or deleted since); a key among them is looked up without spending `key_lookups_per_s`,
    so made-up keys cannot spend it for real ones (a key issued since is looked up from it
    until then). 0: no index, every lookup spends it."""
    unrecorded_limit: Annotated[int, msgspec.Meta(ge=0)] = 10_000
    """Answered turns waiting to be written (each is written after its reply is sent; while
    the store refuses them they wait, oldest first); at this many, new requests are refused
    with a 503 and Retry-After until the store catches up (no reply is made whose turn could
    not be kept)."""
    spool_dir: str | None = None
    """Where turns the store has not taken when the router stops are kept until a router
    starts again (default `<data_dir>/spool/router`; keep it on a volume)."""
    recent_conversations: Annotated[int, msgspec.Meta(ge=0)] = 100_000
    """Conversations kept in memory (the most recently answered), so their next turn needs
    no store read; 0: look every continued conversation up in the store."""
    cache_s: Annotated[float, msgspec.Meta(ge=0)] = 300.0
    """How long API keys, agents and adapters read from the store are kept in memory at
    most. A change to one (revoked, promoted, deleted) drops it at once: Postgres announces
    every change (migration 0007), and while the router cannot hear those announcements it
    reads the store on every request. 0: always read the store."""
