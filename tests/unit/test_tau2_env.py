"""The tau2 adapter without a model: tasks, tools, bad calls, how episodes end, config."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("tau2", reason="the tau2 extra is not installed")

from shared.envs.protocol import Message, ToolCall, ToolCallFunction
from shared.envs.registry import UnknownEnvironmentError, get_environment
from shared.envs.tau2 import library
from shared.envs.tau2.config import Tau2Config, load_tau2_config
from shared.envs.tau2.env import Tau2Environment
from shared.envs.tau2.episode import Tau2Episode
from shared.envs.tau2.messages import parse_arguments
from shared.envs.tau2.user import STOP, ScriptedUser
from shared.errors import ConfigError
from shared.serving.packaged import DEFAULT_AGENT_MODEL

CFG = Tau2Config()


@pytest.fixture(scope="module")
def retail() -> Tau2Environment:
    return Tau2Environment("retail", CFG)


def scripted(env: Tau2Environment, task_id: str, *replies: str, cfg: Tau2Config = CFG) -> Any:
    from tau2.data_model.message import UserMessage

    script = [UserMessage(role="user", content=r) for r in replies]
    task = next(t for t in env.tasks() if t.id == task_id)
    if cfg is not CFG:
        env = Tau2Environment(env.domain, cfg)
    return env.episode(task, lambda _task, _tools: ScriptedUser(script))


def call(name: str, arguments: str, id: str = "c1") -> Message:
    return Message(
        role="assistant",
        tool_calls=[ToolCall(id=id, function=ToolCallFunction(name=name, arguments=arguments))],
    )


# -- tasks and splits ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("domain", "train", "test"), [("retail", 74, 40), ("airline", 30, 20), ("telecom", 74, 40)]
)
def test_tasks_are_tau2s_own_split(domain: str, train: int, test: int) -> None:
    env = Tau2Environment(domain, CFG)
    module = library.domain_module(domain)
    splits = module.get_tasks_split()
    specs = env.tasks()
    assert env.name == f"tau2:{domain}"
    assert sum(t.split == "train" for t in specs) == len(splits["train"]) == train
    assert sum(t.split == "test" for t in specs) == len(splits["test"]) == test
    assert {t.id for t in specs if t.split == "train"} == set(splits["train"])
    assert len({t.id for t in specs}) == len(specs)
    assert env.tasks() == specs  # the same list on every call
    assert all(t.data == {"domain": domain} and t.kind for t in specs)


def test_kinds_name_the_first_write_or_the_telecom_category() -> None:
    retail = Tau2Environment("retail", CFG).tasks()
    assert next(t for t in retail if t.id == "0").kind == "exchange_delivered_order_items"
    assert {t.kind for t in Tau2Environment("telecom", CFG).tasks()} == {
        "mms_issue",
        "mobile_data_issue",
        "service_issue",
    }


def test_registry_builds_tau2_refs_and_rejects_unknown_domains() -> None:
    assert get_environment("tau2:airline").name == "tau2:airline"
    with pytest.raises(UnknownEnvironmentError, match="tau2:mock"):
        get_environment("tau2:mock")
    with pytest.raises(UnknownEnvironmentError, match="unknown tau2 domain"):
        Tau2Environment("mock", CFG)


def test_missing_extra_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    library.require.cache_clear()
    monkeypatch.setitem(sys.modules, "tau2.registry", None)  # import of it raises ImportError
    try:
        with pytest.raises(UnknownEnvironmentError, match=r"pip install 'retrace\[tau2\]'"):
            library.require()
    finally:
        monkeypatch.undo()
        library.require.cache_clear()
        library.require()


# -- what the agent sees ---------------------------------------------------------------------


def test_prompt_and_tools_are_tau2s(retail: Tau2Environment) -> None:
    from tau2.agent.llm_agent import AGENT_INSTRUCTION

    episode = scripted(retail, "0", "I want to exchange two items.")
    env = library.domain_module("retail").get_environment()
    assert episode.tools == [t.openai_schema for t in env.get_tools()]
    assert AGENT_INSTRUCTION in episode.system_prompt
    assert env.get_policy() in episode.system_prompt
    # tau2's opening: the agent greets, the user answers.
    assert [m.role for m in episode.messages] == ["assistant", "user"]
    assert episode.messages[0].content == "Hi! How can I help you today?"
    assert episode.messages[1].content == "I want to exchange two items."


def test_bad_calls_come_back_as_tool_messages(retail: Tau2Environment) -> None:
    episode = scripted(retail, "0", "hello")
    cases = [
        call("no_such_tool", "{}", "a"),
        call("get_order_details", '{"order_id": ', "b"),
        call("get_order_details", "[1, 2]", "c"),
        call("get_order_details", '{"wrong": 1}', "d"),
        call("get_order_details", '{"order_id": "#W0000000"}', "e"),
    ]
    replies = [episode.step(c) for c in cases]
    for c, r in zip(cases, replies, strict=True):
        assert not r.done
        [message] = r.messages
        assert message.role == "tool" and message.tool_call_id == c.tool_calls[0].id
        assert message.content.startswith("Error"), message.content
    assert "not valid JSON" in replies[1].messages[0].content
    assert "JSON object" in replies[2].messages[0].content
    assert [c.ok for c in episode.calls] == [False] * 5
    assert episode.errors == 5
    # Unparseable calls never reach tau2's history; the others do, as tau2 answered them.
    assert sum(1 for m in episode.trajectory if m.role == "tool") == 3
    assert episode.score().reward == 0.0  # still scorable: not ended


def test_good_call_returns_tau2s_result(retail: Tau2Environment) -> None:
    episode = scripted(retail, "0", "hello")
    result = episode.step(
        call(
            "find_user_id_by_name_zip",
            json.dumps({"first_name": "Yusuf", "last_name": "Rossi", "zip": "19122"}),
        )
    )
    assert result.messages[0].content == "yusuf_rossi_9620"
    assert episode.calls[-1].ok and episode.calls[-1].arguments["zip"] == "19122"


# -- how episodes end ------------------------------------------------------------------------


def test_user_stop_token_ends_the_episode(retail: Tau2Environment) -> None:
    episode = scripted(retail, "0", "hello", "Thanks, bye. " + STOP)
    result = episode.step(Message(role="assistant", content="How can I help?"))
    assert result.done and result.messages[0].content.endswith(STOP)
    assert episode.termination.value == "user_stop"
    assert episode.step(Message(role="assistant", content="more?")).done


def test_successful_transfer_ends_the_episode(retail: Tau2Environment) -> None:
    episode = scripted(retail, "0", "hello")
    failed = episode.step(call("transfer_to_human_agents", "{}"))
    assert not failed.done  # the summary argument is required
    result = episode.step(call("transfer_to_human_agents", '{"summary": "wants an exchange"}'))
    assert result.done and episode.termination.value == "agent_stop"


def test_empty_agent_message_is_an_agent_error_scored_zero(retail: Tau2Environment) -> None:
    episode = scripted(retail, "0", "hello")
    assert episode.step(Message(role="assistant", content="  ")).done
    score = episode.score()
    assert score.reward == 0.0 and not score.success
    assert "agent_error" in score.notes[0]


def test_step_limit_ends_as_max_steps(retail: Tau2Environment) -> None:
    episode: Tau2Episode = scripted(retail, "0", "hello", "go on", cfg=Tau2Config(max_steps=3))
    result = episode.step(Message(role="assistant", content="Which order?"))
    assert result.done and episode.termination.value == "max_steps"
    assert "max_steps" in episode.score().notes[0]


def test_error_limit_ends_as_too_many_errors(retail: Tau2Environment) -> None:
    episode = scripted(retail, "0", "hello", cfg=Tau2Config(max_errors=2))
    assert not episode.step(call("nope", "{}")).done
    assert episode.step(call("nope", "{}")).done
    assert episode.termination.value == "too_many_errors"


def test_score_of_a_talk_only_episode_breaks_down_tau2s_checks(retail: Tau2Environment) -> None:
    episode = scripted(retail, "0", "hello", STOP)
    episode.step(Message(role="assistant", content="Sorry, I cannot help."))
    score = episode.score()
    assert score.reward == 0.0 and not score.success
    assert score.breakdown == {"db": 0.0, "communicate": 1.0}
    assert any("database differs" in n for n in score.notes)
    # The database is explained by the gold write not taken (reads are not scored here).
    assert any("not taken: exchange_delivered_order_items" in n for n in score.notes)
    assert not any("find_user_id_by_name_zip" in n for n in score.notes)


async def test_astep_and_ascore_run_off_the_loop(retail: Tau2Environment) -> None:
    from shared.envs.protocol import advance, grade

    episode = scripted(retail, "0", "hello", STOP)
    result = await advance(episode, Message(role="assistant", content="Bye"))
    assert result.done
    assert (await grade(episode)).reward == 0.0


# -- config ----------------------------------------------------------------------------------


def test_config_defaults_follow_the_model_endpoint() -> None:
    cfg = load_tau2_config({})
    assert cfg.user_url == "http://127.0.0.1:8000/v1"
    assert (cfg.user_model, cfg.user_api_key, cfg.user_temperature) == (
        DEFAULT_AGENT_MODEL,
        "EMPTY",
        0.0,
    )
    cfg = load_tau2_config(
        {"RETRACE_TAU2_USER_URL": "http://h:1/v1", "RETRACE_TAU2_USER_SEED": "7"}
    )
    assert cfg.user_url == "http://h:1/v1" and cfg.user_seed == 7


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("RETRACE_TAU2_USER_URL", "127.0.0.1:8000"),
        ("RETRACE_TAU2_USER_TEMPERATURE", "hot"),
        ("RETRACE_TAU2_USER_TEMPERATURE", "3"),
        ("RETRACE_TAU2_MAX_STEPS", "0"),
        ("RETRACE_TAU2_USER_TIMEOUT", "nan"),
    ],
)
def test_bad_config_names_the_variable(key: str, value: str) -> None:
    with pytest.raises(ConfigError, match=key):
        load_tau2_config({key: value})


# -- the argument parser ---------------------------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=8,
)


@given(st.text(max_size=50))
def test_parse_arguments_never_raises(text: str) -> None:
    parsed = parse_arguments(text)
    assert isinstance(parsed, dict) or parsed.startswith("Error: ")


@given(st.dictionaries(st.text(max_size=8), JSON, max_size=4))
def test_parse_arguments_reads_every_object(args: dict[str, Any]) -> None:
    assert parse_arguments(json.dumps(args)) == args


@given(JSON.filter(lambda v: not isinstance(v, dict)))
def test_parse_arguments_rejects_non_objects(value: Any) -> None:
    assert str(parse_arguments(json.dumps(value))).startswith("Error: ")


def test_a_refusing_simulator_ends_the_episode_as_a_user_error(retail: Tau2Environment) -> None:
    from tau2.data_model.message import UserMessage

    from shared.envs.tau2.user import UserSimulatorRefusedError

    class Refusing:
        def __init__(self) -> None:
            self.turns = 0

        def respond(self, message: Any) -> Any:
            self.turns += 1
            if self.turns > 1:
                raise UserSimulatorRefusedError("user simulator: context window exceeded")
            return UserMessage(role="user", content="hello")

    task = next(t for t in retail.tasks() if t.id == "0")
    episode = retail.episode(task, lambda _task, _tools: Refusing())
    result = episode.step(Message(role="assistant", content="How can I help?"))
    assert result.done and result.messages == []
    assert episode.termination.value == "user_error"
    score = episode.score()
    assert score.reward == 0.0 and "context window exceeded" in score.notes[-1]
