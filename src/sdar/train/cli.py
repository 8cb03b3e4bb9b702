"""`sdar train` and `sdar warmstart`: run one arm from a YAML config, resuming when a
checkpoint exists in the output (or checkpoint URI). `torchrun --nproc_per_node N -m sdar.cli train ...`
trains data-parallel (sdar.train.distributed); rank 0 prints the summary."""

from __future__ import annotations

import argparse
import json

from sdar import storage  # storage.open_store read at call time (tests serve S3 through a stand-in)
from sdar.config import SET_HELP, parse_set
from sdar.console import make_console
from sdar.failures import env_server_error
from sdar.storage import RESULT_PREFIX, DiskFull, free_bytes, is_disk_full


def _overrides(args: argparse.Namespace) -> dict:
    """The config overrides of the command line: every --set (parsed by `sdar.config.parse_set`), then
    the flags that name a key (--arm, --steps, --seed, --output)."""
    out = dict(args.set or [])
    for name in ("arm", "steps", "seed"):
        if getattr(args, name, None) is not None:
            out[name] = getattr(args, name)
    if getattr(args, "output", None):
        out["output_dir"] = args.output
    return out


def _cmd_train(args: argparse.Namespace) -> int:
    from rich.table import Table

    from sdar.config import load_config
    from sdar.train import distributed, train
    from sdar.train.guards import TrainingFailed
    from sdar.train.warmstart import ensure_warm_start

    cfg = load_config(args.config, _overrides(args))
    console = make_console(stderr=True)
    ensure_warm_start(cfg, console)  # the tiny model's warm start: its own step, before the trainer loads it
    try:
        summary = train(cfg, console=console)
    except TrainingFailed as exc:
        console.print(f"[red]error:[/red] {exc}", soft_wrap=True)
        return 3
    except (DiskFull, OSError) as exc:
        if not isinstance(exc, DiskFull) and not is_disk_full(exc):
            raise
        # one line, no traceback: the checkpoints written so far and the metrics logged are intact
        where = exc if isinstance(exc, DiskFull) else DiskFull(exc.filename or cfg.resolved_output_dir(), None,
                                                                free_bytes(exc.filename or cfg.resolved_output_dir()))
        elsewhere = "MLFLOW_TRACKING_URI" if "MLflow" in where.what else "output_dir / checkpoint.uri"
        console.print(f"[red]error:[/red] {where}; free space there (or point {elsewhere} at another disk) and rerun "
                      "the same command: it resumes from its last checkpoint", soft_wrap=True, highlight=False)
        return 5
    except Exception as exc:
        from rich.markup import escape

        if env_server_error(exc):
            # the env server the rollouts play on died or refused (a killed pod, a restart): one line naming it
            # (escaped: it names the server as "[ws://host:port/ws]", which rich would take for a style tag)
            console.print(f"[red]error:[/red] the environment server failed under the run: {escape(str(exc))}; start "
                          "it again (or point env.url at one that runs) and rerun the same command: it resumes from "
                          "its last checkpoint", soft_wrap=True, highlight=False)
            return 7
        why = distributed.explain_failure(exc)
        if why is None:
            raise
        # a dead or stuck rank: say which rank waited where, then end (torchrun stops the other local ranks)
        console.print(f"[red]error:[/red] {escape(why)}", soft_wrap=True, highlight=False)
        return 4
    ctx = distributed.init_from_env()  # the trainer's process group (rank 0 of 1 when alone)
    if args.publish and ctx.is_main:
        _publish(cfg, summary)
    distributed.shutdown(ctx)
    if not ctx.is_main:  # one summary per job
        return 0
    hist = summary["history"]
    table = Table(title=f"{summary['arm']}: {summary['steps']} steps -> {summary['output_dir']}")
    for col in ("step", "success", "reward", "invalid", "gap", "gate", "loss/pg", "s/step"):
        table.add_column(col, justify="right")
    every = max(1, len(hist) // 15)
    for h in hist[::every] + ([hist[-1]] if hist and (len(hist) - 1) % every else []):
        table.add_row(str(h["step"]), f"{h['success']:.2f}", f"{h['reward']:.2f}", f"{h['invalid_action_rate']:.2f}",
                      f"{h.get('sdar/gap_mean', float('nan')):+.3f}", f"{h.get('sdar/gate_mean', float('nan')):.3f}",
                      f"{h.get('loss/pg', float('nan')):+.3f}", f"{h['time/step_s']:.1f}")
    console.print(table)
    print(json.dumps({**{k: v for k, v in summary.items() if k != "history"}, "world_size": ctx.world_size}))
    return 0


def _publish(cfg, summary: dict) -> None:
    """Copy the final policy and the summary into the checkpoint store, for a launcher on another
    machine (sdar.launch.job collects a TorchX job's or a TrainJob's result from there)."""
    store = storage.open_store(cfg.resolved_checkpoint_uri())
    store.put_dir(summary["final_dir"], f"{RESULT_PREFIX}/final")
    store.write_json(f"{RESULT_PREFIX}/summary.json", summary)


def _cmd_warmstart(args: argparse.Namespace) -> int:
    from sdar.config import load_config
    from sdar.train.warmstart import MARKER, ensure_warm_start

    cfg = load_config(args.config, _overrides(args))
    console = make_console(stderr=True)
    if cfg.model.name_or_path != "tiny" and not cfg.warmstart.pretrained:
        console.print(f"[red]error:[/red] this config trains {cfg.model.name_or_path!r} from its pretrained weights "
                      "(warmstart.pretrained is false): there is no warm start to build. To warm-start it on the "
                      "experts' episodes first, add --set warmstart.pretrained=true here and to every command that "
                      "trains or evaluates it (or set it in the config, as configs/household-smollm2.yaml does)",
                      soft_wrap=True, highlight=False)
        return 2
    from sdar.train.warmstart import warm_start_path

    cached = (warm_start_path(cfg) / MARKER).is_file()
    path = ensure_warm_start(cfg, console)
    if cached and cfg.model.name_or_path != "tiny":  # a build prints its before/after table itself
        from sdar.train.warm_pretrained import report

        report(cfg, json.loads((path / MARKER).read_text()), console)
    print(path)
    return 0


def _eval_overrides(args: argparse.Namespace) -> dict:
    """`sdar eval`'s flags as config overrides: --backend (household), --split, --tasks."""
    overrides = _overrides(args)
    overrides.setdefault("tracking", False)
    if getattr(args, "backend", None):
        overrides["env.kwargs.backend"] = args.backend
    if getattr(args, "split", None):
        overrides["env.eval_split"] = args.split
    if getattr(args, "tasks", None):
        from sdar.eval.tasks import read_task_list

        overrides["eval.task_ids"] = read_task_list(args.tasks)
    return overrides


def _cmd_eval(args: argparse.Namespace) -> int:
    """Student vs privileged teacher on the fixed eval tasks (per task type), plus the
    teacher-student gap."""
    from collections import Counter

    from rich.table import Table

    from sdar.config import load_config
    from sdar.eval.tasks import task_type_of
    from sdar.train.runtime import build_runtime
    from sdar.train.warmstart import ensure_warm_start

    cfg = load_config(args.config, _eval_overrides(args))
    console = make_console(stderr=True)
    ensure_warm_start(cfg, console)
    # evaluation only: the train split is never read (a data tree may hold just the eval split)
    rt = build_runtime(cfg, train=False)
    types = Counter(task_type_of(cfg.env.family, t) or "?" for t in rt.eval_tasks)
    where = "the given task list" if cfg.eval.task_ids else f"split {cfg.env.eval_split!r} ({cfg.eval.task_order})"
    backend = cfg.env.kwargs.get("backend") if cfg.env.family == "household" else None
    console.print(f"evaluating {len(rt.eval_tasks)} tasks of {where}"
                  + (f" on the household {backend!r} backend" if backend else "") + ": "
                  + ", ".join(f"{t} {n}" for t, n in types.items()))
    if args.checkpoint:  # its trainable weights only (no optimizer or RNG state)
        try:
            step = rt.load_weights(args.checkpoint)
        except FileNotFoundError as exc:
            raise SystemExit(str(exc)) from None
        console.print(f"weights of step {step} from {args.checkpoint}")
    student = rt.evaluate()
    teacher = rt.evaluate(privileged=True)
    gap = rt.teacher_gap(student.trajectories)
    table = Table(title=f"{cfg.env.family}: {student.n} held-out tasks, temperature {cfg.eval.temperature}")
    for col in ("policy", "success", "95% CI", "mean length", "invalid"):
        table.add_column(col, justify="right")
    for name, r in (("student", student), ("teacher (skills in context)", teacher)):
        table.add_row(name, f"{r.success:.3f}", f"[{r.ci95[0]:.3f}, {r.ci95[1]:.3f}]", f"{r.mean_length:.1f}",
                      f"{r.invalid_rate:.3f}")
    console.print(table)
    per_type = Table(title="success per task type")
    for col in ("task type", "n", "student", "teacher"):
        per_type.add_column(col, justify="right")
    for t in sorted(set(student.per_type) | set(teacher.per_type)):
        s, k = student.per_type.get(t, {}), teacher.per_type.get(t, {})
        per_type.add_row(t, str(s.get("n", k.get("n", 0))), f"{s['success']:.3f}" if s else "-",
                         f"{k['success']:.3f}" if k else "-")
    console.print(per_type)
    console.print(f"teacher - student log-prob gap on the student's turns: {gap:+.4f}")
    print(json.dumps({"student": student.to_dict(), "teacher": teacher.to_dict(), "gap": gap,
                      "task_ids": list(rt.eval_tasks)}))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train one arm on-policy (resumes from the latest checkpoint)")
    p.add_argument("--config", required=True, help="YAML experiment config, e.g. configs/household-tiny.yaml")
    p.add_argument("--arm", help="grpo | grpo_opsd | sdar | opsd | skill_grpo (overrides the config)")
    p.add_argument("--steps", type=int, help="RL steps (overrides the config)")
    p.add_argument("--seed", type=int)
    p.add_argument("--output", help="output directory (overrides output_dir)")
    p.add_argument("--set", action="append", type=parse_set, metavar="KEY=VALUE", help=SET_HELP)
    p.add_argument("--publish", action="store_true",
                   help="also copy the final policy and summary.json to <checkpoint store>/result/")
    p.set_defaults(func=_cmd_train)
    w = sub.add_parser("warmstart", help="build (or find) the cached warm-started tiny model for a config")
    w.add_argument("--config", required=True)
    w.add_argument("--set", action="append", type=parse_set, metavar="KEY=VALUE", help=SET_HELP)
    w.set_defaults(func=_cmd_warmstart)
    e = sub.add_parser("eval", help="success of the student and of the privileged teacher on the eval tasks")
    e.add_argument("--config", required=True)
    e.add_argument("--checkpoint", help="evaluate these weights instead of the warm start: a run's output "
                   "directory, its checkpoints/ or an s3:// checkpoint URI (the newest complete checkpoint's "
                   "trainable weights only)")
    e.add_argument("--set", action="append", type=parse_set, metavar="KEY=VALUE", help=SET_HELP)
    e.add_argument("--backend", choices=("sim", "alfworld"),
                   help="household: play the eval tasks on this backend (alfworld: the official games in "
                        "$SDAR_ALFWORLD_DATA; the sim's options are ignored, the sim-trained warm start is kept)")
    e.add_argument("--split", help="the eval split (overrides env.eval_split; e.g. valid_seen on --backend alfworld)")
    e.add_argument("--tasks", help="evaluate these task ids: a file with one id per line, or ids separated by commas")
    e.set_defaults(func=_cmd_eval)
