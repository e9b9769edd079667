"""A smaller query encoder for routing, distilled from all-MiniLM-L6-v2, and scored as
`benchmarks/static_routing.py` scores the routing embedders.

Routing's `cascade-int8` embeds a new conversation's request with MiniLM's int8 graph where
the static vectors are not sure. On a CPU without VNNI that is 2.3 to 2.5 ms a query
(docs/benchmarks.md), most of what the router adds to such a request. MiniLM's first two
layers alone take a third of that. This trains such a student to give MiniLM's vectors, so
that it can stand in for MiniLM on the query side while MiniLM keeps embedding the profiles
(routing's `cascade-distilled`, `shared.routing.query_encoder`).

    # here: the corpora, and the teacher in a form small enough to carry to a GPU machine
    python -m benchmarks.distill_query_encoder corpus --out .distill/corpus2.txt.gz
    pip download --no-deps -d /tmp/dl bfcl-eval==2026.3.23 chatterbot-corpus==1.3.3
    python -m benchmarks.distill_query_encoder corpus --wheel /tmp/dl/*.whl \\
        --out .distill/requests.txt.gz
    python -m benchmarks.distill_query_encoder pack --out .distill/teacher
    # on any machine (cuda where there is one): MiniLM's vectors, then a student per --layers
    python -m benchmarks.distill_query_encoder train --corpus .distill/corpus2.txt.gz \\
        --teacher .distill/teacher --layers 0,1 --epochs 8 --batch 256 --lr 5e-4 \\
        --out .distill/gpu/student.pt
    python -m benchmarks.distill_query_encoder train --corpus .distill/requests.txt.gz \\
        .distill/corpus2.txt.gz --limit 16000 --init .distill/gpu/student-0-1.pt \\
        --teacher .distill/teacher --layers 0,1 --epochs 3 --batch 128 --lr 2e-4 \\
        --out .distill/ft/student.pt
    # here: routing with each student (torch fp32) and the shipped one (its int8 graph)
    python -m benchmarks.distill_query_encoder ship --student .distill/ft/student-0-1.pt
    python -m benchmarks.distill_query_encoder score --student .distill/ft/student-0-1.pt \\
        --shipped --out /tmp/distill_score.json

The corpus is sentences of the text installed packages carry (their documentation files,
docstrings and the tau2 tasks' words), and with `--wheel` the texts of request datasets that
ship on PyPI, none of them a request of the routing benchmark (those and its unrelated
requests are taken out, and counted). Documentation alone left the students far from
MiniLM on short requests (docs/benchmarks.md, session 19). The student keeps MiniLM's
token embeddings (frozen) and starts from the layers named; it learns MiniLM's mean-pooled
unit vectors (cosine loss) and, in each batch, the cosines between them (what routing
compares).
"""

from __future__ import annotations

import argparse
import ast
import gzip
import json
import math
import random
import re
import sys
import sysconfig
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from shared.embeddings import pooled
from shared.routing.query_encoder import WEIGHTS, student_of, with_weights

SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'(])")
CODE_LIKE = re.compile(r"[{}\[\]<>=_|\\`#^~*]|::|\.\w+\(|https?:|/\w+/|\w\.\w+\.\w+\(")
PLAIN = frozenset(" .,:;'\"!?-+()%$@&/")
"""What a request typed by a person holds besides letters and digits (times, prices, an
email address): a corpus of letters alone left the student's vectors of such requests at a
cosine of 0.75 to MiniLM's, against 0.92 for prose."""
MIN_WORDS, MAX_WORDS = 3, 48


def sentences(text: str, *, whole: bool = False) -> Iterator[str]:
    """The prose sentences of `text`: whitespace collapsed, split after `.`, `!` or `?`,
    each of `MIN_WORDS` to `MAX_WORDS` words, mostly letters, with nothing that reads as
    code, markup or a path. With `whole`, a paragraph short enough is kept as one (a
    request of two sentences is one text to route)."""
    for paragraph in re.split(r"\n\s*\n", text):
        flat = " ".join(paragraph.split())
        parts = [flat] if whole and len(flat.split()) <= MAX_WORDS else SENTENCE_END.split(flat)
        for sentence in parts:
            words = sentence.split()
            if not MIN_WORDS <= len(words) <= MAX_WORDS or CODE_LIKE.search(sentence):
                continue
            letters = sum(c.isalpha() or c == " " for c in sentence)
            plain = sum(c.isalnum() or c in PLAIN for c in sentence)
            if (
                plain == len(sentence)
                and letters >= 0.6 * len(sentence)
                and (sentence[0].isalnum() or sentence[0] in "'\"")
            ):
                yield sentence


def _docstrings(source: str) -> Iterator[str]:
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return
    for node in ast.walk(tree):
        if isinstance(
            node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef
        ) and (doc := ast.get_docstring(node)):
            yield doc


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def package_texts(root: Path) -> Iterator[str]:
    """The prose under `root` (site-packages): documentation files, Python docstrings, and
    the strings of JSON files (tau2's tasks and policies)."""
    for path in sorted(root.rglob("*")):
        if not path.is_file() or path.stat().st_size > 4_000_000:
            continue
        try:
            if path.suffix in (".md", ".rst", ".txt"):
                yield path.read_text(errors="ignore")
            elif path.suffix == ".py":
                yield from _docstrings(path.read_text(errors="ignore"))
            elif path.suffix == ".json" and "tau2" in path.parts:
                yield from _strings(json.loads(path.read_text(errors="ignore")))
        except (OSError, ValueError, RecursionError):
            continue


def wheel_texts(wheel: Path) -> Iterator[str]:
    """The strings of the data files (JSON, JSON lines, YAML) in a downloaded wheel: the
    requests of datasets that ship on PyPI (`pip download --no-deps bfcl-eval`)."""
    import zipfile

    import yaml

    with zipfile.ZipFile(wheel) as archive:
        for name in sorted(archive.namelist()):
            if not name.endswith((".json", ".jsonl", ".yml", ".yaml")):
                continue
            raw = archive.read(name).decode(errors="ignore")
            try:
                if name.endswith((".yml", ".yaml")):
                    yield from _strings(yaml.safe_load(raw))
                    continue
                yield from _strings(json.loads(raw))
            except (ValueError, yaml.YAMLError):  # JSON lines: one document a line
                for line in raw.splitlines():
                    try:
                        yield from _strings(json.loads(line))
                    except ValueError:
                        continue


def benchmark_requests() -> set[str]:
    """Every request the routing benchmark embeds, casefolded: the environments' opening
    requests (train and test) and the unrelated ones."""
    from benchmarks.static_routing import UNRELATED, UNRELATED_HELD_OUT, requests

    texts = [t for _, _, t in requests()] + list(UNRELATED) + list(UNRELATED_HELD_OUT)
    return {" ".join(t.split()).casefold() for t in texts}


def build_corpus(
    texts: Iterable[str], excluded: set[str], limit: int, seed: int, *, whole: bool = False
) -> dict[str, Any]:
    """Distinct sentences of `texts` (`sentences`) with none in `excluded` (or holding
    one), shuffled by `seed`, at most `limit` of them."""
    seen: dict[str, str] = {}
    dropped = 0
    inside = re.compile("|".join(re.escape(e) for e in sorted(excluded) if len(e) > 20) or "$^")
    for text in texts:
        for sentence in sentences(text, whole=whole):
            key = sentence.casefold()
            if key in seen:
                continue
            if key in excluded or inside.search(key):
                dropped += 1
                continue
            seen[key] = sentence
    ordered = sorted(seen.values())
    random.Random(seed).shuffle(ordered)
    return {"sentences": ordered[:limit], "distinct": len(ordered), "excluded": dropped}


def corpus_command(args: argparse.Namespace) -> None:
    root = Path(sysconfig.get_paths()["purelib"])
    started = time.perf_counter()
    if args.wheel:  # requests as people write them, kept whole where short
        texts = (t for wheel in args.wheel for t in wheel_texts(wheel))
        built = build_corpus(texts, benchmark_requests(), args.limit, args.seed, whole=True)
    else:
        built = build_corpus(package_texts(root), benchmark_requests(), args.limit, args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(args.out, "wt") as f:
        f.write("\n".join(built["sentences"]) + "\n")
    print(
        json.dumps(
            {
                "source": [str(w) for w in args.wheel] or str(root),
                "distinct": built["distinct"],
                "kept": len(built["sentences"]),
                "benchmark_requests_excluded": built["excluded"],
                "seconds": round(time.perf_counter() - started, 1),
            }
        )
    )


def pack_command(args: argparse.Namespace) -> None:
    """MiniLM's encoder as transformers reads it, weights in fp16 (45 MB, under what travels
    to a GPU machine); `train` widens them to fp32 again."""
    import torch

    from shared.embeddings import MiniLM, _model_dir

    model = MiniLM()._load()[0].auto_model
    model.half().save_pretrained(args.out, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (_model_dir() / name).exists():
            (args.out / name).write_bytes((_model_dir() / name).read_bytes())
    print(json.dumps({"out": str(args.out), "torch": torch.__version__}))


def _batches(order: list[int], size: int) -> Iterator[list[int]]:
    for start in range(0, len(order), size):
        yield order[start : start + size]


class Padded:
    """Every text's token ids in one tensor, padded to the longest, on `device`: a batch is
    an index and a slice, not a tensor built row by row."""

    def __init__(self, ids: list[list[int]], device: str) -> None:
        import torch

        self.lengths = torch.tensor([len(i) for i in ids])
        width = int(self.lengths.max())
        table = torch.zeros((len(ids), width), dtype=torch.long)
        for row, own in enumerate(ids):
            table[row, : len(own)] = torch.tensor(own)
        self.table = table.to(device)
        self.device = device

    def __call__(self, rows: list[int]) -> tuple[Any, Any]:
        import torch

        width = int(self.lengths[rows].max())
        ids = self.table[rows, :width]
        mask = torch.arange(width, device=self.device) < self.lengths[rows, None].to(self.device)
        return ids, mask.long()


def train_command(args: argparse.Namespace) -> None:
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModel

    torch.manual_seed(args.seed)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    teacher = AutoModel.from_pretrained(args.teacher, dtype=torch.float32).to(device).eval()
    tokenizer = Tokenizer.from_file(str(args.teacher / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(args.max_tokens)
    texts = []
    for corpus in args.corpus:  # the first `limit` of each
        with gzip.open(corpus, "rt") as f:
            texts += [line.rstrip("\n") for line in f if line.strip()][: args.limit]
    random.Random(args.seed).shuffle(texts)
    ids = [e.ids for e in tokenizer.encode_batch(texts)]
    padded = Padded(ids, device)
    held = max(1, len(ids) // 50)
    train_rows, held_rows = list(range(held, len(ids))), list(range(held))
    started = time.perf_counter()
    targets = torch.zeros((len(ids), teacher.config.hidden_size), device=device)
    by_length = sorted(range(len(ids)), key=lambda r: len(ids[r]))
    with torch.inference_mode():
        for rows in _batches(by_length, 512):
            targets[rows] = pooled(teacher, *padded(rows))
    teacher_s = time.perf_counter() - started
    runs = {}
    for spec in args.layers:
        layers = [int(x) for x in spec.split(",")]
        runs[spec] = _train_one(args, teacher, layers, padded, targets, train_rows, held_rows)
        runs[spec]["teacher_s"] = teacher_s
    print(json.dumps({"device": device, "sentences": len(ids), "runs": runs}))


def _train_one(
    args: argparse.Namespace,
    teacher: Any,
    layers: list[int],
    padded: Padded,
    targets: Any,
    train_rows: list[int],
    held_rows: list[int],
) -> dict[str, Any]:
    import torch

    student = student_of(teacher, layers)
    if args.init:  # go on from a student trained before (on another corpus)
        saved = torch.load(args.init, weights_only=True)
        if saved["layers"] != layers:
            raise ValueError(f"{args.init} has layers {saved['layers']}, not {layers}")
        student.load_state_dict(saved["state"], strict=False)
    student.train()
    trainable = [p for p in student.parameters() if p.requires_grad]
    optimiser = torch.optim.AdamW(trainable, lr=args.lr, weight_decay=0.01)
    steps = args.epochs * math.ceil(len(train_rows) / args.batch)
    warmup = max(1, steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimiser,
        lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / steps))),
    )
    rng = random.Random(args.seed)
    history = []
    started = time.perf_counter()
    for epoch in range(args.epochs):
        order = train_rows[:]
        rng.shuffle(order)
        total = 0.0
        for rows in _batches(order, args.batch):
            out = pooled(student, *padded(rows))
            want = targets[rows]
            loss = (1 - (out * want).sum(-1)).mean()
            loss = loss + args.relational * torch.nn.functional.mse_loss(out @ out.T, want @ want.T)
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            optimiser.step()
            schedule.step()
            total += float(loss.detach()) * len(rows)
        held_cos = _held_cosine(student, padded, targets, held_rows)
        history.append(
            {
                "epoch": epoch + 1,
                "loss": total / len(train_rows),
                "held_out_cosine": held_cos,
                "seconds": round(time.perf_counter() - started, 1),
            }
        )
        print(json.dumps({"layers": layers, **history[-1]}), file=sys.stderr, flush=True)
    # fp16 (a 3-layer student's 22 MB in fp32 is over what comes back from a GPU machine);
    # its vectors move by a cosine under 1e-5, and routing runs it in int8
    state = {
        k: v.detach().half().cpu()
        for k, v in student.state_dict().items()
        if "word_embeddings" not in k
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    name = args.out.with_name(f"{args.out.stem}-{'-'.join(map(str, layers))}{args.out.suffix}")
    torch.save({"layers": layers, "state": state, "history": history}, name)
    return {"layers": layers, "file": str(name), "history": history}


def _held_cosine(student: Any, padded: Padded, targets: Any, rows: list[int]) -> float:
    import torch

    student.eval()
    cosines = []
    with torch.inference_mode():
        for batch in _batches(rows, 512):
            out = pooled(student, *padded(batch))
            cosines.append((out * targets[batch]).sum(-1))
    student.train()
    return float(torch.cat(cosines).mean())


class Student:
    """A trained student as a routing embedder (torch, fp32)."""

    def __init__(self, path: Path) -> None:
        import torch

        from shared.embeddings import MiniLM, _tokenizer

        saved = torch.load(path, weights_only=True)
        teacher = MiniLM()._load()[0].auto_model
        self.model = with_weights(teacher, saved["state"], saved["layers"], str(path))
        self.tokenizer = _tokenizer()
        self.tokenizer.enable_padding()

    def embed(self, texts: list[str], /) -> list[list[float]]:
        import torch

        encoded = self.tokenizer.encode_batch(list(texts))
        ids = torch.tensor([e.ids for e in encoded])
        mask = torch.tensor([e.attention_mask for e in encoded])
        with torch.inference_mode():
            return pooled(self.model, ids, mask).tolist()


def score_command(args: argparse.Namespace) -> None:
    """Each embedder alone on the routing benchmark, and routing's cascade with it (the
    static vectors where they are sure, the embedder between; `static_routing.cascade`)."""
    from benchmarks.static_routing import SHOWN, cascade, requests, score
    from shared.embeddings import MiniLM, OnnxMiniLM, StaticMiniLM

    rows = requests()
    teacher = MiniLM()
    static = score(StaticMiniLM(), rows)
    results: dict[str, Any] = {
        "minilm": score(teacher, rows),
        "minilm-int8": score(OnnxMiniLM(int8=True), rows, by=teacher),
    }
    for path in args.student:
        results[path.stem] = score(Student(path), rows, by=teacher)
    if args.shipped:  # what routing's `cascade-distilled` runs
        results["shipped, int8 graph"] = score(
            OnnxMiniLM(int8=True, distilled=True), rows, by=teacher
        )
    out = {
        name: {**{k: r[k] for k in SHOWN}, "cascade": cascade(r, static)}
        for name, r in results.items()
    }
    print(json.dumps(out, indent=2))
    if args.out:
        args.out.write_text(json.dumps(out, indent=2) + "\n")


def ship_command(args: argparse.Namespace) -> None:
    """A student's weights as routing's `cascade-distilled` embedder loads them."""
    import torch

    from shared.embeddings import teacher_version
    from shared.routing.query_encoder import save

    saved = torch.load(args.student, weights_only=True)
    save(saved["state"], saved["layers"], teacher_version(), args.out)
    print(json.dumps({"out": str(args.out), "layers": saved["layers"]}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    corpus = commands.add_parser("corpus", help="sentences of the installed packages' text")
    corpus.add_argument("--out", type=Path, required=True)
    corpus.add_argument("--limit", type=int, default=300_000)
    corpus.add_argument("--seed", type=int, default=0)
    corpus.add_argument(
        "--wheel", type=Path, nargs="*", default=[], help="read these wheels' data instead"
    )
    pack = commands.add_parser("pack", help="MiniLM in fp16, to carry to a GPU machine")
    pack.add_argument("--out", type=Path, required=True)
    train = commands.add_parser("train", help="MiniLM's vectors, then a student per --layers")
    train.add_argument("--corpus", type=Path, nargs="+", required=True)
    train.add_argument("--init", type=Path, help="a student to go on from")
    train.add_argument("--teacher", type=Path, required=True)
    train.add_argument("--layers", nargs="+", default=["0,1"], help="e.g. 0,1 0,5 0,2,4")
    train.add_argument("--out", type=Path, required=True)
    train.add_argument("--epochs", type=int, default=8)
    train.add_argument("--batch", type=int, default=128)
    train.add_argument("--lr", type=float, default=3e-4)
    train.add_argument("--relational", type=float, default=1.0)
    train.add_argument("--max-tokens", type=int, default=128)
    train.add_argument("--limit", type=int, default=None)
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--device", default=None)
    scored = commands.add_parser("score", help="routing with each student against MiniLM")
    scored.add_argument("--student", type=Path, nargs="*", default=[])
    scored.add_argument("--shipped", action="store_true", help="also the shipped weights")
    scored.add_argument("--out", type=Path)
    ship = commands.add_parser("ship", help="a student's weights where routing reads them")
    ship.add_argument("--student", type=Path, required=True)
    ship.add_argument("--out", type=Path, default=WEIGHTS)
    args = parser.parse_args()
    {
        "ship": ship_command,
        "corpus": corpus_command,
        "pack": pack_command,
        "train": train_command,
        "score": score_command,
    }[args.command](args)


if __name__ == "__main__":
    main()
