"""`sdar size` as rich tables: the settings, memory per model role, the peak of each phase and its
verdict, what would make it fit, and the cost of the instances it fits on."""

from __future__ import annotations

from typing import Any

from sdar.console import make_console
from sdar.sizing.fit import Sizing
from sdar.sizing.memory import PHASE_TITLE, MemoryBudget, activation_bytes_per_layer
from sdar.sizing.prices import PRICES_AS_OF
from sdar.sizing.settings import SizingSettings
from sdar.sizing.units import GiB


def render(sizing: Sizing, console=None) -> None:
    """Print the sizing as rich tables."""
    console = console or make_console()
    m = sizing.memory
    _print_settings(m, console)
    _print_memory(m, console)
    _print_phases(m, console)
    _print_verdict(sizing, console)
    _print_costs(sizing, console)


def _print_settings(m: MemoryBudget, console) -> None:
    """Two lines: the model and the GPU layout, then the batch the step runs."""
    s, a = m.settings, m.arch
    mode = f"LoRA r={s.lora_r}" if s.lora else "full fine-tune"
    layout = (
        f"colocated (vLLM util {s.util:g})"
        if s.colocate
        else f"split: {s.train_gpus} train + {s.n_rollout_gpus} vLLM GPUs (util {s.util:g})"
    )
    sharded = s.shard and s.train_gpus > 1
    sharding = f"FSDP-sharded over {s.train_gpus}" if sharded else "not sharded"
    console.print(f"[bold]{a.name}[/bold]: {a.params() / 1e9:.2f}B params ({m.source}); "
                  f"{s.gpus} x {s.gpu_mem:g} GiB, {mode}, {sharding}, {layout}")
    console.print(
        f"rollout batch {s.tasks_per_step} tasks x G={s.group_size} = {s.rollout_sequences} seqs "
        f"x {s.seq_len} tok; teacher +{s.teacher_extra_tokens} tok; micro-batch {s.micro_batch}; "
        f"checkpointing {'on' if s.checkpointing else 'off'}"
    )


def _print_memory(m: MemoryBudget, console) -> None:
    """The memory table: one row per item, by role, with its formula and its phases."""
    from rich.table import Table

    a = m.arch
    t = Table(title="memory per GPU by model role")
    for col, kw in (
        ("role", {}),
        ("item", {}),
        ("formula", {"overflow": "fold"}),
        ("GiB/GPU", {"justify": "right"}),
        ("in phase", {}),
    ):
        t.add_column(col, **kw)
    short = {"rollout": "R", "teacher": "T", "update": "U"}
    last_role = None
    for i in m.items:
        where = "+".join(short[p] for p in i.phases) if i.phases else (i.note or "info")
        style = "dim" if not i.phases else None
        t.add_row(
            i.role if i.role != last_role else "",
            i.name,
            i.formula,
            f"{i.gib:.2f}",
            where,
            style=style,
            end_section=False,
        )
        last_role = i.role
    console.print(t)
    console.print(
        f"[dim]h={a.hidden}, I={a.intermediate} (MLP), kv={a.kv_dim} (K/V width), vocab {a.vocab}; "
        f"1 layer's saved activations = 12h+4kv+8I = {activation_bytes_per_layer(a, 1)} B/tok "
        f"(Korthikanti et al. 2022, adapted); K/V = 2 x {a.layers} layers x {a.kv_heads} heads x "
        f"{a.hd} x 2 B = {a.kv_bytes_per_token()} B/tok[/dim]"
    )


def _print_phases(m: MemoryBudget, console) -> None:
    """The peak of each phase against the usable memory, and how vLLM runs the rollout batch."""
    from rich.table import Table

    s = m.settings
    p = Table(title=f"peak per GPU by phase (R, T, U above); "
                    f"usable = {s.gpu_mem:g} GiB - {s.headroom:.0%} headroom")
    for col in ("phase", "GPUs", "peak GiB", "usable GiB", "verdict"):
        p.add_column(col, justify="right" if "GiB" in col or col == "GPUs" else "left")
    for ph in m.phases:
        p.add_row(
            PHASE_TITLE[ph.phase],
            str(ph.gpus),
            f"{ph.bytes / GiB:.1f}",
            f"{ph.usable / GiB:.1f}",
            "[green]fits[/green]" if ph.fits else "[red]does not fit[/red]",
        )
    console.print(p)
    r = m.rollout
    console.print(
        f"vLLM: TP={r['tp']} ({r['tp_reason']}), {r['replicas']} replica(s), "
        f"{r['seqs_per_replica']} seqs each, {r['seqs_at_once']} at once"
        + (f", {r['waves']} wave(s)" if r["waves"] else "")
    )


def _print_verdict(sizing: Sizing, console) -> None:
    """FITS with the peak, or DOES NOT FIT with the problems and what would make it fit."""
    m, s = sizing.memory, sizing.memory.settings
    if m.fits:
        console.print(f"[bold green]FITS[/bold green]: peak {m.peak / GiB:.1f} of "
                      f"{s.usable_bytes / GiB:.1f} GiB usable per GPU")
        return
    console.print("[bold red]DOES NOT FIT[/bold red]")
    for prob in m.problems:
        console.print(f"  - {prob}")
    console.print("to make it fit:")
    for sug in sizing.suggestions:
        console.print(f"  - {sug}")


def _print_costs(sizing: Sizing, console) -> None:
    """The cost table (the recommendation marked *), the recommendation, and a note on step time."""
    s, rec = sizing.memory.settings, sizing.recommendation
    rows = list(sizing.alternatives)
    if rec and all(x["instance"] != rec["instance"] for x in rows):
        rows.insert(0, rec)
    if rows:
        console.print(_cost_table(s, rows, rec))
    if rec:
        _print_recommendation(s, rec, console)
    elif sizing.memory.fits:
        console.print("no catalog instance has GPUs this large; pick one from the table above")
    console.print(
        "[dim]step time is your input (--step-seconds); slower GPUs (L4, A10G, L40S) take "
        "longer per step than the same count of A100/H100, so compare run costs with measured "
        "step times.[/dim]"
    )


def _cost_table(s: SizingSettings, rows: list[dict[str, Any]], rec: dict[str, Any] | None):
    from rich.table import Table

    c = Table(
        title=f"cost of {s.runs} run(s): {s.steps} steps x {s.step_seconds:g} s "
        f"(us-east-1 list prices as of {PRICES_AS_OF}: check them)"
    )
    for col in (
        "instance",
        "GPUs",
        "count",
        "on-demand $/h",
        "spot $/h",
        "hours",
        "on-demand $",
        "spot $",
    ):
        c.add_column(col, justify="left" if col == "instance" else "right")
    for x in rows:
        mark = " *" if rec and x["instance"] == rec["instance"] else ""
        c.add_row(
            x["instance"] + mark,
            f"{x['gpu']} {x['gpu_mem']}G",
            str(x["instances"]),
            f"{x['on_demand_hourly']:.2f}",
            f"{x['spot_hourly']:.2f}",
            f"{x['hours']:.1f}",
            f"{x['on_demand_cost']:,.0f}",
            f"{x['spot_cost']:,.0f}",
        )
    return c


def _print_recommendation(s: SizingSettings, rec: dict[str, Any], console) -> None:
    head = "spot" if s.spot else "on-demand"
    cost = rec["spot_cost"] if s.spot else rec["on_demand_cost"]
    console.print(
        f"recommended: [bold]{rec['instances']} x {rec['instance']}[/bold] ({rec['why']}): "
        f"{head} ${cost:,.0f} for the run"
        + (
            f"; spot ${rec['spot_cost']:,.0f} (discount {s.spot_discount:.0%}, "
            f"+{s.spot_overhead:.0%} time for interruptions)"
            if not s.spot
            else ""
        )
    )
    if rec["instances"] > 1:
        console.print(
            "  (more than one node: FSDP and weight sync cross EFA; expect slower steps)"
        )
