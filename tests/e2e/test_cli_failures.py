"""The CLI as a new user meets it when something is missing (issue 16): one line naming what
is wrong and what to do, never a traceback, and nothing left hanging. Each command runs as a
subprocess against the machine's Postgres and NATS, or against ports nothing listens on."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from shared.embedded import postgres_running
from shared.store.engine import async_url
from tests.e2e.test_cli_up import cli, env, running_up  # noqa: F401  (fixture)
from tests.support import infra

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

NOWHERE_DB = "postgresql://postgres:secret@127.0.0.1:1/test"
NOWHERE_NATS = "nats://127.0.0.1:1"


@pytest.fixture
def servers(env: dict[str, str]) -> Iterator[dict[str, str]]:  # noqa: F811
    """The environment pointed at the test Postgres (a schema of its own, migrated) and NATS."""
    schema = f"cli_{uuid.uuid4().hex[:10]}"
    pointed = {
        **env,
        "RETRACE_DATABASE_URL": infra.database_url(),
        "RETRACE_DATABASE_SCHEMA": schema,
        "RETRACE_NATS_URL": infra.nats_url(),
    }
    migrated = cli(pointed, "migrate")
    assert migrated.returncode == 0, migrated.stderr
    yield pointed
    asyncio.run(_drop(schema))


@pytest.fixture
def api(servers: dict[str, str]) -> Iterator[dict[str, str]]:
    """`servers` with the control API running (`retrace up --only api`), which the CLI's
    agent and cycle commands go through."""
    with running_up(servers, "api", first_port=28000):
        yield servers


async def _drop(schema: str) -> None:
    engine = create_async_engine(async_url(infra.database_url()))
    async with engine.begin() as conn:
        await conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
    await engine.dispose()


def _one_line(result: object) -> str:
    err = result.stderr  # type: ignore[attr-defined]
    assert result.returncode == 1, (err, result.stdout)  # type: ignore[attr-defined]
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


def test_an_agent_for_a_tenant_that_does_not_exist(api: dict[str, str]) -> None:
    made = cli(
        api, "agent", "create", "x", "--tenant", "nobody", "--model", "m", "--env", "toolbox"
    )
    line = _one_line(made)
    assert "no tenant 'nobody'" in line and "retrace tenant create nobody" in line


def test_a_rollout_for_a_tenant_that_does_not_exist(servers: dict[str, str]) -> None:
    """It said "no agent named 'bot'", as if the agent were the mistake."""
    line = _one_line(cli(servers, "rollout", "bot", "--tenant", "nobody"))
    assert "no tenant 'nobody'" in line, line


def test_a_database_nobody_listens_on(servers: dict[str, str]) -> None:
    listed = cli({**servers, "RETRACE_DATABASE_URL": NOWHERE_DB}, "tenant", "list")
    line = _one_line(listed)
    assert "cannot reach Postgres" in line and "RETRACE_DATABASE_URL=" in line
    assert "secret" not in line  # the password is not printed
    shown = cli({**servers, "RETRACE_DATABASE_URL": NOWHERE_DB}, "--debug", "tenant", "list")
    assert "Traceback" in shown.stderr  # --debug shows it


def test_status_with_nats_down_says_so_and_returns(servers: dict[str, str]) -> None:
    """It printed a traceback for every try and never returned."""
    status = cli({**servers, "RETRACE_NATS_URL": NOWHERE_NATS}, "status", timeout=60)
    assert status.returncode == 1, status.stderr
    assert "Traceback" not in status.stderr + status.stdout
    assert f"NATS unreachable at {NOWHERE_NATS}" in status.stdout + status.stderr


def test_a_fresh_data_directory_works_and_is_left_as_found(env: dict[str, str]) -> None:  # noqa: F811
    """`tenant list` on a fresh data directory, no `retrace up`: it started an embedded
    Postgres, left it running, and died on `relation "tenants" does not exist`."""
    data = Path(env["RETRACE_STORAGE_DATA_DIR"])
    listed = cli(env, "tenant", "list")
    assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr
    assert not postgres_running(data)  # what it started, it stopped
    made = cli(env, "tenant", "create", "acme")
    assert made.returncode == 0, made.stderr
    again = cli(env, "tenant", "list")
    assert again.returncode == 0 and "acme" in again.stdout, again.stderr
    assert not postgres_running(data)


def test_agent_commands_without_the_control_api_say_how_to_start_it(
    servers: dict[str, str],
) -> None:
    """The agent and cycle commands go through the control API: with none running, one line
    saying so (nothing started, nothing hanging)."""
    for args in (("agent", "list"), ("improve", "bot", "--wait", "5"), ("report", "bot")):
        line = _one_line(cli(servers, *args))
        assert "the control API is not running" in line and "retrace up" in line, (args, line)
    nowhere = {**servers, "RETRACE_API_URL": "http://127.0.0.1:1", "RETRACE_API_KEY": "rt_x"}
    line = _one_line(cli(nowhere, "agent", "list"))
    assert "cannot reach the control API at http://127.0.0.1:1" in line, line
    theirs = {**nowhere, "RETRACE_API_KEY": "rt_acme_secret"}
    line = _one_line(cli(theirs, "agent", "delete", "bot", "--tenant", "globex", "--yes"))
    assert "is tenant 'acme''s, not 'globex''s" in line, line  # it deleted acme's bot
    keyless = {k: v for k, v in nowhere.items() if k != "RETRACE_API_KEY"}
    line = _one_line(cli(keyless, "agent", "list"))
    assert "no key for the control API" in line and "RETRACE_API_KEY" in line, line


@pytest.mark.timeout(420)  # 24 CLI processes: 51 s alone, over 180 s beside 3 other workers
def test_quotas_set_from_the_cli_refuse_in_one_line(api: dict[str, str]) -> None:
    """`tenant quota`: set, shown with usage, enforced on the next agent (one line naming the
    quota), cleared with `none`; a quota that is not a number is a usage error (a request
    rate too: a positive number)."""
    assert cli(api, "tenant", "create", "acme").returncode == 0
    capped = cli(api, "tenant", "quota", "acme", "--max-agents", "1")
    assert capped.returncode == 0 and "max_agents" in capped.stdout, capped.stderr
    agent = ("agent", "create", "--tenant", "acme", "--model", "m", "--env", "toolbox")
    assert cli(api, *agent[:2], "bot", *agent[2:]).returncode == 0
    line = _one_line(cli(api, *agent[:2], "bot2", *agent[2:]))
    assert "quota" in line and "max_agents" in line, line
    listed = cli(api, "tenant", "list")
    assert "agents=1" in listed.stdout, listed.stdout
    bad = cli(api, "tenant", "quota", "acme", "--max-agents", "-3")
    assert bad.returncode == 2 and "not a whole number or 'none'" in bad.stderr, bad.stderr
    line = _one_line(cli(api, "tenant", "quota", "acme", "--max-agents", "5000000"))
    assert "quotas not set" in line and "1000000" in line, line  # it was stored, and broke
    superscript = cli(api, "tenant", "quota", "acme", "--max-agents", "²")
    assert superscript.returncode == 2 and "Traceback" not in superscript.stderr
    assert cli(api, "tenant", "quota", "acme", "--max-agents", "none").returncode == 0
    assert cli(api, *agent[:2], "bot2", *agent[2:]).returncode == 0
    rate = cli(api, "tenant", "quota", "acme", "--requests-per-s", "2.5", "--request-burst", "4")
    assert rate.returncode == 0 and "2.5" in rate.stdout, rate.stderr
    tokens = cli(api, "tenant", "quota", "acme", "--tokens-per-min", "120000")
    assert tokens.returncode == 0 and "120000" in tokens.stdout, tokens.stderr
    none = cli(api, "tenant", "quota", "acme", "--tokens-per-min", "0")
    assert "quotas not set" in _one_line(none) and "tokens_per_min" in _one_line(none)
    for wrong in ("-1", "0", "nan", "inf", "fast"):
        bad = cli(api, "tenant", "quota", "acme", "--requests-per-s", wrong)
        assert bad.returncode == 2 and "positive number" in bad.stderr, (wrong, bad.stderr)


def test_deleting_an_agent_and_a_tenant(api: dict[str, str]) -> None:
    """`agent delete` and `tenant delete`: what does not exist is one line; without `--yes`
    nothing is deleted unless confirmed; with it, the agent and then the tenant go."""
    servers = api
    assert cli(servers, "tenant", "create", "acme").returncode == 0
    made = cli(
        servers, "agent", "create", "bot", "--tenant", "acme", "--model", "m", "--env", "toolbox"
    )
    assert made.returncode == 0, made.stderr
    assert "no agent named 'ghost'" in _one_line(
        cli(servers, "agent", "delete", "ghost", "--tenant", "acme", "--yes")
    )
    kept = cli(servers, "agent", "delete", "bot", "--tenant", "acme")  # no answer: aborted
    assert kept.returncode == 1 and "Aborted" in kept.stderr
    gone = cli(servers, "agent", "delete", "bot", "--tenant", "acme", "--yes")
    assert gone.returncode == 0 and "deleted" in gone.stdout, gone.stderr  # it was still there
    assert cli(servers, "tenant", "delete", "acme", "--yes").returncode == 0
    assert "no tenant 'acme'" in _one_line(cli(servers, "tenant", "delete", "acme", "--yes"))
