"""Which instances a sizing fits on, the one to rent, what would make a sizing that does not fit
fit, and `size_run`: the whole sizing of one model and settings."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from sdar.sizing.arch import Arch, resolve_model
from sdar.sizing.memory import MemoryBudget, memory_budget
from sdar.sizing.prices import INSTANCE_BY_NAME, INSTANCES, PRICES_AS_OF, Instance, instances_needed
from sdar.sizing.settings import SizingSettings
from sdar.sizing.units import GiB, SizingError


def run_cost(s: SizingSettings, inst: Instance) -> dict[str, float]:
    """cost = runs * steps * step_seconds / 3600 * hourly price * instances; spot adds the overhead
    wall time (interruptions, restarts from checkpoint) at the spot price."""
    count = instances_needed(inst, s.gpus)
    hourly = s.price if s.price is not None else inst.on_demand
    spot_hourly = s.spot_price if s.spot_price is not None else hourly * (1 - s.spot_discount)
    hours = s.runs * s.steps * s.step_seconds / 3600
    spot_hours = hours * (1 + s.spot_overhead)
    return {
        "instance": inst.name,
        "instances": count,
        "gpus_rented": count * inst.gpus,
        "on_demand_hourly": hourly * count,
        "spot_hourly": spot_hourly * count,
        "hours": hours,
        "spot_hours": spot_hours,
        "on_demand_cost": hours * hourly * count,
        "spot_cost": spot_hours * spot_hourly * count,
    }


def _candidate(inst: Instance, gpus: int) -> bool:
    """One node that holds every GPU, or several full 8-GPU nodes: FSDP over many 1- or 4-GPU nodes
    on plain Ethernet is not a setup worth recommending."""
    return gpus <= inst.gpus or inst.gpus == 8


def _fits_on(arch: Arch, s: SizingSettings, inst: Instance) -> bool:
    try:
        return memory_budget(arch, replace(s, gpu_mem=inst.gpu_mem, instance=None)).fits
    except SizingError:
        return False


def options_that_fit(arch: Arch, s: SizingSettings) -> list[dict[str, Any]]:
    """Every catalog instance on which this sizing fits with the same GPU count, cheapest first."""
    key = "spot_cost" if s.spot else "on_demand_cost"
    out = [
        run_cost(s, i) | {"gpu": i.gpu, "gpu_mem": i.gpu_mem}
        for i in INSTANCES
        if _candidate(i, s.gpus) and _fits_on(arch, s, i)
    ]
    return sorted(out, key=lambda c: (c[key], c["instances"]))


def recommend(arch: Arch, s: SizingSettings, budget: MemoryBudget) -> dict[str, Any] | None:
    """The cheapest instance with GPUs of at least --gpu-mem on which the budget fits, or the
    --instance asked for."""
    if s.instance:
        inst = INSTANCE_BY_NAME[s.instance]
        return run_cost(s, inst) | {"gpu": inst.gpu, "gpu_mem": inst.gpu_mem, "why": "--instance"}
    if not budget.fits:
        return None
    key = "spot_cost" if s.spot else "on_demand_cost"
    same = [
        run_cost(s, i) | {"gpu": i.gpu, "gpu_mem": i.gpu_mem}
        for i in INSTANCES
        if i.gpu_mem >= s.gpu_mem and _candidate(i, s.gpus) and _fits_on(arch, s, i)
    ]
    if not same:
        return None
    best = min(same, key=lambda c: (c[key], c["instances"]))
    price = "spot" if s.spot else "on-demand"
    return best | {"why": f"cheapest ({price}) with >= {s.gpu_mem:g} GiB GPUs that fits"}


def suggestions(arch: Arch, s: SizingSettings) -> list[str]:
    """What would make a sizing that does not fit, fit."""
    out = []
    for n in range(s.gpus + 1, 129):
        t = replace(s, gpus=n)
        try:
            if memory_budget(arch, t).fits:
                out.append(f"more GPUs: {n} x {s.gpu_mem:g} GiB fits (--gpus {n})")
                break
        except SizingError:
            continue
    if not s.lora:
        try:
            if memory_budget(arch, replace(s, lora=True)).fits:
                out.append(f"LoRA: --lora fits on {s.gpus} x {s.gpu_mem:g} GiB")
        except SizingError:
            pass
    if not s.checkpointing and memory_budget(arch, replace(s, checkpointing=True)).fits:
        out.append("gradient checkpointing: --checkpointing fits")
    if s.micro_batch > 1 and memory_budget(arch, replace(s, micro_batch=1)).fits:
        out.append("a smaller micro-batch: --micro-batch 1 fits")
    if s.colocate and s.gpus >= 2:
        try:
            if memory_budget(arch, replace(s, colocate=False)).fits:
                k = s.gpus // 2
                out.append(f"a split: --no-colocate ({s.gpus - k} train + {k} vLLM GPUs) fits")
        except SizingError:
            pass
    bigger = options_that_fit(arch, replace(s, instance=None))
    if bigger:
        b = bigger[0]
        out.append(f"a bigger instance: {b['instances']} x {b['instance']} "
                   f"({b['gpu']} {b['gpu_mem']} GiB) fits (--gpu-mem {b['gpu_mem']})")
    else:  # whole 8-GPU nodes, full or LoRA
        for nodes in (1, 2, 4):
            t = replace(s, gpus=8 * nodes, instance=None)
            found = options_that_fit(arch, t) or (
                options_that_fit(arch, replace(t, lora=True)) if not s.lora else []
            )
            if found:
                b = found[0]
                lora = "" if s.lora or options_that_fit(arch, t) else " --lora"
                out.append(f"a bigger instance: {b['instances']} x {b['instance']} "
                           f"({b['gpu']} {b['gpu_mem']} GiB) fits with --gpus {8 * nodes} "
                           f"--gpu-mem {b['gpu_mem']}{lora}")
                break
    if not out:
        out.append(
            f"nothing in the catalog fits {s.gpus} GPU(s) of this model; try --lora, more --gpus "
            "or a shorter --seq-len"
        )
    return out


@dataclass
class Sizing:
    """One sizing: the memory budget, the instance to rent, the instances it also fits on, and, when
    it does not fit, what would make it fit."""

    memory: MemoryBudget
    recommendation: dict[str, Any] | None
    alternatives: list[dict[str, Any]]
    suggestions: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return self.memory.fits

    def to_dict(self) -> dict[str, Any]:
        m, s = self.memory, self.memory.settings
        return {
            "model": {
                "name": m.arch.name,
                "source": m.source,
                "params": m.arch.params(),
                "lora_params": m.arch.lora_params(s.lora_r) if s.lora else 0,
                "arch": asdict(m.arch),
            },
            "settings": asdict(s)
            | {
                "train_gpus": s.train_gpus,
                "rollout_gpus": s.n_rollout_gpus,
                "vllm_mem_util": s.util,
            },
            "items": [asdict(i) | {"gib": round(i.gib, 3)} for i in m.items],
            "phases": [
                asdict(p) | {"gib": round(p.bytes / GiB, 3), "usable_gib": round(p.usable / GiB, 3)}
                for p in m.phases
            ],
            "rollout": {k: v for k, v in m.rollout.items()},
            "fits": self.fits,
            "peak_gib": round(m.peak / GiB, 3),
            "problems": m.problems,
            "suggestions": self.suggestions,
            "recommendation": self.recommendation,
            "alternatives": self.alternatives,
            "prices_as_of": PRICES_AS_OF,
        }


def size_run(model: str | Arch, **settings: Any) -> Sizing:
    """The whole sizing: memory per role and phase, the verdict, the instance and the cost.
    `settings` are SizingSettings fields (gpus=8, gpu_mem=80, lora=True, ...)."""
    if isinstance(model, Arch):
        arch, source = model, model.name
    else:
        arch, source = resolve_model(model)
    unknown = sorted(set(settings) - set(SizingSettings.__dataclass_fields__))
    if unknown:
        raise SizingError(
            f"unknown setting(s) {unknown}; valid: {', '.join(SizingSettings.__dataclass_fields__)}"
        )
    s = SizingSettings(**settings)
    mem = memory_budget(arch, s, source)
    alts = options_that_fit(arch, s)
    rec = recommend(arch, s, mem)
    return Sizing(mem, rec, alts, [] if mem.fits else suggestions(arch, s))
