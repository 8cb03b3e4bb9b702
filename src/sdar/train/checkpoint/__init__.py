"""Checkpoints: what one is in a store (`layout`: written, published, found, fetched, moved aside when damaged) and a
run's save, resume and load of them (`checkpointer`: local or s3://, whole weights or fsdp shards, any rank count)."""

from sdar.train.checkpoint.checkpointer import STATE_FILE, Checkpointer, CheckpointUnreadable, load_weights
from sdar.train.checkpoint.layout import (CHECKPOINTS_DIR, COMPLETE_FILE, DAMAGED_DIR, DAMAGED_FILE, LATEST_MARKER,
                                          DamagedCheckpointError, checkpoint_path, fetch_checkpoint, latest_checkpoint,
                                          list_checkpoints, prune_checkpoints, quarantine_checkpoint,
                                          read_checkpoint_marker, restore_latest_checkpoint, write_checkpoint)

__all__ = ["CHECKPOINTS_DIR", "COMPLETE_FILE", "DAMAGED_DIR", "DAMAGED_FILE", "LATEST_MARKER", "STATE_FILE",
           "CheckpointUnreadable", "Checkpointer", "DamagedCheckpointError", "checkpoint_path", "fetch_checkpoint",
           "latest_checkpoint", "list_checkpoints", "load_weights", "prune_checkpoints", "quarantine_checkpoint",
           "read_checkpoint_marker", "restore_latest_checkpoint", "write_checkpoint"]
