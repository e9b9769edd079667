"""compose.yaml: valid Compose Specification, and consistent with the project.

Offline: the schema is vendored in tests/data/compose-spec.json (see tests/data/README.md).
"""

from __future__ import annotations

import copy
import http.server
import importlib
import json
import os
import re
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import msgspec
import pytest
import yaml

from shared.config import ServiceConfig
from shared.routing import pack
from shared.serving.packaged import DEFAULT_AGENT_MODEL

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "compose.yaml"
SCHEMA_FILE = ROOT / "tests" / "data" / "compose-spec.json"
SERVICES_DIR = ROOT / "services"

# The services and their default HTTP ports (the router's and the control API's are public).
EXPECTED_PORTS = {
    "router": 8080,
    "rollout": 8101,
    "contrast": 8102,
    "synthesize": 8103,
    "train": 8104,
    "evaluator": 8105,
    "api": 8090,
}
ARTIFACT_DIR = "/var/lib/retrace/artifacts"
ARTIFACT_USERS = {"train", "router", "evaluator"}
ARTIFACT_READERS = {"vllm", "model-gate"}
"""Read the store, never write it: vllm loads adapters from it, the gate resolves their paths."""
GPU_PROFILE_SERVICES = {"vllm", "train-gpu"}
ADAPTER_LOADERS = {"router", "rollout", "train"}
"""The services that load adapters into the model server (its admin key's holders)."""
GATE_COMMAND = "retrace model-gate --upstream http://vllm:8000/v1"
NATS_PASSWORD = "${RETRACE_NATS_PASSWORD:-retrace-local-nats}"

# Go-style durations, as Compose reads them ("10s", "1m30s", "500ms").
_DURATION = re.compile(r"^(\d+(\.\d+)?(ns|us|µs|ms|s|m|h))+$")
_MODULE_CMD = re.compile(r"^python3? -m services\.([a-z_][a-z0-9_]*)$")
_UP_CMD = re.compile(r"^retrace up --only ([a-z_][a-z0-9_-]*)$")


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------
def _load_compose() -> dict[str, Any]:
    with COMPOSE_FILE.open(encoding="utf-8") as f:
        doc = yaml.safe_load(f)
    assert isinstance(doc, dict), "compose.yaml is not a mapping"
    return doc


def _load_schema() -> dict[str, Any]:
    with SCHEMA_FILE.open(encoding="utf-8") as f:
        return json.load(f)


def _format_checker() -> jsonschema.FormatChecker:
    checker = jsonschema.FormatChecker()

    @checker.checks("duration")
    def _is_duration(value: object) -> bool:
        return not isinstance(value, str) or bool(_DURATION.match(value))

    return checker


def _validator(cls: type[jsonschema.protocols.Validator] = jsonschema.Draft7Validator) -> Any:
    return cls(_load_schema(), format_checker=_format_checker())


def _errors(doc: dict[str, Any], cls: Any = jsonschema.Draft7Validator) -> list[str]:
    return [
        f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
        for e in _validator(cls).iter_errors(doc)
    ]


def _command(svc: dict[str, Any]) -> str:
    cmd = svc.get("command")
    if isinstance(cmd, list):
        return " ".join(str(c) for c in cmd)
    return str(cmd or "")


def _depends_on(svc: dict[str, Any]) -> dict[str, str]:
    dep = svc.get("depends_on") or {}
    if isinstance(dep, list):
        return {name: "service_started" for name in dep}
    return {name: spec["condition"] for name, spec in dep.items()}


def _env(svc: dict[str, Any]) -> dict[str, str | None]:
    env = svc.get("environment") or {}
    if isinstance(env, list):
        return dict(item.split("=", 1) if "=" in item else (item, None) for item in env)
    return {k: None if v is None else str(v) for k, v in env.items()}


def _profiles(svc: dict[str, Any]) -> set[str]:
    return set(svc.get("profiles") or [])


def _is_project_image(svc: dict[str, Any]) -> bool:
    return "build" in svc


def _gpu_devices(svc: dict[str, Any]) -> list[dict[str, Any]]:
    reservations = ((svc.get("deploy") or {}).get("resources") or {}).get("reservations") or {}
    return [
        d
        for d in reservations.get("devices") or []
        if "gpu" in (d.get("capabilities") or []) or d.get("driver") == "nvidia"
    ]


def _volume_mounts(svc: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    """target -> (source, read_only), from short or long volume syntax."""
    mounts: dict[str, tuple[str, bool]] = {}
    for vol in svc.get("volumes") or []:
        if isinstance(vol, str):
            parts = vol.split(":")
            source, target = parts[0], parts[1]
            read_only = len(parts) > 2 and "ro" in parts[2].split(",")
        else:
            source, target = vol.get("source", ""), vol["target"]
            read_only = bool(vol.get("read_only"))
        mounts[target] = (source, read_only)
    return mounts


def _service_modules_on_disk() -> set[str]:
    if not SERVICES_DIR.is_dir():
        return set()
    return {p.parent.name for p in SERVICES_DIR.glob("*/__main__.py")}


def _expected_service_names() -> set[str]:
    # Never empty: before services/ is written, the fixed list still has to hold.
    return set(EXPECTED_PORTS) | _service_modules_on_disk()


def _runs(svc: dict[str, Any]) -> str | None:
    """Which retrace service a compose service runs, if any."""
    cmd = _command(svc)
    m = _MODULE_CMD.match(cmd) or _UP_CMD.match(cmd)
    return m.group(1) if m else None


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return _load_compose()


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]


# ---------------------------------------------------------------------------
# schema
# ---------------------------------------------------------------------------
def test_vendored_schema_is_a_valid_draft7_schema() -> None:
    jsonschema.Draft7Validator.check_schema(_load_schema())


@pytest.mark.parametrize(
    "validator_cls",
    [jsonschema.Draft7Validator, jsonschema.Draft201909Validator],
    ids=["draft7", "draft2019-09"],
)
def test_compose_file_validates_against_compose_spec(compose: dict[str, Any], validator_cls: Any):
    # The file's $schema names draft 2019-09 (as a URI jsonschema doesn't
    # recognise); its keywords mean the same under draft 7. Both must pass.
    assert _errors(compose, validator_cls) == []


def test_no_obsolete_version_key(compose: dict[str, Any]) -> None:
    assert "version" not in compose


@pytest.mark.parametrize(
    "breakage",
    [
        "ports_as_string",
        "unknown_top_level_key",
        "unknown_service_key",
        "bad_depends_on_condition",
        "bad_healthcheck_duration",
    ],
)
def test_schema_rejects_broken_documents(compose: dict[str, Any], breakage: str) -> None:
    broken = copy.deepcopy(compose)
    router = broken["services"]["router"]
    if breakage == "ports_as_string":
        router["ports"] = "8080"
        where = "services/router/ports"
    elif breakage == "unknown_top_level_key":
        broken["servicez"] = {}
        where = "<root>"
    elif breakage == "unknown_service_key":
        router["helthcheck"] = router["healthcheck"]
        where = "services/router"
    elif breakage == "bad_depends_on_condition":
        router["depends_on"] = {"nats": {"condition": "service_ready"}}
        where = "services/router/depends_on"
    else:
        router["healthcheck"] = {**router["healthcheck"], "interval": "ten seconds"}
        where = "services/router/healthcheck/interval"
    errors = _errors(broken)
    assert errors, f"{breakage}: the validator accepted a broken document"
    assert any(e.startswith(where + ":") for e in errors), errors


# ---------------------------------------------------------------------------
# consistency with the project
# ---------------------------------------------------------------------------
def test_every_service_package_runs_in_compose(services: dict[str, dict[str, Any]]) -> None:
    running = {_runs(svc) for name, svc in services.items() if not _profiles(svc)}
    missing = _expected_service_names() - running
    assert not missing, f"no default-profile compose service runs: {sorted(missing)}"


def test_compose_runs_only_known_services(services: dict[str, dict[str, Any]]) -> None:
    known = _expected_service_names()
    for name, svc in services.items():
        runs = _runs(svc)
        if runs is not None:
            assert runs in known, f"{name} runs unknown module services.{runs}"
        elif _is_project_image(svc):
            assert _command(svc) in ("retrace migrate", GATE_COMMAND), f"{name}: unexpected command"


def test_each_service_runs_once_in_the_default_profile(services: dict[str, dict[str, Any]]):
    runs = [_runs(svc) for svc in services.values() if not _profiles(svc) and _runs(svc)]
    assert len(runs) == len(set(runs)), runs


def test_depends_on_targets_exist_and_are_active(services: dict[str, dict[str, Any]]) -> None:
    for name, svc in services.items():
        for target in _depends_on(svc):
            assert target in services, f"{name} depends on undefined service {target}"
            assert target != name
            # A default service may not wait on one that only a profile starts.
            assert _profiles(services[target]) <= _profiles(svc) or not _profiles(
                services[target]
            ), f"{name} depends on {target}, which runs only under {_profiles(services[target])}"


def test_services_wait_for_migrations_and_nats(services: dict[str, dict[str, Any]]) -> None:
    assert services["migrations"]["restart"] == "no"
    assert _command(services["migrations"]) == "retrace migrate"
    assert _depends_on(services["migrations"]) == {"postgres": "service_healthy"}
    for name, svc in services.items():
        if _runs(svc) is None:
            continue
        deps = _depends_on(svc)
        assert deps.get("migrations") == "service_completed_successfully", name
        assert "nats" in deps, name
        assert svc.get("restart") == "unless-stopped", name


def test_project_image_services_have_healthchecks(services: dict[str, dict[str, Any]]) -> None:
    for name, svc in services.items():
        if not _is_project_image(svc):
            continue
        if svc.get("restart") == "no":  # one-shot job (migrations)
            assert "healthcheck" not in svc, name
            continue
        hc = svc.get("healthcheck")
        assert hc and not hc.get("disable"), f"{name} has no healthcheck"
        test = hc["test"]
        assert isinstance(test, list) and test[0] == "CMD", f"{name}: use exec form, no shell"
        assert test[1] in ("python", "python3") and test[2] == "-c", name
        code = test[3]
        compile(code, f"<{name} healthcheck>", "exec")
        assert "urllib" in code and "/healthz" in code and "127.0.0.1" in code, name
        assert "curl" not in " ".join(test) and "wget" not in " ".join(test), name
        port = _env(svc).get("RETRACE_HTTP_PORT")
        assert port is not None, f"{name} sets no RETRACE_HTTP_PORT"
        assert "RETRACE_HTTP_PORT" in code or f":{port}/healthz" in code, name


def test_http_ports_and_environment(services: dict[str, dict[str, Any]]) -> None:
    for name, svc in services.items():
        runs = _runs(svc)
        if runs is None:
            continue
        env = _env(svc)
        if runs in EXPECTED_PORTS:
            assert env.get("RETRACE_HTTP_PORT") == str(EXPECTED_PORTS[runs]), name
        assert env.get("RETRACE_HTTP_HOST") == "0.0.0.0", name
        # with the user and password nats requires (no anonymous clients)
        assert env.get("RETRACE_NATS_URL") == f"nats://retrace:{NATS_PASSWORD}@nats:4222", name
        assert env.get("RETRACE_DATABASE_URL", "").startswith("postgresql+asyncpg://"), name
        assert "@postgres:5432/" in (env.get("RETRACE_DATABASE_URL") or ""), name
        assert env.get("RETRACE_LOG_FORMAT") == "json", name
        assert env.get("RETRACE_STORAGE_ARTIFACT_DIR") == ARTIFACT_DIR, name


def test_every_retrace_variable_is_a_real_setting(services: dict[str, dict[str, Any]]) -> None:
    """A misspelt or retired variable would be ignored silently by the services."""
    known = {pack.ENV}  # read by routing wherever it runs, not by one service's settings
    for block in msgspec.structs.fields(ServiceConfig):
        for field in msgspec.structs.fields(block.type):
            known.add(f"RETRACE_{block.name}_{field.name}".upper())
    for name, svc in services.items():
        own = _gate_variables() if _command(svc) == GATE_COMMAND else _own(_runs(svc))
        unknown = {k for k in _env(svc) if k.startswith("RETRACE_")} - known - own
        assert not unknown, f"{name} sets variables no service reads: {sorted(unknown)}"


def _gate_variables() -> set[str]:
    """The variables `retrace model-gate` reads: its options'."""
    from shared.cli.serve import model_gate

    return {p.envvar for p in model_gate.params if isinstance(p.envvar, str)}


def _own(service: str | None) -> set[str]:
    """`RETRACE_<SERVICE>_<FIELD>` for the settings only `service` reads (its config class)."""
    if service is None:
        return set()
    module = importlib.import_module(f"services.{service}.config")
    own: set[str] = set()
    for value in vars(module).values():
        if (
            isinstance(value, type)
            and issubclass(value, ServiceConfig)
            and value is not ServiceConfig
        ):
            shared = {f.name for f in msgspec.structs.fields(ServiceConfig)}
            own |= {
                f"RETRACE_{service}_{f.name}".upper()
                for f in msgspec.structs.fields(value)
                if f.name not in shared
            }
    return own


def test_router_publishes_8080_on_this_machine_by_default(
    services: dict[str, dict[str, Any]],
) -> None:
    """The secrets' defaults are written in compose.yaml, and a bare "8080:8080" published
    the router (its /metrics readable with the default key) to every network the machine
    is on: the router and the control API are on 127.0.0.1 unless the operator says."""
    ports = services["router"].get("ports") or []
    assert "${RETRACE_PUBLISH_HOST:-127.0.0.1}:8080:8080" in [str(p) for p in ports], ports
    assert services["api"].get("ports") == ["${RETRACE_PUBLISH_HOST:-127.0.0.1}:8090:8090"]
    for name, svc in services.items():
        for port in svc.get("ports") or []:
            host = str(port).rsplit(":", 2)[0]
            assert host in ("127.0.0.1", "${RETRACE_PUBLISH_HOST:-127.0.0.1}"), (name, port)
    # Only the public APIs (the router, the control API) and the model gate publish ports.
    for name, svc in services.items():
        if svc.get("ports"):
            assert name in {"router", "api", "model-gate"}, f"{name} publishes {svc['ports']}"


def test_artifact_volume_is_shared(compose: dict[str, Any], services: dict[str, Any]) -> None:
    users = {n for n, s in services.items() if _runs(s) in ARTIFACT_USERS} | ARTIFACT_READERS
    sources = set()
    for name in users:
        mount = _volume_mounts(services[name]).get(ARTIFACT_DIR)
        assert mount is not None, f"{name} does not mount {ARTIFACT_DIR}"
        source, read_only = mount
        sources.add(source)
        assert read_only == (name in ARTIFACT_READERS), f"{name}: read_only={read_only}"
    assert len(sources) == 1, sources
    assert sources <= set(compose.get("volumes") or {}), "artifacts must be a named volume"


def test_named_volumes_are_declared(compose: dict[str, Any], services: dict[str, Any]) -> None:
    declared = set(compose.get("volumes") or {})
    for name, svc in services.items():
        for source, _ in _volume_mounts(svc).values():
            if source and not source.startswith((".", "/", "~", "$")):
                assert source in declared, f"{name} mounts undeclared volume {source}"


def test_gpu_profile(services: dict[str, dict[str, Any]]) -> None:
    gpu = {name for name, svc in services.items() if "gpu" in _profiles(svc)}
    assert gpu >= GPU_PROFILE_SERVICES, gpu
    for name in GPU_PROFILE_SERVICES:
        assert _gpu_devices(services[name]), f"{name} reserves no GPU"
    for name, svc in services.items():
        if not _profiles(svc):
            assert not _gpu_devices(svc), f"default-profile service {name} reserves a GPU"


def test_vllm_serves_runtime_loras(services: dict[str, dict[str, Any]]) -> None:
    vllm = services["vllm"]
    assert str(vllm["image"]).startswith("vllm/vllm-openai")
    cmd = _command(vllm)
    for flag in (
        "--enable-lora",
        "--max-loras 8",
        "--max-lora-rank 16",
        "--enable-auto-tool-choice",
        "--tool-call-parser hermes",
        "--port 8000",
    ):
        assert flag in cmd, flag
    # the default agent model, under the name agents use for it
    assert "Qwen/Qwen2.5-Coder-0.5B-Instruct" in cmd
    assert f"--served-model-name ${{RETRACE_VLLM_SERVED_NAME:-{DEFAULT_AGENT_MODEL}}}" in cmd
    assert _env(vllm).get("VLLM_ALLOW_RUNTIME_LORA_UPDATING") == "True"


def test_vllm_is_reached_through_the_gate_only(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    """Issue 14: vllm's key guards its /v1 routes only, it has no admin key and it loads
    LoRA from any path it reads. It publishes no port and shares its network with the gate
    alone; the gate alone holds its key; the services reach the gate with the model
    server's key and admin key."""
    vllm, gate = services["vllm"], services["model-gate"]
    assert not vllm.get("ports") and vllm["networks"] == ["engine"]
    assert "engine" in compose["networks"]
    on_engine = {n for n, s in services.items() if "engine" in (s.get("networks") or [])}
    assert on_engine == {"vllm", "model-gate"}
    assert sorted(gate["networks"]) == ["default", "engine"]
    assert [str(p) for p in gate.get("ports") or []] == ["127.0.0.1:8000:8000"]
    assert _profiles(gate) == {"gpu"} and _depends_on(gate) == {"vllm": "service_healthy"}
    vllm_key = "${RETRACE_VLLM_KEY:-retrace-local-vllm-key}"
    assert f"--api-key {vllm_key}" in _command(vllm)
    for name, svc in services.items():
        holds = vllm_key in json.dumps(_env(svc)) or vllm_key in _command(svc)
        assert holds == (name in {"vllm", "model-gate"}), name
    assert _env(gate)["RETRACE_MODEL_UPSTREAM_KEY"] == vllm_key
    key = "${RETRACE_MODEL_API_KEY:-retrace-local-model-key}"
    admin = "${RETRACE_MODEL_ADMIN_KEY:-retrace-local-model-admin-key}"
    assert _env(gate)["RETRACE_MODEL_API_KEY"] == key
    assert _env(gate)["RETRACE_MODEL_ADMIN_KEY"] == admin
    for name, svc in services.items():
        if _env(svc).get("RETRACE_MODEL_URL"):
            assert (
                _env(svc)["RETRACE_MODEL_URL"] == "${RETRACE_MODEL_URL:-http://model-gate:8000/v1}"
            )
            assert _env(svc).get("RETRACE_MODEL_API_KEY") == key, name
        # the admin key only where adapters are loaded
        loads = _runs(svc) in ADAPTER_LOADERS or name == "model-gate"
        assert (_env(svc).get("RETRACE_MODEL_ADMIN_KEY") == admin) == loads, name
    assert _depends_on(services["train-gpu"])["model-gate"] == "service_healthy"


def test_train_gpu_builds_the_train_extra(services: dict[str, dict[str, Any]]) -> None:
    train_gpu = services["train-gpu"]
    assert _runs(train_gpu) == "train"
    extras = str(train_gpu["build"]["args"]["EXTRAS"])
    with (ROOT / "pyproject.toml").open("rb") as f:
        optional = tomllib.load(f)["project"]["optional-dependencies"]
    for extra in filter(None, (e.strip() for e in extras.split(","))):
        assert extra in optional, f"EXTRAS={extra!r} is not an extra in pyproject.toml"
    assert "train" in extras
    assert any(r.replace(" ", "").startswith("torch==") for r in optional["train"])
    # The default image must stay lean: no extras, never dev.
    for name, svc in services.items():
        if _is_project_image(svc) and name != "train-gpu":
            assert (svc["build"].get("args") or {}).get("EXTRAS", "") == "", name
        assert "dev" not in str((svc.get("build") or {}).get("args", {})), name


def test_nats_jetstream_on_a_volume(services: dict[str, dict[str, Any]]) -> None:
    nats = services["nats"]
    assert str(nats["image"]).startswith("nats:2.10")
    cmd = _command(nats).split()
    assert "--jetstream" in cmd or "-js" in cmd
    store = cmd[cmd.index("--store_dir") + 1] if "--store_dir" in cmd else cmd[cmd.index("-sd") + 1]
    assert store in _volume_mounts(nats)
    assert "8222" in cmd and ("-m" in cmd or "--http_port" in cmd)
    assert cmd[cmd.index("--user") + 1] == "retrace"
    assert cmd[cmd.index("--pass") + 1] == NATS_PASSWORD


def test_postgres(services: dict[str, dict[str, Any]]) -> None:
    pg = services["postgres"]
    assert str(pg["image"]).startswith("postgres:16")
    env = _env(pg)
    assert env["POSTGRES_USER"] == env["POSTGRES_PASSWORD"] == env["POSTGRES_DB"] == "retrace"
    assert "pg_isready" in " ".join(pg["healthcheck"]["test"])
    assert "/var/lib/postgresql/data" in _volume_mounts(pg)


# ---------------------------------------------------------------------------
# the healthcheck probe really works (run against a local HTTP server)
# ---------------------------------------------------------------------------
class _Health(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        code = self.status if self.path == "/healthz" else 404
        body = json.dumps({"ok": code == 200}).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def health_server() -> Iterator[tuple[int, type[_Health]]]:
    handler = type("Handler", (_Health,), {})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], handler
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_healthcheck_probe_exit_codes(
    services: dict[str, dict[str, Any]], health_server: tuple[int, type[_Health]]
) -> None:
    port, handler = health_server
    test = services["router"]["healthcheck"]["test"]
    code = test[3].replace(f":{EXPECTED_PORTS['router']}/", f":{port}/")
    env = {**os.environ, "RETRACE_HTTP_PORT": str(port)}

    def probe() -> int:
        return subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, timeout=30
        ).returncode

    handler.status = 200
    assert probe() == 0
    handler.status = 503
    assert probe() != 0


def test_the_router_s_metrics_need_a_key_and_its_spool_is_on_a_volume(
    services: dict[str, dict[str, Any]],
) -> None:
    """Issue 14: the router's public port served /metrics (every tenant's adapter names) to
    anyone; turns spooled at shutdown must outlive the container."""
    router = services["router"]
    env = _env(router)
    assert env.get("RETRACE_HTTP_METRICS_KEY"), env
    spool = env.get("RETRACE_ROUTER_SPOOL_DIR")
    assert spool in _volume_mounts(router)  # keyed by target
    # the requests in flight, then the store's wait, both before Docker's SIGKILL
    grace = float(env.get("RETRACE_CONSUMER_SHUTDOWN_GRACE") or 30)
    stop = router.get("stop_grace_period", "10s")
    assert 2 * grace < float(str(stop).removesuffix("s")), (grace, stop)
