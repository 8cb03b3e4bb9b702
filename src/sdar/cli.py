"""The `sdar` command line. Each area adds its subcommands through a `register(subparsers)`
function in its own `cli` module, so this file stays a thin dispatcher."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from sdar.failures import env_server_error
from sdar.lifecycle import skip_the_final_collection
from sdar.storage import DiskFull

# modules that contribute subcommands; a module that does not exist yet is skipped
_COMMAND_MODULES = (
    "sdar.algos.cli",
    "sdar_envs.cli",
    "sdar.train.cli",
    "sdar.replay.cli",
    "sdar.pipeline.cli",
    "sdar.tracking.ui",
    "sdar.sizing.cli",
    "sdar.study.cli",
    "sdar.config_cli",
    "sdar.demo",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sdar",
        description="Agentic RL with gated self-distillation: GRPO, GRPO+OPSD and SDAR side by side.",
    )
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and (exc.name == name or name.startswith(exc.name + ".")):
                continue  # that area is not built yet
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    skip_the_final_collection()  # a command's process exits as soon as it is done (sdar.lifecycle)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version:
        from sdar import __version__

        print(__version__)
        return 0
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    from sdar.config import ConfigError

    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:  # a setting's problem, named: no traceback to read through
        print(f"sdar {args.command}: config error: {exc}", file=sys.stderr)
        return 2
    except DiskFull as exc:  # a write with no room (a warm start, a cache entry): one line, nothing half-written kept
        if os.environ.get("RANK", "0") == "0":
            print(f"sdar {args.command}: {exc}; free space there (or point SDAR_CACHE_DIR / the output at another "
                  "disk) and rerun the same command", file=sys.stderr)
        return 5
    except RuntimeError as exc:
        if not env_server_error(exc):
            raise
        if os.environ.get("RANK", "0") == "0":  # an environment server that is gone or refused, named by its URL
            print(f"sdar {args.command}: environment server error: {exc}", file=sys.stderr)
        return 7
    except OSError as exc:
        from sdar.models.policy import ModelUnavailable

        if not isinstance(exc, ModelUnavailable):
            raise
        if os.environ.get("RANK", "0") == "0":  # one line per job: torchrun's other ranks stay quiet
            print(f"sdar {args.command}: {exc}", file=sys.stderr)
        return 6


if __name__ == "__main__":
    sys.exit(main())
