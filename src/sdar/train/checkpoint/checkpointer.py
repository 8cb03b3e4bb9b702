"""One run's checkpoints: save, resume and load, for a local directory or s3://, whole weights (ddp, one process) or
shards (fsdp), at any number of ranks. A remote store gets every checkpoint through a local spool (written there
first, uploaded with retries: an outage shorter than checkpoint.retry_s costs nothing); resume takes the newest
checkpoint that loads, moving a damaged one aside, never deleting it."""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch

from sdar import storage  # storage.open_store read at call time (tests serve S3 through a stand-in)
from sdar.retry import Outage
from sdar.storage import (
    ArtifactStore,
    BucketNotFoundError,
    CredentialsError,
    LocalStore,
    StorageError,
    ensure_room,
)
from sdar.train.checkpoint.layout import (
    COMPLETE_FILE,
    DamagedCheckpointError,
    checkpoint_path,
    fetch_checkpoint,
    latest_checkpoint,
    list_checkpoints,
    quarantine_checkpoint,
    write_checkpoint,
)
from sdar.train.strategy import WEIGHTS_FILE, Strategy

STATE_FILE = "trainer_state.pt"  # the trainer's state beside the weights: step, RNG, history, optimizer (whole)


class CheckpointUnreadable(Exception):
    """A stored checkpoint that cannot be loaded; the message says which file and why."""


class Checkpointer:
    """The checkpoints of a run whose output directory is `out`, in the store `uri` (`cfg.resolved_checkpoint_uri()`:
    checkpoint.uri, else `out` itself), each under the store's checkpoints/ prefix."""

    def __init__(self, uri: str, out: Path, strategy: Strategy, *, keep: int | None, retry_s: float,
                 say: Callable[[str], None]) -> None:
        self.out, self.strategy, self.keep, self.retry_s, self.say = out, strategy, keep, retry_s, say
        try:
            self.store = ArtifactStore.for_uri(uri)
        except (BucketNotFoundError, CredentialsError):
            raise  # a wrong name or missing credentials: no retry fixes those
        except StorageError as exc:  # unreachable now: checkpoints wait in the spool until it is back
            say(f"[yellow]the checkpoint store {uri} is unreachable now ({str(exc)[:200]}); checkpoints wait in the "
                "local spool[/yellow]")
            self.store = ArtifactStore.for_uri(uri, check=False)
        self.spool = None if isinstance(self.store, LocalStore) else LocalStore(out / "checkpoint-spool")
        self.pending: int | None = None  # the newest spooled step not yet in the store
        self.outage = Outage(say)

    @property
    def outages(self) -> list[float]:
        """Seconds each storage outage lasted (reported in the step metrics)."""
        return self.outage.durations

    def where(self) -> str:
        return self.store.uri_for("checkpoints")

    # ---- save ---------------------------------------------------------------------------------------------------
    def save(self, step: int, model, optimizer, params: list, state: dict[str, Any]) -> None:
        """Write the checkpoint of `step`: the trainable weights and the optimizer as the strategy holds them, and
        `state` (the trainer's) beside them, to the spool or the store. Weights that are not finite are not written
        (the last good checkpoint stays the one to resume from)."""
        st = self.strategy
        finite = st.all_finite(params)  # unreachable with optim.guard_updates; a bad checkpoint would poison resume
        if not st.writes_checkpoints:
            return
        if not finite:
            if st.dist.is_main:
                self.say(f"[red]step {step}: the weights are not finite; checkpoint not written (the last good one "
                         "stays the one to resume from)[/red]")
            return
        with st.staging(self.out, step) as tmp:
            optim_state = st.save_weights(model, optimizer, Path(tmp))
            if not st.dist.is_main:
                return
            torch.save({**state, "step": step, "optimizer": optim_state, "sharded": st.sharded}, Path(tmp) / STATE_FILE)
            target = self.spool or self.store
            if isinstance(target, LocalStore):  # a full disk stops the run here, before any file of it is written
                needed = sum(f.stat().st_size for f in Path(tmp).rglob("*") if f.is_file())
                ensure_room(target.root / checkpoint_path(step), needed + (64 << 10),  # and its manifest and marker
                            f"the checkpoint of step {step}")
            write_checkpoint(target, step, tmp, keep_last=self.keep)
        if self.spool is not None:
            self.pending = step  # an older pending step is superseded: resume wants the newest
            self.flush(wait=False)

    def flush(self, wait: bool = True) -> bool:
        """Upload the newest spooled checkpoint to the store; True when nothing is pending any more.

        A failure starts (or continues) an outage, reported once; wait=False tries once (the run goes on and the
        next step tries again), wait=True retries with backoff. An outage longer than retry_s ends the run with an
        error naming the spool, from which a rerun resumes."""
        while self.pending is not None:
            step = self.pending
            try:
                with tempfile.TemporaryDirectory() as tmp:
                    self.spool.get_dir(checkpoint_path(step), tmp)
                    (Path(tmp) / COMPLETE_FILE).unlink(missing_ok=True)
                    write_checkpoint(self.store, step, tmp, keep_last=self.keep)
            except Exception as exc:  # noqa: BLE001 - botocore raises many kinds; all mean "not stored yet"
                waited = self.outage.failed(
                    f"[yellow]checkpoint of step {step} could not reach {self.store.uri} ({type(exc).__name__}: "
                    f"{str(exc)[:200]}); kept in {self.spool.uri}, retrying for up to {self.retry_s:.0f} s[/yellow]")
                if waited > self.retry_s:
                    raise StorageError(
                        f"the checkpoint store {self.store.uri} has been unreachable for {waited:.0f} s "
                        f"(checkpoint.retry_s={self.retry_s:.0f}); the checkpoint of step {step} is kept "
                        f"in {self.spool.uri}: rerun the same command once the store is back, it resumes from there"
                    ) from exc
                if not wait:
                    return False
                import time

                time.sleep(self.outage.delay(self.retry_s - waited + 0.01))
                continue
            self.pending = None
            self.outage.recovered(lambda lasted: f"checkpoint store {self.store.uri} reachable again after "
                                                 f"{lasted:.0f} s; step {step} uploaded")
        return True

    # ---- resume -------------------------------------------------------------------------------------------------
    def resume(self, model, optimizer, params: list) -> dict[str, Any] | None:
        """Load the newest complete checkpoint that loads and holds finite weights into the model and the optimizer;
        its trainer state, or None when there is none.

        A checkpoint that cannot be loaded (a file missing or cut short, a torch file that does not open) is reported,
        moved aside to checkpoints/damaged/ (never deleted: `quarantine_checkpoint`) and passed over; one with
        non-finite weights is reported and passed over. An unreadable latest.json is reported and the newest
        complete checkpoint is used instead. An unreachable store is read from the spool, where an outage left
        its checkpoints."""
        warn = lambda message: self.say(f"[yellow]{message}[/yellow]")  # noqa: E731
        candidates = self._candidates(warn)
        if not candidates:
            return None
        passed_over = []
        for step, store, rel in candidates:
            try:
                weights, state = self._read(store, rel, model, optimizer)
            except CheckpointUnreadable as exc:
                passed_over.append(f"{store.uri_for(rel)}: {exc}")
                where = ""
                if self.strategy.dist.is_main:  # one mover; the replicas pass over it too
                    with contextlib.suppress(FileNotFoundError):  # a replica got there first
                        where = f"; moved to {store.uri_for(quarantine_checkpoint(store, rel, str(exc)))} (kept, not deleted)"
                warn(f"checkpoint {store.uri_for(rel)} cannot be loaded ({exc}){where}; trying an older one")
                continue
            if weights is None:  # shards: in the model already, each rank holding its own
                finite = self.strategy.all_finite(params)
            else:
                finite = all(bool(torch.isfinite(v).all()) for v in weights.values())
            if finite:
                break
            passed_over.append(f"{store.uri_for(rel)}: non-finite weights")
            warn(f"checkpoint {store.uri_for(rel)} holds non-finite weights; looking for an older one")
        else:
            raise RuntimeError(f"no checkpoint under {self.where()} can be resumed from (" + "; ".join(passed_over)
                               + "): delete them (or use another output_dir) to start over")
        if weights is not None:  # a whole-weights checkpoint, at any number of ranks, under either strategy
            self.strategy.load_whole(model, optimizer, weights, state["optimizer"], store.uri_for(rel))
        state["where"] = store.uri_for(rel)
        return state

    def _candidates(self, warn) -> list[tuple[int, ArtifactStore, str]]:
        """(step, store, rel) of every complete checkpoint, newest first: the store's, then the spool's."""
        candidates = []
        for store in (self.store, self.spool):
            if store is None:
                continue
            try:
                found = latest_checkpoint(store, warn=warn)
            except (BucketNotFoundError, CredentialsError):
                raise
            except StorageError as exc:  # an outage: what this output directory spooled is still here
                if self.spool is None:
                    raise
                warn(f"cannot read {store.uri} now ({str(exc)[:160]}); resuming from the local spool {self.spool.uri}")
                continue
            if found is not None:
                candidates += [(found[0], store, found[1])]
                candidates += [(s, store, r) for s, r in reversed(list_checkpoints(store)) if s < found[0]]
        candidates.sort(key=lambda c: -c[0])  # stable: the store before the spool at equal steps
        return candidates

    def _read(self, store: ArtifactStore, rel: str, model, optimizer) -> tuple[dict[str, torch.Tensor] | None, dict[str, Any]]:
        """(whole trainable weights, trainer state) of checkpoint `rel`; shards are read straight into the model and
        the optimizer (each rank its own, whatever the rank count that wrote them) and come back as None.
        `CheckpointUnreadable` naming what is wrong; an unreachable store still raises its own StorageError (an
        outage is not damage)."""
        with tempfile.TemporaryDirectory() as tmp:
            weights = read_weights(store, rel, Path(tmp), model, optimizer)
            state = _load(Path(tmp) / STATE_FILE, weights_only=False)
        if not isinstance(state, dict) or "step" not in state:
            raise CheckpointUnreadable(f"{WEIGHTS_FILE} or {STATE_FILE} does not hold what a checkpoint holds")
        return weights, state


def read_weights(store: ArtifactStore, rel: str, tmp: Path, model, optimizer) -> dict[str, torch.Tensor] | None:
    """Fetch checkpoint `rel` into `tmp` and read its weights: whole ones returned (name -> tensor), shards loaded
    into `model` (and `optimizer`, unless None) and None returned. `CheckpointUnreadable` naming what is wrong."""
    from sdar.train.fsdp import SHARDS_DIR, load_sharded

    try:
        fetch_checkpoint(store, rel, tmp)
    except DamagedCheckpointError as exc:
        raise CheckpointUnreadable(exc.detail) from exc
    except FileNotFoundError as exc:  # moved aside meanwhile (by another replica), or never whole
        raise CheckpointUnreadable(f"its files are gone ({exc})") from exc
    if (tmp / SHARDS_DIR).is_dir():  # written by an fsdp run
        try:
            load_sharded(model, optimizer, tmp / SHARDS_DIR)
        except Exception as exc:  # noqa: BLE001 - torch.distributed.checkpoint raises CheckpointException and others
            raise CheckpointUnreadable(f"its shards do not load: {type(exc).__name__}: {str(exc)[:200]}") from exc
        return None
    weights = _load(tmp / WEIGHTS_FILE, weights_only=True)
    if not isinstance(weights, dict):
        raise CheckpointUnreadable(f"{WEIGHTS_FILE} or {STATE_FILE} does not hold what a checkpoint holds")
    return weights


def _load(path: Path, weights_only: bool):
    try:
        return torch.load(path, weights_only=weights_only)
    except Exception as exc:  # noqa: BLE001 - torch raises RuntimeError, EOFError, UnpicklingError, ...
        raise CheckpointUnreadable(f"{path.name} does not load: {type(exc).__name__}: {str(exc)[:200]}") from exc


def checkpoint_stores(uri: str) -> list[str]:
    """The stores a user's `uri` may mean, in the order tried: the store itself (a run's output directory or
    checkpoint.uri), its checkpoints/ folder given instead (the store is its parent), and a run written before 0.9,
    whose store was <output_dir>/checkpoints."""
    base = uri.rstrip("/")
    head, _, tail = base.rpartition("/")
    out = [base]
    if tail == "checkpoints" and head and not head.endswith(":/"):
        out.append(head)
    out.append(base + "/checkpoints")
    return out


def load_weights(model, uri: str) -> int:
    """Load the trainable weights of the newest complete checkpoint under `uri` (a run's output or checkpoint
    directory, or s3://...) into `model`: weights only, no optimizer or trainer state (`sdar eval`). Returns the
    checkpoint's step. An evaluation never falls back to an older checkpoint on its own."""
    from sdar.train.strategy import load_trainable

    found = None
    for where in checkpoint_stores(uri):
        store = storage.open_store(where)
        if (found := latest_checkpoint(store)) is not None:
            break
    if found is None:
        raise FileNotFoundError(f"no complete checkpoint under {uri}: give a run's output directory, its "
                                "checkpoints/ directory or checkpoint.uri")
    step, rel = found
    with tempfile.TemporaryDirectory() as tmp:
        try:
            weights = read_weights(store, rel, Path(tmp), model, None)
        except CheckpointUnreadable as exc:
            raise RuntimeError(
                f"the newest checkpoint {store.uri_for(rel)} cannot be loaded ({exc}); resume the run once (`sdar "
                "train` with the same output moves it to checkpoints/damaged/ and goes on from the newest one that "
                "loads), or move it aside yourself to evaluate the one before") from exc
    if weights is not None:
        load_trainable(model, weights, store.uri_for(rel))
    return step
