"""`sdar config show` prints a config as the trainer sees it (the file, the --set overrides and the
family defaults, checked); `sdar config fields` lists every setting with its type, default and help."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import textwrap

from sdar.config import SET_HELP, parse_set


def _plain(value):
    """Tuples (ArmConfig.extra_coefs pairs) as lists, so that safe YAML can write them."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _cmd_show(args: argparse.Namespace) -> int:
    import yaml

    from sdar.config import load_config

    try:
        cfg = load_config(args.config, dict(args.set or []))
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    arm = cfg.resolved_arm()
    print(f"# {args.config or 'the defaults'}{' with --set' if args.set else ''}, family defaults "
          f"({cfg.env.family}) applied, as the trainer sees it")
    print(yaml.safe_dump(_plain(cfg.to_dict()), sort_keys=False, width=100), end="")
    print(f"# the loss's settings: arm {arm.name} with arm_overrides")
    for line in yaml.safe_dump(_plain(dataclasses.asdict(arm)), sort_keys=False, width=100).splitlines():
        print(f"#   {line}")
    print(f"# as the loss applies them: token-level terms aggregated {arm.aggregation}, micro-batches normalised "
          f"{arm.normalisation(cfg.ppo.loss_normalisation)} (loss_type {arm.loss_type})")
    try:
        device = cfg.resolved_device().type
    except ImportError:  # no torch here: no CUDA either (the config is read without it)
        device = "cpu"
    print(f"# on this machine ({device}): rollout.sampler {cfg.rollout.sampler} -> {cfg.resolved_sampler(device)}, "
          f"scoring.packed {str(cfg.scoring.packed).lower()} -> {str(cfg.resolved_packed(device)).lower()} (the Scorer's "
          f"layout: {'packed prefix trees' if cfg.resolved_packed(device) else 'grouped prefix-cached forwards'}; "
          "on CUDA auto means lookahead and packed)")
    return 0


def _cmd_fields(args: argparse.Namespace) -> int:
    from sdar.config import config_fields

    rows = [r for r in config_fields() if not args.prefix or r[0].startswith(args.prefix)]
    if not rows:
        print(f"error: no setting starts with {args.prefix!r}; try `sdar config fields` for all", file=sys.stderr)
        return 2
    for key, type_, default, help_text in rows:
        print(f"{key} ({type_}, default {default})")
        print(textwrap.fill(help_text, width=100, initial_indent="    ", subsequent_indent="    "))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser("config", help="show a resolved experiment config, or every setting's help")
    csub = c.add_subparsers(dest="config_command", metavar="SUBCOMMAND", required=True)
    s = csub.add_parser("show", help="print the config as the trainer sees it (YAML): the file, --set and the "
                                     "family defaults, checked as at load")
    s.add_argument("--config", default=None, help="YAML experiment config (default: the built-in defaults)")
    s.add_argument("--set", action="append", type=parse_set, metavar="KEY=VALUE", help=SET_HELP)
    s.set_defaults(func=_cmd_show)
    f = csub.add_parser("fields", help="every setting with its type, default and help")
    f.add_argument("prefix", nargs="?", default="", help="only the keys starting with this, e.g. rollout. or arm_overrides")
    f.set_defaults(func=_cmd_fields)
