"""`retrace improve` (one TRACE cycle, followed live) and `retrace report` (a cycle's report
as tables, Markdown and PNG plots)."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote

import click
import msgspec
from rich.markup import escape
from rich.table import Table

from shared.cli.context import load_settings, make_console
from shared.cli.control import ApiUnavailable, ControlApi, given
from shared.messages import CycleSettings

console = make_console()
ENDED = ("completed", "failed")
START_RETRY_S = (2.0, 5.0, 15.0)
"""Waits before a start the control API could not confirm is sent again."""


async def _snapshot(api: ControlApi, cycle_id: uuid.UUID) -> dict[str, Any]:
    """The cycle as the control API gives it, with its adapters' held-out results and
    training curves (`heldout`, `curves`) and its running work as progress lines."""
    cycle = await api.call("GET", f"/v1/cycles/{cycle_id}")
    adapters = [
        a
        for a in await api.every(f"/v1/adapters?cycle={cycle_id}")
        if a["cycle_id"] == str(cycle_id)
    ]
    return {
        **cycle,
        "work": [_progress(w) for w in cycle.get("work") or []],
        "heldout": {a["name"]: a["heldout"] for a in adapters if a["heldout"]},
        "curves": [(a["name"], a["training_curve"]) for a in adapters],
    }


def _progress(work: dict[str, Any]) -> str:
    """A running job as one line: what, how far, of how much."""
    total = work["total"]
    share = f" ({work['done'] / total:.0%})" if total else ""
    return f"{work['label']}: {work['done']}/{total} {work['unit']}{share}"


async def run_improve(
    api: ControlApi,
    agent_name: str,
    settings: CycleSettings,
    wait_s: float,
    cycle_id: uuid.UUID | None = None,
) -> tuple[uuid.UUID, dict[str, Any]]:
    """Request a cycle (`cycle_id`, or a new id) and follow it until it ends."""
    cycle_id = cycle_id or uuid.uuid4()
    await request_cycle(api, agent_name, settings, cycle_id)
    return cycle_id, await follow_cycle(api, cycle_id, wait_s)


async def request_cycle(
    api: ControlApi, agent_name: str, settings: CycleSettings, cycle_id: uuid.UUID
) -> None:
    """Start the cycle through the control API (idempotent: the id is the caller's, so a
    start the API could not confirm is sent again, as it asks, a few times)."""
    body = {"cycle_id": str(cycle_id), "settings": msgspec.to_builtins(settings)}
    path = f"/v1/agents/{quote(agent_name, safe='')}/cycles"
    for wait in (*START_RETRY_S, None):
        try:
            await api.call("POST", path, body)
            return
        except ApiUnavailable as exc:
            if wait is None:
                raise
            console.print(f"[yellow]{escape(exc.message)}; asking again in {wait:.0f} s")
            await asyncio.sleep(wait)


async def follow_cycle(api: ControlApi, cycle_id: uuid.UUID, wait_s: float) -> dict[str, Any]:
    """The cycle's snapshot once it has ended, its progress shown meanwhile."""
    deadline = time.monotonic() + wait_s
    started = time.monotonic()
    with console.status("cycle requested") as status:
        while time.monotonic() < deadline:
            try:
                snap = await _snapshot(api, cycle_id)
            except ApiUnavailable as exc:
                # following is read-only: an API or store that is slow or restarting for a
                # moment must not end a follower of a cycle that takes hours
                status.update(f"control API unavailable, retrying: {exc.message}"[:200])
                await asyncio.sleep(5.0)
                continue
            elapsed = time.monotonic() - started
            status.update(
                f"[bold]{snap['state']}[/]  {elapsed:.0f}s"
                + "".join(f"\n  {escape(line)}" for line in snap.get("work") or [])
            )
            if snap["state"] in ENDED:
                return snap
            await asyncio.sleep(2.0)
    raise click.ClickException(f"cycle {cycle_id} did not end in time: see `retrace status`")


def heldout_lines(snap: dict[str, Any]) -> list[str]:
    """Each adapter against the base model on its environment's held-out synthetic tasks."""
    out = []
    for name, h in (snap.get("heldout") or {}).items():
        low, high = h["ci95"]
        out.append(
            f"{name}: held-out synthetic tasks ({h['episodes']} episodes, unhinted) mean reward "
            f"{h['base_mean']:.3f} (base) -> {h['adapter_mean']:.3f} (adapter), gain "
            f"{h['gain']:+.3f} [95% CI {low:+.3f}, {high:+.3f}], p={h['p']:.3g}"
            + (": better than the base" if h["better"] else ": not shown better than the base")
        )
    return out


def print_report(snap: dict[str, Any]) -> None:
    for line in heldout_lines(snap):
        console.print(line)
    report = (snap.get("data") or {}).get("report")
    if not report:
        console.print(f"cycle {snap['state']}: {snap.get('error') or snap.get('reason')}")
        return
    table = Table(title="evaluation on the test split")
    for col in ("configuration", "episodes", "pass rate [95% CI]", "mean reward", "pass^k"):
        table.add_column(col)
    for name, s in report["configs"].items():
        k = max(s["pass_hat_k"], key=int) if s["pass_hat_k"] else None
        table.add_row(
            config_label(report, name),
            str(s["episodes"]),
            f"{s['pass_rate']:.1%} [{s['ci95'][0]:.1%}, {s['ci95'][1]:.1%}]",
            f"{s['mean_reward']:.3f}",
            f"k={k}: {s['pass_hat_k'][k]:.1%}" if k else "-",
        )
    console.print(table)
    c = report["comparison"]
    if report.get("untrained"):
        console.print("no adapter was trained: the routed set is the base model as it is")
    else:
        console.print(
            f"routed vs {report['incumbent']}: {c['diff']:+.3f} per task "
            f"[{c['diff_ci95'][0]:+.3f}, {c['diff_ci95'][1]:+.3f}], McNemar "
            f"p={c['mcnemar_p']:.3g}, bootstrap p={c['bootstrap_p']:.3g}; "
            f"{_ceiling(report)}"
        )
    for name, v in (report.get("baselines") or {}).items():
        console.print(
            f"routed vs {name} (same rollout budget): {v['diff']:+.3f} per task "
            f"[{v['diff_ci95'][0]:+.3f}, {v['diff_ci95'][1]:+.3f}], McNemar p={v['mcnemar_p']:.3g}"
        )
    verdict = report["verdict"]
    console.print(
        ("[green]promoted[/]: " if verdict["promote"] else "[yellow]kept[/]: ") + verdict["reason"]
    )


def config_label(report: dict[str, Any], name: str) -> str:
    """A configuration's name, saying so when it was played only on the tasks routed to it."""
    played = (report.get("played_on") or {}).get(name)
    if played is None:
        return name
    return f"{name} (on the {played} task{'s' if played != 1 else ''} routed to it)"


def _ceiling(report: dict[str, Any]) -> str:
    """The oracle routing ceiling, or why it was not measured."""
    ceiling = report.get("oracle")
    if not ceiling:
        return (
            "oracle routing ceiling not measured (adapters played only where routed; "
            "`--eval-adapters all` measures it)"
        )
    return f"oracle routing ceiling {ceiling['pass_rate']:.1%}"


def write_report(
    snap: dict[str, Any], curves: list[tuple[str, list[dict[str, Any]]]], out: Path
) -> list[Path]:
    """Markdown plus PNG plots (pass rate per configuration with intervals, reward curves)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    report = (snap.get("data") or {}).get("report") or {}

    def save(fig: Any, name: str, caption: str) -> None:
        fig.tight_layout()
        fig.savefig(out / name, dpi=120)
        plt.close(fig)
        written.append(out / name)
        lines.append(f"![{caption}]({name})\n")

    lines = [f"# retrace cycle report\n\nState: {snap['state']}. {snap.get('reason') or ''}\n"]
    held = heldout_lines(snap)
    if held:
        lines += ["## Adapters on held-out synthetic tasks\n", *(f"- {h}" for h in held), ""]
    if report:
        lines.append(
            "| configuration | episodes | pass rate | 95% CI | mean reward | training rollouts "
            "| training wall time |"
        )
        lines.append("|---|---:|---:|---|---:|---:|---:|")
        rollouts = report.get("rollouts_spent") or {}
        walls = report.get("training_wall_s") or {}
        for name, s in report["configs"].items():
            lines.append(
                f"| {config_label(report, name)} | {s['episodes']} | {s['pass_rate']:.1%} | "
                f"[{s['ci95'][0]:.1%}, {s['ci95'][1]:.1%}] | {s['mean_reward']:.3f} | "
                f"{rollouts.get(name, 0)} | {_seconds(walls.get(name))} |"
            )
        c = report["comparison"]
        if report.get("untrained"):
            lines.append(
                "\nNo adapter was trained, so the routed set is the base model as it is. "
                f"Verdict: {report['verdict']['reason']}\n"
            )
        else:
            lines.append(
                f"\nRouted vs {report['incumbent']}: {c['diff']:+.3f} per task, McNemar "
                f"p={c['mcnemar_p']:.3g}, bootstrap p={c['bootstrap_p']:.3g}. "
                f"{_ceiling(report)[0].upper()}{_ceiling(report)[1:]}. "
                f"Verdict: {report['verdict']['reason']}\n"
            )
        fig, ax = plt.subplots(figsize=(7, 4))
        names = list(report["configs"])
        rates = [report["configs"][n]["pass_rate"] for n in names]
        bars = [_error_bar(report["configs"][n]) for n in names]
        ax.bar(
            range(len(names)),
            rates,
            yerr=[[low for low, _ in bars], [high for _, high in bars]],
            capsize=4,
            color="tab:blue",
        )
        ax.set_xticks(range(len(names)), names, rotation=20, ha="right", fontsize=8)
        ax.set_ylabel("pass rate (test split), 95% CI")
        save(fig, "pass_rate.png", "pass rate per configuration")
    spent = report.get("rollouts_spent") or {}
    if report and spent:
        fig, ax = plt.subplots(figsize=(7, 4))
        for name, s in report["configs"].items():
            x = spent.get(name, 0)
            ax.errorbar(
                x,
                s["pass_rate"],
                yerr=[[bar] for bar in _error_bar(s)],
                fmt="o",
                capsize=3,
            )
            ax.annotate(
                name, (x, s["pass_rate"]), fontsize=7, xytext=(4, 4), textcoords="offset points"
            )
        ax.set_xlabel("training rollouts spent")
        ax.set_ylabel("pass rate (test split), 95% CI")
        save(fig, "pass_rate_vs_rollouts.png", "pass rate vs rollouts spent")
    if curves:
        fig, ax = plt.subplots(figsize=(7, 4))
        for name, curve in curves:
            ax.plot([p["rollouts"] for p in curve], [p["mean_reward"] for p in curve], label=name)
        ax.set_xlabel("rollouts spent")
        ax.set_ylabel("mean reward per step")
        ax.legend(fontsize=7)
        save(fig, "reward_curves.png", "training reward curves")
    md = out / "report.md"
    md.write_text("\n".join(lines))
    written.insert(0, md)
    return written


def _seconds(value: object) -> str:
    return f"{value:.0f} s" if isinstance(value, int | float) else "-"


def _error_bar(stats: dict[str, Any]) -> tuple[float, float]:
    """Distances from a pass rate down and up to its interval's ends (never negative)."""
    rate, (low, high) = stats["pass_rate"], stats["ci95"]
    return max(0.0, rate - low), max(0.0, high - rate)


@click.command("improve")
@click.argument("agent_name")
@click.option("--tenant", default="default", envvar="RETRACE_TENANT", show_default=True)
@click.option("--diagnose-tasks", type=int, default=24, show_default=True)
@click.option("--diagnose-trials", type=int, default=4, show_default=True)
@click.option("--eval-tasks", type=int, default=24, show_default=True)
@click.option("--eval-trials", type=int, default=2, show_default=True)
@click.option(
    "--eval-adapters",
    type=click.Choice(["routed", "all"]),
    default="routed",
    show_default=True,
    help="Play each adapter on the test tasks routed to it, or on all of them (which also "
    "measures each adapter alone and the oracle routing ceiling).",
)
@click.option("--budget", type=int, default=None, help="Rollouts per adapter.")
@click.option(
    "--max-tokens", type=int, default=256, show_default=True, help="Per model turn, in rollouts."
)
@click.option(
    "--temperature",
    type=float,
    default=1.0,
    show_default=True,
    help="Sampling temperature of the diagnosis and evaluation rollouts (set the train and "
    "synthesize services' RETRACE_*_TEMPERATURE to match).",
)
@click.option(
    "--max-capabilities",
    type=int,
    default=None,
    help="Train only the diagnosis's best N capabilities (default: every kept one).",
)
@click.option(
    "--spare-capabilities",
    type=int,
    default=1,
    show_default=True,
    help="Capabilities in reserve synthesized beside the chosen ones from the start, to take "
    "a failed one's place at once (0: only after a failure).",
)
@click.option(
    "--route-tasks",
    type=int,
    default=0,
    show_default=True,
    help="Train tasks to learn a router from (base and each adapter run on them once).",
)
@click.option(
    "--baseline/--no-baseline",
    default=True,
    show_default=True,
    help="Also run the baselines (GRPO on the target, GEPA prompt optimisation) with the "
    "same rollouts, and compare.",
)
@click.option(
    "--seed",
    type=int,
    default=1234,
    show_default=True,
    help="Sampling seed of the diagnosis and evaluation rollouts: the same seed, agent and "
    "settings give the same diagnosis; another seed draws other episodes.",
)
@click.option("--wait", "wait_s", default=14_400.0, show_default=True)
def improve(
    agent_name: str,
    tenant: str,
    diagnose_tasks: int,
    diagnose_trials: int,
    eval_tasks: int,
    eval_trials: int,
    eval_adapters: str,
    budget: int | None,
    max_tokens: int,
    temperature: float,
    max_capabilities: int | None,
    spare_capabilities: int,
    route_tasks: int,
    baseline: bool,
    seed: int,
    wait_s: float,
) -> None:
    """Run one TRACE cycle for the agent (diagnose, synthesize, train, evaluate, promote)."""
    raw = {
        "diagnose_tasks": diagnose_tasks,
        "diagnose_trials": diagnose_trials,
        "eval_tasks": eval_tasks,
        "eval_trials": eval_trials,
        "eval_adapters": eval_adapters,
        "rollout_budget": budget,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "max_capabilities": max_capabilities,
        "spare_capabilities": spare_capabilities,
        "route_tasks": route_tasks,
        "baselines": ["grpo_target", "gepa"] if baseline else [],
        "seed": seed,
    }
    try:
        settings = msgspec.convert(raw, CycleSettings)
    except msgspec.ValidationError as exc:
        raise click.BadParameter(str(exc)) from exc
    client = ControlApi.connect(load_settings(), tenant, explicit=given("tenant"))

    async def run() -> dict[str, Any]:
        async with client as api:
            return (await run_improve(api, agent_name, settings, wait_s))[1]

    snap = asyncio.run(run())
    print_report(snap)
    if snap["state"] == "failed":
        raise SystemExit(1)


@click.command("report")
@click.argument("agent_name")
@click.option("--tenant", default="default", envvar="RETRACE_TENANT", show_default=True)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Also write report.md and PNG plots here.",
)
def report(agent_name: str, tenant: str, out: Path | None) -> None:
    """The agent's latest cycle: its report, as tables (and Markdown plus plots with --out)."""
    client = ControlApi.connect(load_settings(), tenant, explicit=given("tenant"))

    async def run() -> dict[str, Any]:
        async with client as api:
            latest = await api.call("GET", f"/v1/cycles?agent={quote(agent_name, safe='')}&limit=1")
            if not latest["data"]:
                raise click.ClickException(f"no cycle for {agent_name!r}: run `retrace improve`")
            return await _snapshot(api, uuid.UUID(latest["data"][0]["id"]))

    snap = asyncio.run(run())
    print_report(snap)
    if out is not None:
        for path in write_report(snap, snap["curves"], out):
            console.print(f"wrote {path}")
