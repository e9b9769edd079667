"""load_config: RETRACE_* variables into typed blocks; every bad value is named by its variable."""

from __future__ import annotations

import json
import math
from typing import Any, Literal

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.config import ServiceConfig, load_config
from shared.errors import ConfigError

CONCURRENCY = "RETRACE_CONSUMER_CONCURRENCY"


class ScorerConfig(ServiceConfig, kw_only=True, frozen=True):
    """A service's own settings beside the shared blocks, one field of each kind of type."""

    model: str
    threshold: float = 0.5
    enabled: bool = True
    mode: Literal["fast", "exact"] = "fast"
    seeds: list[int] = msgspec.field(default_factory=list)
    adapter: str | None = "base"


def load_scorer(**env: str) -> ScorerConfig:
    return load_config(ScorerConfig, service="scorer", env={"RETRACE_SCORER_MODEL": "m", **env})


def problems(exc: pytest.ExceptionInfo[ConfigError]) -> list[str]:
    """One line per reported problem, after the heading."""
    return str(exc.value).splitlines()[1:]


def assert_rejected(env: dict[str, str], *variables: str, cls: type = ServiceConfig) -> None:
    """Exactly `variables` are reported, each on a line of its own."""
    with pytest.raises(ConfigError) as exc:
        load_config(cls, service="scorer", env=env)
    lines = problems(exc)
    assert len(lines) == len(variables), lines
    for variable in variables:
        assert sum(line.strip().startswith(variable) for line in lines) == 1, (variable, lines)


# -- defaults and parsing --------------------------------------------------------------------


def test_empty_env_gives_the_declared_defaults() -> None:
    assert load_config(ServiceConfig, service="scorer", env={}) == ServiceConfig()


def test_reads_os_environ_when_no_env_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CONCURRENCY, "7")
    assert load_config(ServiceConfig, service="scorer").consumer.concurrency == 7


@pytest.mark.parametrize(
    ("variable", "text", "path", "expected"),
    [
        ("RETRACE_CONSUMER_CONCURRENCY", "12", "consumer.concurrency", 12),
        ("RETRACE_CONSUMER_CONCURRENCY", "  12 ", "consumer.concurrency", 12),
        ("RETRACE_CONSUMER_ACK_WAIT", "2.5", "consumer.ack_wait", 2.5),
        ("RETRACE_NATS_CONNECT_TIMEOUT", "3", "nats.connect_timeout", 3.0),
        ("RETRACE_NATS_URL", "nats://bus:4222", "nats.url", "nats://bus:4222"),
        ("RETRACE_NATS_SUBJECT_PREFIX", "rt_1", "nats.subject_prefix", "rt_1"),
        ("RETRACE_HTTP_PORT", "65535", "http.port", 65535),
        ("RETRACE_HTTP_PORT", "0", "http.port", 0),
        ("RETRACE_LOG_LEVEL", "debug", "log.level", "debug"),
        ("RETRACE_LOG_FORMAT", "json", "log.format", "json"),
        ("RETRACE_CONSUMER_SHUTDOWN_GRACE", "0", "consumer.shutdown_grace", 0.0),
        ("RETRACE_NATS_RECONNECT_ATTEMPTS", "0", "nats.reconnect_attempts", 0),
        ("RETRACE_SCORER_THRESHOLD", "0.25", "threshold", 0.25),
        ("RETRACE_SCORER_ENABLED", "false", "enabled", False),
        ("RETRACE_SCORER_ENABLED", "0", "enabled", False),
        ("RETRACE_SCORER_ENABLED", "TRUE", "enabled", True),
        ("RETRACE_SCORER_MODE", "exact", "mode", "exact"),
    ],
)
def test_values_are_parsed_from_text(variable: str, text: str, path: str, expected: Any) -> None:
    value: Any = load_scorer(**{variable: text})
    for name in path.split("."):
        value = getattr(value, name)
    assert value == expected
    assert type(value) is type(expected)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[0.5, 2]", [0.5, 2.0]),
        ("0.5,2", [0.5, 2.0]),
        (" 0.5 , 2 , ", [0.5, 2.0]),
        ("3", [3.0]),
        ("[]", []),
        ("", []),
    ],
)
def test_lists_are_read_from_json_or_commas(text: str, expected: list[float]) -> None:
    cfg = load_config(ServiceConfig, env={"RETRACE_CONSUMER_BACKOFF": text})
    assert cfg.consumer.backoff == expected


def test_time_limits_are_read_from_a_json_object() -> None:
    env = {"RETRACE_CONSUMER_TIME_LIMITS": '{"train.requested": 86400, "rollout.requested": 60}'}
    consumer = load_config(ServiceConfig, env=env).consumer
    assert consumer.time_limit("train.requested", 5.0) == 86400
    assert consumer.time_limit("rollout.requested", 5.0) == 60
    assert consumer.time_limit("cycle.requested", 5.0) == 5.0  # the contract's own


def test_a_service_list_of_ints_is_read_from_commas() -> None:
    assert load_scorer(RETRACE_SCORER_SEEDS="1, 2,3").seeds == [1, 2, 3]


@pytest.mark.parametrize("text", ["", "   "])
def test_empty_value_unsets_an_optional_field(text: str) -> None:
    cfg = load_scorer(
        RETRACE_NATS_URL=text, RETRACE_STORAGE_ARTIFACT_DIR=text, RETRACE_SCORER_ADAPTER=text
    )
    assert cfg.nats.url is None
    assert cfg.storage.artifact_dir is None
    assert cfg.adapter is None  # the declared default is "base", so None came from the variable


# -- service-owned fields --------------------------------------------------------------------


def test_service_fields_are_read_under_the_service_name() -> None:
    cfg = load_scorer(RETRACE_SCORER_THRESHOLD="0.9", RETRACE_CONSUMER_CONCURRENCY="2")
    assert cfg.model == "m"
    assert cfg.threshold == 0.9
    # Blocks keep their own names; they are not nested under the service.
    assert cfg.consumer.concurrency == 2


def test_service_fields_fall_back_to_the_class_name() -> None:
    env = {"RETRACE_SCORERCONFIG_MODEL": "by-class", "RETRACE_SCORER_MODEL": "by-service"}
    assert load_config(ScorerConfig, env=env).model == "by-class"
    assert load_config(ScorerConfig, service="scorer", env=env).model == "by-service"


def test_a_missing_required_service_field_names_its_variable() -> None:
    assert_rejected({}, "RETRACE_SCORER_MODEL", cls=ScorerConfig)


def test_unrelated_variables_are_ignored() -> None:
    env = {
        "PATH": "/bin",
        "RETRACE_CONSUMER_NO_SUCH_FIELD": "x",
        "RETRACE_NO_SUCH_BLOCK_URL": "x",
        "RETRACE_CONSUMERCONCURRENCY": "x",
        "retrace_consumer_concurrency": "x",
        "RETRACE_OTHER_THRESHOLD": "x",
        "RETRACE_SCORER_CONCURRENCY": "x",
        "CONSUMER_CONCURRENCY": "x",
        "RETRACE_SCORER_MODEL": "m",
    }
    assert load_config(ScorerConfig, service="scorer", env=env) == ScorerConfig(model="m")
    # A service's variables mean nothing to a config without that field.
    assert load_config(ServiceConfig, service="scorer", env=env) == ServiceConfig()


# -- bad values ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("variable", "text"),
    [
        ("RETRACE_CONSUMER_CONCURRENCY", "four"),
        ("RETRACE_CONSUMER_CONCURRENCY", "2.5"),
        ("RETRACE_CONSUMER_CONCURRENCY", ""),
        ("RETRACE_CONSUMER_CONCURRENCY", "0"),
        ("RETRACE_CONSUMER_CONCURRENCY", "-3"),
        ("RETRACE_CONSUMER_MAX_DELIVER", "0"),
        ("RETRACE_CONSUMER_ACK_WAIT", "soon"),
        ("RETRACE_CONSUMER_ACK_WAIT", "0"),
        ("RETRACE_CONSUMER_ACK_WAIT", "-1"),
        ("RETRACE_CONSUMER_ACK_WAIT", "nan"),
        ("RETRACE_CONSUMER_ACK_WAIT", "inf"),
        ("RETRACE_CONSUMER_FETCH_TIMEOUT", "0"),
        ("RETRACE_CONSUMER_SHUTDOWN_GRACE", "-0.5"),
        ("RETRACE_CONSUMER_BACKOFF", "[1, 2"),
        ("RETRACE_CONSUMER_BACKOFF", "1,x"),
        ("RETRACE_CONSUMER_BACKOFF", "[1, -2]"),
        ("RETRACE_CONSUMER_BACKOFF", "1,inf"),
        ("RETRACE_CONSUMER_BACKOFF", '{"a": 1}'),
        ("RETRACE_CONSUMER_TIME_LIMITS", "train.requested=60"),
        ("RETRACE_CONSUMER_TIME_LIMITS", '{"train.requested": 0}'),
        ("RETRACE_CONSUMER_TIME_LIMITS", '{"train.requested": "long"}'),
        ("RETRACE_CONSUMER_TIME_LIMITS", '{"train.requested": Infinity}'),
        ("RETRACE_CONSUMER_TIME_LIMITS", "[60]"),
        ("RETRACE_HTTP_PORT", "http"),
        ("RETRACE_HTTP_PORT", "-1"),
        ("RETRACE_HTTP_PORT", "65536"),
        ("RETRACE_NATS_SUBJECT_PREFIX", "retrace.prod"),
        ("RETRACE_NATS_SUBJECT_PREFIX", "retrace.>"),
        ("RETRACE_NATS_SUBJECT_PREFIX", "Retrace"),
        ("RETRACE_NATS_SUBJECT_PREFIX", ""),
        ("RETRACE_NATS_RECONNECT_ATTEMPTS", "-1"),
        ("RETRACE_NATS_CONNECT_TIMEOUT", "0"),
        ("RETRACE_NATS_REQUEST_TIMEOUT", "-2"),
        ("RETRACE_NATS_DUPLICATE_WINDOW", "0"),
        ("RETRACE_DATABASE_POOL_SIZE", "0"),
        ("RETRACE_DATABASE_CONNECT_TIMEOUT", "0"),
        ("RETRACE_DATABASE_STATEMENT_TIMEOUT_MS", "0"),
        ("RETRACE_LOG_LEVEL", "verbose"),
        ("RETRACE_LOG_FORMAT", "xml"),
        ("RETRACE_SCORER_THRESHOLD", "high"),
        ("RETRACE_SCORER_ENABLED", "maybe"),
        ("RETRACE_SCORER_MODE", "slow"),
        ("RETRACE_SCORER_SEEDS", "1,two"),
    ],
)
def test_a_bad_value_is_reported_under_its_variable(variable: str, text: str) -> None:
    assert_rejected({"RETRACE_SCORER_MODEL": "m", variable: text}, variable, cls=ScorerConfig)


def test_every_bad_value_is_reported_at_once() -> None:
    bad = {
        "RETRACE_CONSUMER_CONCURRENCY": "many",
        "RETRACE_CONSUMER_MAX_DELIVER": "0",
        "RETRACE_HTTP_PORT": "99999",
        "RETRACE_LOG_LEVEL": "loud",
        "RETRACE_SCORER_THRESHOLD": "x",
    }
    assert_rejected(
        {**bad, "RETRACE_CONSUMER_ACK_WAIT": "3"}, *bad, "RETRACE_SCORER_MODEL", cls=ScorerConfig
    )


# -- properties ------------------------------------------------------------------------------


@given(st.integers())
def test_any_integer_concurrency_is_kept_or_named(n: int) -> None:
    env = {CONCURRENCY: str(n)}
    if n >= 1:
        assert load_config(ServiceConfig, env=env).consumer.concurrency == n
    else:
        assert_rejected(env, CONCURRENCY)


@given(st.floats(min_value=0, exclude_min=True, allow_infinity=False))
def test_any_positive_ack_wait_round_trips(seconds: float) -> None:
    cfg = load_config(ServiceConfig, env={"RETRACE_CONSUMER_ACK_WAIT": repr(seconds)})
    assert cfg.consumer.ack_wait == seconds


@given(st.lists(st.floats(min_value=0, allow_infinity=False), max_size=8), st.booleans())
def test_any_backoff_list_round_trips(delays: list[float], as_json: bool) -> None:
    text = json.dumps(delays) if as_json else ",".join(map(repr, delays))
    cfg = load_config(ServiceConfig, env={"RETRACE_CONSUMER_BACKOFF": text})
    assert cfg.consumer.backoff == delays


@given(
    st.sampled_from(
        [
            "RETRACE_CONSUMER_CONCURRENCY",
            "RETRACE_CONSUMER_ACK_WAIT",
            "RETRACE_CONSUMER_BACKOFF",
            "RETRACE_HTTP_PORT",
            "RETRACE_LOG_LEVEL",
            "RETRACE_NATS_SUBJECT_PREFIX",
            "RETRACE_SCORER_ENABLED",
            "RETRACE_SCORER_SEEDS",
        ]
    ),
    st.text(alphabet=st.sampled_from("0123456789-+.,[]e inftrueaxX\n")) | st.text(),
)
def test_any_text_is_accepted_or_named(variable: str, text: str) -> None:
    """Whatever a variable holds, the outcome is a config or a ConfigError naming it."""
    try:
        cfg = load_scorer(**{variable: text})
    except ConfigError as exc:
        assert variable in str(exc)
    else:
        assert isinstance(cfg, ScorerConfig)
        consumer = cfg.consumer
        assert consumer.concurrency >= 1
        assert math.isfinite(consumer.ack_wait) and consumer.ack_wait > 0
        assert all(math.isfinite(d) and d >= 0 for d in consumer.backoff)
        assert 0 <= cfg.http.port <= 65535


def test_defaults_satisfy_their_own_constraints() -> None:
    """Every default survives a round trip through validation."""
    config = ServiceConfig()
    assert msgspec.convert(msgspec.to_builtins(config), ServiceConfig) == config
