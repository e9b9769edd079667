"""Static token vectors learned to give MiniLM's sentence vectors, scored for routing as
`benchmarks/static_routing.py` scores the routing embedders.

Routing's static vectors (`shared.embeddings.StaticMiniLM`) are each vocabulary token through
MiniLM alone: a text's vector is the mean of its tokens'. That costs 0.06 ms a query against
2 to 4 ms for MiniLM's int8 graph, but it tells a request that belongs to no adapter far less
well than MiniLM, so the cascade asks MiniLM about most new conversations. Here the table is
trained instead (the tokenlearn recipe of Model2Vec): a text's mean token vector, made unit
length, should have MiniLM's own vector's direction, and the batch's cosines MiniLM's.

    # the requests' corpus (as for benchmarks/distill_query_encoder.py)
    pip download --no-deps -d /tmp/dl bfcl-eval==2026.3.23 chatterbot-corpus==1.3.3
    python -m benchmarks.distill_query_encoder corpus --wheel /tmp/dl/*.whl \\
        --out .distill/requests.txt.gz
    # MiniLM's vectors of the requests, then the table (as shipped: the requests alone; with
    # documentation sentences too it routed worse, docs/benchmarks.md)
    python -m benchmarks.learned_static teacher --corpus .distill/requests.txt.gz \\
        --out .distill/static_teacher.npz
    python -m benchmarks.learned_static train --teacher .distill/static_teacher.npz \\
        --variant table --epochs 6 --lr 3e-3 --out .distill/static_table.npy
    python -m benchmarks.learned_static score --table .distill/static_table.npy \\
        --out /tmp/learned_static_score.json
    # the rows routing loads (shared/routing/learned-static.npz), and the bars of the
    # learned table as the stage between the static vectors and MiniLM's int8 graph
    python -m benchmarks.learned_static ship --table .distill/static_table.npy
    python -m benchmarks.learned_static bars --out docs/bench/learned_static_bars_s23.json

Variants: `table` learns every row (tokens the corpus never holds keep MiniLM's static
vector); `linear` keeps MiniLM's static vectors, learning one 384 x 384 map for all of them
and a weight per token (small enough to ship as it is, and no token is left untrained).
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import random
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.distill_query_encoder import Padded, _batches
from benchmarks.static_routing import THRESHOLD


def read_corpus(paths: list[Path], limit: int | None) -> list[str]:
    texts: list[str] = []
    for corpus in paths:  # the first `limit` of each
        with gzip.open(corpus, "rt") as f:
            texts += [line.rstrip("\n") for line in f if line.strip()][:limit]
    return texts


def teacher_command(args: argparse.Namespace) -> None:
    from shared.embeddings import MiniLM

    texts = read_corpus(args.corpus, args.limit)
    random.Random(args.seed).shuffle(texts)
    model = MiniLM()._load()
    started = time.perf_counter()
    vectors = model.encode(
        texts, batch_size=256, normalize_embeddings=True, convert_to_numpy=True
    ).astype(np.float16)
    np.savez(args.out, texts=np.array(texts, dtype=object), vectors=vectors)
    print(json.dumps({"sentences": len(texts), "seconds": round(time.perf_counter() - started, 1)}))


class Model:
    """A text's vector from its token ids: the unit mean of learned token vectors."""

    def __init__(self, base: Any, variant: str) -> None:
        import torch

        self.variant = variant
        self.base = torch.tensor(base)
        dim = self.base.shape[1]
        if variant == "table":
            self.table = torch.nn.Parameter(self.base.clone())
            self.params = [self.table]
        elif variant == "linear":
            self.map = torch.nn.Parameter(torch.eye(dim))
            self.weight = torch.nn.Parameter(torch.zeros(len(self.base)))
            self.params = [self.map, self.weight]
        else:
            raise ValueError(f"unknown variant {variant!r}: table or linear")

    def __call__(self, ids: Any, mask: Any) -> Any:
        import torch

        m = mask.unsqueeze(-1).float()
        if self.variant == "table":
            rows = self.table[ids]
        else:
            rows = self.base[ids] * self.weight[ids].exp().unsqueeze(-1)
        mean = (rows * m).sum(1) / m.sum(1).clamp(min=1.0)
        if self.variant == "linear":
            mean = mean @ self.map
        return torch.nn.functional.normalize(mean, dim=-1)

    def export(self) -> Any:
        """The learned table (vocabulary x dim), as `LearnedTable` reads it."""
        import torch

        with torch.no_grad():
            if self.variant == "table":
                return self.table.detach().numpy().copy()
            return ((self.base * self.weight.exp().unsqueeze(-1)) @ self.map).numpy()


def train_command(args: argparse.Namespace) -> None:
    import torch

    from shared.embeddings import StaticMiniLM, _tokenizer

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    loaded = [np.load(path, allow_pickle=True) for path in args.teacher]
    texts = [t for data in loaded for t in data["texts"]]
    vectors = np.concatenate([data["vectors"] for data in loaded]).astype(np.float32)
    order = list(range(len(texts)))  # the held-out rows from every file
    random.Random(args.seed).shuffle(order)
    texts, targets = [texts[i] for i in order], torch.tensor(vectors[order])
    tokenizer = _tokenizer()
    ids = [e.ids or [0] for e in tokenizer.encode_batch(texts, add_special_tokens=False)]
    padded = Padded(ids, "cpu")
    held = max(1, len(ids) // 50)
    train_rows, held_rows = list(range(held, len(ids))), list(range(held))
    base, _ = StaticMiniLM()._load()
    model = Model(base, args.variant)
    optimiser = torch.optim.Adam(model.params, lr=args.lr)
    steps = args.epochs * math.ceil(len(train_rows) / args.batch)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimiser, lambda s: 0.5 * (1 + math.cos(math.pi * min(1.0, s / steps)))
    )
    rng = random.Random(args.seed)
    history = [{"epoch": 0, "held_out_cosine": _held(model, padded, targets, held_rows)}]
    print(json.dumps(history[-1]), file=sys.stderr, flush=True)
    started = time.perf_counter()
    for epoch in range(args.epochs):
        order = train_rows[:]
        rng.shuffle(order)
        total = 0.0
        for rows in _batches(order, args.batch):
            out = model(*padded(rows))
            want = targets[rows]
            loss = (1 - (out * want).sum(-1)).mean()
            loss = loss + args.relational * torch.nn.functional.mse_loss(out @ out.T, want @ want.T)
            if args.variant == "table" and args.anchor:
                loss = loss + args.anchor * (model.table - model.base).pow(2).sum(-1).mean()
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            optimiser.step()
            schedule.step()
            total += float(loss.detach()) * len(rows)
        history.append(
            {
                "epoch": epoch + 1,
                "loss": total / len(train_rows),
                "held_out_cosine": _held(model, padded, targets, held_rows),
                "seconds": round(time.perf_counter() - started, 1),
            }
        )
        print(json.dumps(history[-1]), file=sys.stderr, flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.save(args.out, model.export().astype(np.float32))
    print(json.dumps({"out": str(args.out), "variant": args.variant, "history": history}))


def _held(model: Model, padded: Padded, targets: Any, rows: list[int]) -> float:
    import torch

    with torch.no_grad():
        out = model(*padded(rows))
        return float((out * targets[rows]).sum(-1).mean())


class LearnedTable:
    """A learned table as a routing embedder (as `StaticMiniLM` embeds)."""

    def __init__(self, path: Path) -> None:
        from shared.embeddings import _tokenizer

        self.table = np.load(path)
        self.tokenizer = _tokenizer()

    def embed(self, texts: list[str], /) -> list[list[float]]:
        out = []
        for e in self.tokenizer.encode_batch(list(texts), add_special_tokens=False):
            v = self.table[e.ids].mean(axis=0) if e.ids else np.zeros(self.table.shape[1])
            n = float(np.linalg.norm(v))
            out.append((v / n if n else v).tolist())
        return out


def score_command(args: argparse.Namespace) -> None:
    """Each table alone on the routing benchmark, and as the cascade's quick stage in front
    of MiniLM's int8 graph; MiniLM, its int8 graph and the static vectors for comparison."""
    from benchmarks.static_routing import SHOWN, cascade, requests, score
    from shared.embeddings import LearnedStatic, MiniLM, OnnxMiniLM, StaticMiniLM

    rows = requests()
    teacher = MiniLM()
    int8 = score(OnnxMiniLM(int8=True), rows, by=teacher)
    static = score(StaticMiniLM(), rows)
    results: dict[str, Any] = {
        "minilm": score(teacher, rows),
        "minilm-int8": int8,
        "static": static,
    }
    for path in args.table:
        results[path.stem] = score(LearnedTable(path), rows)
        results[f"{path.stem}, profiles by MiniLM"] = score(LearnedTable(path), rows, by=teacher)
    if args.shipped:  # what routing's `cascade-learned` runs
        results["shipped"] = score(LearnedStatic(), rows)
    out: dict[str, Any] = {}
    for name, r in results.items():
        out[name] = {k: r[k] for k in SHOWN}
        out[name]["highest_unrelated"] = max(r["unrelated_best"])
        out[name]["lowest_test"] = min(r["best"])
        out[name]["cascade_before_int8"] = cascade(int8, r)  # as the quick stage
        out[name]["cascade_after_static"] = cascade(r, static)  # in MiniLM's place
    print(json.dumps(out, indent=2))
    if args.out:
        args.out.write_text(json.dumps(out, indent=2) + "\n")


def _stage_scores(
    embedder: Any, profiles: dict[str, Any], texts: list[str]
) -> list[tuple[str, float]]:
    """Each text's nearest profile by `embedder` (the embedding mode's rule) and its score."""
    vectors = np.asarray(embedder.embed(texts))
    out = []
    for q in vectors:
        scores = {k: float((m @ q).max()) for k, m in profiles.items()}
        best = max(scores, key=lambda k: scores[k])
        out.append((best, scores[best]))
    return out


def _profiles(texts: dict[str, list[str]], static: Any, learned: Any, minilm: Any) -> Any:
    """Each profile's vectors by each stage's embedder (the int8 stage's by MiniLM)."""
    return {
        name: {k: np.asarray(e.embed(v)) for k, v in texts.items()}
        for name, e in (("static", static), ("learned", learned), ("minilm", minilm))
    }


def bars_command(args: argparse.Namespace) -> None:
    """Bars for the learned table as a second quick stage (between the static vectors' bars
    and MiniLM's int8 graph), set on one half of the routing benchmark's requests and
    checked on the other: set on the train requests past each profile's first 16 and the
    first 20 unrelated ones, checked on the 162 test requests and the 79 unrelated ones
    written later. Also how many of the router benchmark's openings each stage decides."""
    from benchmarks import router_overhead
    from benchmarks.routing_shortcuts import UNRELATED_LATER
    from benchmarks.static_routing import UNRELATED, UNRELATED_HELD_OUT, requests
    from shared.embeddings import LearnedStatic, MiniLM, OnnxMiniLM, StaticMiniLM
    from shared.routing.modes import QUICK_CONFIDENCE, QUICK_REJECT

    rows = requests()
    kinds = sorted({k for k, _, _ in rows})
    train = {k: [t for kk, s, t in rows if kk == k and s == "train"] for k in kinds}
    kinds = [k for k in kinds if len(train[k]) >= 4]
    profile_texts = {k: train[k][:16] for k in kinds}
    sets = {
        "calibration": [(k, t) for k in kinds for t in train[k][16:]]
        + [(None, t) for t in UNRELATED],
        "check": [(k, t) for k, s, t in rows if s == "test" and k in kinds]
        + [(None, t) for t in (*UNRELATED_HELD_OUT, *UNRELATED_LATER)],
    }
    router_kinds = ("set_alarms", "convert_currency", None, "set_alarms")  # opening(n)'s n % 4
    router_profiles = {
        "set_alarms": [
            "Sets an alarm at the time the user asks for.",
            *router_overhead.ALARM_FAILURES,
        ],
        "convert_currency": [
            "Converts money between currencies.",
            *router_overhead.CURRENCY_FAILURES,
        ],
    }
    # as many of the load phase's openings (numbered from 0) as of the latency phase's
    rng = random.Random(0)
    numbers = rng.sample(range(16_000), 2_000) + rng.sample(
        range(router_overhead.LATENCY_CONVERSATIONS, router_overhead.LATENCY_CONVERSATIONS + 8_000),
        2_000,
    )
    router_set = [(router_kinds[n % 4], router_overhead.opening(n)) for n in numbers]
    static, learned, minilm = StaticMiniLM(), LearnedStatic(), MiniLM()
    int8 = OnnxMiniLM(int8=True)
    profiles = _profiles(profile_texts, static, learned, minilm)
    scored: dict[str, Any] = {}
    for name, items, own in (
        *((name, items, profiles) for name, items in sets.items()),
        ("router_benchmark", router_set, _profiles(router_profiles, static, learned, minilm)),
    ):
        texts = [t for _, t in items]
        scored[name] = {
            "truth": [k for k, _ in items],
            "static": _stage_scores(static, own["static"], texts),
            "learned": _stage_scores(learned, own["learned"], texts),
            "int8": _stage_scores(int8, own["minilm"], texts),
        }

    def band(data: dict[str, Any]) -> list[int]:  # what the static vectors leave to MiniLM
        return [
            i for i, (_, s) in enumerate(data["static"]) if QUICK_REJECT <= s < QUICK_CONFIDENCE
        ]

    cal = scored["calibration"]
    inside = band(cal)
    unrelated = [cal["learned"][i][1] for i in inside if cal["truth"][i] is None]
    # 0.005 above, up to the next 0.01 (session 23 went up to the next 0.05, 0.65: the
    # check half decides the same either way, and MiniLM is asked less; session 25)
    accept = math.ceil((max(unrelated) + 0.005) * 100) / 100
    # the highest bar under which every request of an adapter's kind is one MiniLM's int8
    # graph also sends to the base model (so no decision changes)
    overruled = [
        cal["learned"][i][1]
        for i in inside
        if cal["truth"][i] is not None and cal["int8"][i][1] >= THRESHOLD
    ]
    reject = math.floor(min(overruled) * 20) / 20  # the next 0.05 under
    out: dict[str, Any] = {
        "learned_accept": accept,
        "learned_reject": reject,
        "highest_unrelated": max(unrelated),
        "lowest_overruled": min(overruled),
    }
    for name, data in scored.items():
        out[name] = _three_stages(data, accept, reject)
        out[name]["requests"] = len(data["truth"])
        out[name]["in_static_band"] = len(band(data))
    print(json.dumps(out, indent=2))
    if args.out:
        args.out.write_text(json.dumps(out, indent=2) + "\n")


def _three_stages(data: dict[str, Any], accept: float, reject: float) -> dict[str, Any]:
    """The static vectors' bars, then the learned table's, then MiniLM's int8 graph: each
    request's decision against the two-stage cascade's (static, then int8) and against
    the cheap one's (`cascade-learned`: static, then the learned table at the threshold,
    no model)."""
    from shared.routing.modes import QUICK_CONFIDENCE, QUICK_REJECT

    def int8(i: int) -> str | None:
        kind, s = data["int8"][i]
        return kind if s >= THRESHOLD else None

    two, three, cheap, by_learned = [], [], [], 0
    for i, (kind, s) in enumerate(data["static"]):
        if s >= QUICK_CONFIDENCE:
            two.append(kind)
            three.append(kind)
            cheap.append(kind)
            continue
        if s < QUICK_REJECT:
            two.append(None)
            three.append(None)
            cheap.append(None)
            continue
        two.append(int8(i))
        learned_kind, ls = data["learned"][i]
        cheap.append(learned_kind if ls >= THRESHOLD else None)
        if ls >= accept:
            three.append(learned_kind)
            by_learned += 1
        elif ls < reject:
            three.append(None)
            by_learned += 1
        else:
            three.append(int8(i))
    truth = data["truth"]
    labelled = [i for i, k in enumerate(truth) if k is not None]
    unrelated = [i for i, k in enumerate(truth) if k is None]
    return {
        "decided_by_learned": by_learned,
        "left_to_int8": sum(1 for _ in two)
        - by_learned
        - sum(1 for _, s in data["static"] if s >= QUICK_CONFIDENCE or s < QUICK_REJECT),
        "decisions_changed": sum(a != b for a, b in zip(two, three, strict=True)),
        "right_kind_two_stages": sum(two[i] == truth[i] for i in labelled),
        "right_kind_three_stages": sum(three[i] == truth[i] for i in labelled),
        "unrelated_to_an_adapter_two_stages": sum(two[i] is not None for i in unrelated),
        "unrelated_to_an_adapter_three_stages": sum(three[i] is not None for i in unrelated),
        "right_kind_cheap": sum(cheap[i] == truth[i] for i in labelled),
        "unrelated_to_an_adapter_cheap": sum(cheap[i] is not None for i in unrelated),
        # requests the cheap cascade decides rightly and the three stages not, and back
        "cheap_right_three_wrong": sum(cheap[i] == truth[i] != three[i] for i in range(len(truth))),
        "three_right_cheap_wrong": sum(three[i] == truth[i] != cheap[i] for i in range(len(truth))),
    }


def ship_command(args: argparse.Namespace) -> None:
    """A learned table's rows as routing's `learned` embedder loads them."""
    from shared.embeddings import StaticMiniLM, teacher_version
    from shared.routing.learned_table import TABLE, save

    base, _ = StaticMiniLM()._load()
    rows = save(np.load(args.table), base, teacher_version(), args.out or TABLE)
    print(json.dumps({"out": str(args.out or TABLE), "rows": rows}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    teacher = sub.add_parser("teacher", help="MiniLM's vectors of the corpus sentences")
    teacher.add_argument("--corpus", type=Path, nargs="+", required=True)
    teacher.add_argument("--limit", type=int, default=None)
    teacher.add_argument("--seed", type=int, default=0)
    teacher.add_argument("--out", type=Path, required=True)
    train = sub.add_parser("train", help="a table learned from the teacher's vectors")
    train.add_argument("--teacher", type=Path, nargs="+", required=True)
    train.add_argument("--variant", default="table", choices=("table", "linear"))
    train.add_argument("--epochs", type=int, default=10)
    train.add_argument("--batch", type=int, default=256)
    train.add_argument("--lr", type=float, default=1e-3)
    train.add_argument("--relational", type=float, default=1.0)
    train.add_argument("--anchor", type=float, default=0.0, help="L2 pull to MiniLM's rows")
    train.add_argument("--threads", type=int, default=2)
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--out", type=Path, required=True)
    scored = sub.add_parser("score", help="routing with each table")
    scored.add_argument("--table", type=Path, nargs="*", default=[])
    scored.add_argument("--shipped", action="store_true", help="also the shipped table")
    scored.add_argument("--out", type=Path)
    bars = sub.add_parser("bars", help="the shipped table as a second quick stage")
    bars.add_argument("--out", type=Path)
    ship = sub.add_parser("ship", help="a table's learned rows where routing loads them")
    ship.add_argument("--table", type=Path, required=True)
    ship.add_argument("--out", type=Path, help="default: shared/routing/learned-static.npz")
    args = parser.parse_args()
    commands = {
        "teacher": teacher_command,
        "train": train_command,
        "score": score_command,
        "ship": ship_command,
        "bars": bars_command,
    }
    commands[args.command](args)


if __name__ == "__main__":
    main()
