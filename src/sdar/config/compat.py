"""What keeps configs, checkpoints and results made by older code valid: settings that moved into sections (refused
with their new place, and turned back into the flat layout every identity is computed from), and fields added later
(left out of every identity at their default)."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import fields, is_dataclass
from typing import Any

from sdar.config.schema import TrainConfig

# TrainConfig's settings were one flat list of 50; they are grouped into sections now. A config (or an --set)
# that still names one of these is refused with its new place: old flat key -> its dotted key now.
MOVED_KEYS: dict[str, str] = {
    "lr": "optim.lr",
    "weight_decay": "optim.weight_decay",
    "grad_clip": "optim.grad_clip",
    "guard_updates": "optim.guard_updates",
    "max_skipped_update_frac": "optim.max_skipped_update_frac",
    "mini_batch_size": "ppo.mini_batch_size",
    "micro_batch_size": "ppo.micro_batch_size",
    "ppo_epochs": "ppo.epochs",
    "loss_normalisation": "ppo.loss_normalisation",
    "shuffle_mini_batches": "ppo.shuffle_mini_batches",
    "reuse_old_logp": "ppo.reuse_old_logp",
    "old_logp_from_sampler": "ppo.old_logp_from_sampler",
    "score_batch_size": "scoring.batch_size",
    "prefix_cache": "scoring.prefix_cache",
    "dedup_scoring": "scoring.dedup",
    "merged_inference": "scoring.merged_inference",
    "length_buckets": "scoring.length_buckets",
    "head_at_free_tokens": "scoring.head_at_free_tokens",
    "teacher_max_prompt_tokens": "teacher.max_prompt_tokens",
    "teacher_for_all_arms": "teacher.for_all_arms",
    "teacher_engine": "teacher.engine",
    "eval_every": "eval.every",
    "eval_tasks": "eval.tasks",
    "eval_task_order": "eval.task_order",
    "eval_task_ids": "eval.task_ids",
    "eval_temperature": "eval.temperature",
    "checkpoint_every": "checkpoint.every",
    "keep_checkpoints": "checkpoint.keep",
    "checkpoint_uri": "checkpoint.uri",
    "checkpoint_retry_s": "checkpoint.retry_s",
    "group_seeded_rollouts": "rollout.group_seeded",
}


# Switches that chose between paths computing the same numbers (up to float rounding), retired: the runtime takes
# every such shortcut itself (sdar.train.runtime.Shortcuts; checks and benchmarks turn them off there). A config
# that still names one loads, with a note that it is ignored; every identity keeps them at these values, the ones
# every run recorded before had. Dotted key -> that value.
RETIRED: dict[str, bool] = {
    "rollout.jump_forward": True, "rollout.share_prefix": True, "ppo.reuse_old_logp": True,
    "ppo.old_logp_from_sampler": True, "scoring.prefix_cache": True, "scoring.dedup": True,
    "scoring.merged_inference": True, "scoring.length_buckets": True, "scoring.head_at_free_tokens": True,
}


# Values retired from a setting that stays: the path they chose is gone and another computes the same numbers (up to
# float rounding). A config that still names one loads with the value that replaced it, and a note. Dotted key ->
# {old value: its replacement}.
RETIRED_VALUES: dict[str, dict[Any, Any]] = {
    # the per-row sampler: every row now decides in one batched pass (sdar.agent.decoding; the per-row path is the
    # test oracle tests/agent/row_oracle.py)
    "rollout.sampler": {"rows": "batched"},
}


def drop_retired(data: dict[str, Any], where: str = "config") -> list[str]:
    """Remove the RETIRED settings from `data` (a config's nested dict, or its old flat keys) and map the
    RETIRED_VALUES to their replacements; returns a note per setting changed, for the loader to print."""
    notes = []
    for key, mapping in RETIRED_VALUES.items():
        head, _, name = key.partition(".")
        section = data.get(head)
        if isinstance(section, dict) and isinstance(section.get(name), str) and section[name] in mapping:
            old = section[name]
            section[name] = mapping[old]
            notes.append(f"note: {key}={old!r} in {where} is retired and runs as {key}={mapping[old]!r}: the same "
                         "numbers up to float rounding (docs/training.md#speed-ups)")
    flat = {old: new for old, new in MOVED_KEYS.items() if new in RETIRED}
    for key in RETIRED:
        head, _, name = key.partition(".")
        section = data.get(head)
        found = [(section, name, key)] if isinstance(section, dict) and name in section else []
        found += [(data, old, old) for old, new in flat.items() if new == key and old in data]
        for holder, name_there, shown in found:
            value = holder.pop(name_there)
            notes.append(f"note: {shown}={value!r} in {where} is ignored: it no longer chooses anything (the runtime "
                         "takes every shortcut that keeps the numbers itself: docs/training.md#speed-ups)")
        if isinstance(section, dict) and not section and head in data:
            del data[head]
    return notes


def _added_fields(cls: type, prefix: str = "") -> dict[str, dataclasses.Field]:
    hints = typing.get_type_hints(cls)
    out: dict[str, dataclasses.Field] = {}
    for f in fields(cls):
        if is_dataclass(hints[f.name]):
            out.update(_added_fields(hints[f.name], f"{prefix}{f.name}."))
        elif f.metadata.get("added"):
            out[f"{prefix}{f.name}"] = f
    return out


def _neutral(f: dataclasses.Field) -> Any:
    """The value of an added field that changes nothing: its "before" (the behaviour records made before the field
    had, where it differs from the default), else its default."""
    if "before" in f.metadata:
        return f.metadata["before"]
    return f.default if f.default is not dataclasses.MISSING else f.default_factory()


# Fields added after checkpoints and results were made with the behaviour of their default (`"added": True` in the
# field's metadata): at that default they are left out of every identity (the warm-start cache key, a study run's
# fingerprint), so what was built and recorded before they existed keeps its identity. "section.field" -> the
# value that changes nothing: the default, or the field's "before" where its default changed what runs (a run at the
# new default then has an identity of its own).
_ADDED = _added_fields(TrainConfig)
ADDED_DEFAULTS: dict[str, Any] = {key: _neutral(f) for key, f in _ADDED.items()}
# "section.field" -> its "inert_when" (metadata): a test of a whole config (asdict, nested) that says the field
# changes nothing in it, so that it is left out of that config's identity at any value
INERT_WHEN: dict[str, Any] = {key: f.metadata["inert_when"] for key, f in _ADDED.items() if "inert_when" in f.metadata}


def flat_layout(d: dict[str, Any]) -> dict[str, Any]:
    """`d` (asdict of a TrainConfig) in the flat layout configs had before the sections (MOVED_KEYS backwards):
    what every identity is computed from (the warm-start cache key, a study run's fingerprint), so a run
    recorded before the sections has the same identity after them."""
    d = {k: (dict(v) if isinstance(v, dict) else v) for k, v in d.items()}
    for key, value in RETIRED.items():  # the retired switches at the value every recorded run had
        head, _, name = key.partition(".")
        d.setdefault(head, {}).setdefault(name, value)
    for old, new in MOVED_KEYS.items():
        head, _, name = new.partition(".")
        if isinstance(d.get(head), dict) and name in d[head]:
            d[old] = d[head].pop(name)
    for head in {new.partition(".")[0] for new in MOVED_KEYS.values()}:
        if d.get(head) == {}:
            del d[head]
    return d


def _inert(d: dict[str, Any]) -> set[str]:
    """The ADDED_DEFAULTS fields that change nothing in config `d` (whole, either layout): those whose
    "inert_when" says so, left out of its identity at any value."""
    return {key for key, inert in INERT_WHEN.items() if inert(d)}


def drop_added_defaults(d: dict[str, Any], section: str = "") -> dict[str, Any]:
    """`d` (asdict of a TrainConfig, or of its `section`) without the ADDED_DEFAULTS fields at their default (or
    its "before"), nor those that change nothing in it (`_inert`, for a whole config)."""
    inert = set() if section else _inert(d)
    for key, default in ADDED_DEFAULTS.items():
        head, _, name = key.rpartition(".")
        if section:  # d is that section alone
            sub = d if head == section else None
        else:  # d is the whole config
            sub = d.get(head) if head else d
        if isinstance(sub, dict) and name in sub and (sub[name] == default or key in inert):
            del sub[name]
            if not section and head and not sub:  # a section added whole (distributed), at its defaults
                del d[head]
    return d
