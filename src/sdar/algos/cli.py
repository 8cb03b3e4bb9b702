"""`sdar arms`: print the registered arms and the settings that tell them apart; `--loss-types`: the
policy-gradient loss types an arm can take (`arm_overrides.loss_type`)."""

from __future__ import annotations

import argparse


_HEADERS = {
    "loss_type": "loss",
    "pg_coef": "pg",
    "kl_coef": "kl",
    "entropy_coef": "ent",
    "sdar_coef": "lambda",
    "gate_beta": "gate beta",
    "skills_in_student_prompt": "skills in student",
    "hint_distill_coef": "hint coef",
    "replay_coef": "replay coef",
}


def _cmd_arms(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from sdar.algos import arms_table, loss_types_table

    rows = loss_types_table() if args.loss_types else arms_table()
    if args.json:
        import json

        print(json.dumps(rows, indent=2))
        return 0
    if args.loss_types:
        title = "L_pg by arm_overrides.loss_type (every arm takes any; combine with every distillation channel)"
    else:
        title = "L = pg*L_pg + kl*KL - ent*H + lambda*L_sdar + hint_coef*JSD_hint + replay_coef*DPO_replay"
    table = Table(title=title)
    for col in rows[0]:
        table.add_column(_HEADERS.get(col, col), overflow="fold", no_wrap=col not in ("description", "matches", "differs"))
    for row in rows:
        table.add_row(*(str(v) for v in row.values()))
    Console(width=max(140, Console().width)).print(table)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("arms", help="print the arms table with their loss settings")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--loss-types", action="store_true",
                   help="list the policy-gradient loss types (TRL's loss_type menu) instead of the arms")
    p.set_defaults(func=_cmd_arms)
