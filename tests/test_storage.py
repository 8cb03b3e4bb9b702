"""Tests of sdar.storage: the same bodies run on a local directory and on a real S3 API (moto on loopback).

Checkpoint tests check publication order: an upload without its marker is never resumed from.
"""

from __future__ import annotations

import json
import os

import pytest

from sdar.storage import (BucketNotFoundError, CorruptFileError, CredentialsError, LocalStore, S3Store, StorageError,
                          open_store, resolve_endpoint_url)
from sdar.train.checkpoint import (COMPLETE_FILE, LATEST_MARKER, DamagedCheckpointError, checkpoint_path,
                                   fetch_checkpoint, latest_checkpoint, list_checkpoints, prune_checkpoints,
                                   quarantine_checkpoint, read_checkpoint_marker, restore_latest_checkpoint,
                                   write_checkpoint)


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path):
    if request.param == "local":
        return open_store(tmp_path / "store")
    s3 = request.getfixturevalue("s3_server")
    return open_store(f"s3://{s3.make_bucket()}/runs/exp-1")


def make_tree(root, files: dict[str, bytes]):
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


def make_ckpt(tmp_path, step: int, name: str = "ckpt"):
    """A small checkpoint directory whose bytes depend on the step."""
    return make_tree(
        tmp_path / f"{name}-{step}",
        {
            "adapter_model.safetensors": bytes([step % 256]) * (1000 + step),
            "optimizer.pt": os.urandom(300),
            "tokenizer/vocab.json": json.dumps({"step": step}).encode(),
        },
    )


def read_tree(root) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_files_dirs_text_json_round_trip(store, tmp_path):
    src = make_tree(tmp_path / "src", {"a.bin": os.urandom(2048), "sub/b.txt": b"hello", "sub/deep/c.json": b"{}"})
    assert store.put_file(src / "a.bin", "/single/a.bin") == "single/a.bin"
    keys = store.put_dir(src, "tree")
    assert keys == ["tree/a.bin", "tree/sub/b.txt", "tree/sub/deep/c.json"]
    store.write_text("notes/readme.txt", "héllo\n")
    store.write_json("notes/cfg.json", {"lr": 1e-5, "arm": "sdar"})

    assert store.list() == sorted(keys + ["single/a.bin", "notes/readme.txt", "notes/cfg.json"])
    assert store.list("tree/sub") == ["tree/sub/b.txt", "tree/sub/deep/c.json"]
    assert store.list("tre") == []  # a directory listing, not a string prefix
    assert store.exists("tree/sub/b.txt") and store.exists("tree/sub") and not store.exists("tree/su")

    out = store.get_file("single/a.bin", tmp_path / "dl" / "a.bin")
    assert out.read_bytes() == (src / "a.bin").read_bytes()
    store.get_dir("tree", tmp_path / "copy")
    assert read_tree(tmp_path / "copy") == read_tree(src)
    assert store.read_text("notes/readme.txt") == "héllo\n"
    assert store.read_json("notes/cfg.json") == {"lr": 1e-5, "arm": "sdar"}

    # overwrite replaces content
    store.write_text("notes/readme.txt", "v2")
    assert store.read_text("notes/readme.txt") == "v2"

    assert store.delete("tree/sub") == 2
    assert store.list("tree") == ["tree/a.bin"]
    assert store.delete("single/a.bin") == 1 and not store.exists("single/a.bin")
    assert store.delete("nothing/here") == 0


def test_missing_paths_and_bad_relative_paths(store, tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.txt does not exist"):
        store.get_file("missing.txt", tmp_path / "x")
    assert not (tmp_path / "x").exists()  # no partial file left behind
    with pytest.raises(FileNotFoundError, match="does not exist"):
        store.read_text("missing.txt")
    with pytest.raises(FileNotFoundError, match="nothing stored under"):
        store.get_dir("missing", tmp_path / "d")
    with pytest.raises(ValueError, match=r"contains '\.\.'"):
        store.write_text("../escape.txt", "x")
    with pytest.raises(ValueError, match="empty relative storage path"):
        store.write_text("", "x")
    with pytest.raises(ValueError, match="refusing to delete everything"):
        store.delete("")


def test_checkpoints_publish_restore_and_ignore_half_written(store, tmp_path):
    assert latest_checkpoint(store) is None
    assert restore_latest_checkpoint(store, tmp_path / "none") is None

    for step in (10, 20):
        rel = write_checkpoint(store, step, make_ckpt(tmp_path, step), meta={"mlflow_run_id": f"run{step}"})
        assert rel == checkpoint_path(step) == f"checkpoints/step-{step:06d}"
    assert latest_checkpoint(store) == (20, "checkpoints/step-000020")
    assert read_checkpoint_marker(store) == {"step": 20, "path": "checkpoints/step-000020", "mlflow_run_id": "run20"}

    # a run killed while uploading step 30: its files are there, the marker is not
    store.put_dir(make_ckpt(tmp_path, 30), checkpoint_path(30))
    assert latest_checkpoint(store) == (20, "checkpoints/step-000020")
    assert [s for s, _ in list_checkpoints(store)] == [10, 20]
    assert [s for s, _ in list_checkpoints(store, complete_only=False)] == [10, 20, 30]

    # a crash in the middle of write_checkpoint itself (the second file upload fails)
    calls = {"n": 0}
    real_put = store._put_file

    def dying_put(local, key):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt("killed")
        real_put(local, key)

    store._put_file = dying_put
    with pytest.raises(KeyboardInterrupt):
        write_checkpoint(store, 40, make_ckpt(tmp_path, 40))
    store._put_file = real_put
    assert store.list(checkpoint_path(40))  # something was uploaded...
    assert latest_checkpoint(store) == (20, "checkpoints/step-000020")  # ...but never published

    step, manifest = restore_latest_checkpoint(store, tmp_path / "restored")
    assert step == 20 and manifest["mlflow_run_id"] == "run20"
    assert read_tree(tmp_path / "restored") == read_tree(tmp_path / "ckpt-20")
    assert manifest["files"]["adapter_model.safetensors"] == 1020

    # the resumed run rewrites step 40: leftovers of the dead upload are replaced
    store.put_file(make_ckpt(tmp_path, 99, "junk") / "optimizer.pt", f"{checkpoint_path(40)}/stale.bin")
    write_checkpoint(store, 40, make_ckpt(tmp_path, 40, "again"))
    assert latest_checkpoint(store) == (40, "checkpoints/step-000040")
    assert f"{checkpoint_path(40)}/stale.bin" not in store.list(checkpoint_path(40))

    # a crash while rewriting the step the marker names unpublishes that step: resume falls back
    calls["n"] = 0
    store._put_file = dying_put
    with pytest.raises(KeyboardInterrupt):
        write_checkpoint(store, 40, make_ckpt(tmp_path, 40, "third"))
    store._put_file = real_put
    assert read_checkpoint_marker(store)["step"] == 40
    assert latest_checkpoint(store) == (20, "checkpoints/step-000020")

    # without a marker the newest complete checkpoint is used, never the half-written steps 30 and 40
    write_checkpoint(store, 50, make_ckpt(tmp_path, 50))
    store.delete(LATEST_MARKER)
    assert latest_checkpoint(store) == (50, "checkpoints/step-000050")
    store.delete(f"{checkpoint_path(50)}/{COMPLETE_FILE}")
    assert latest_checkpoint(store) == (20, "checkpoints/step-000020")


def test_checkpoint_pruning_keeps_last_n(store, tmp_path):
    store.put_dir(make_ckpt(tmp_path, 2), checkpoint_path(2))  # a dead upload, older than what follows
    for step in (1, 3, 5, 7):
        write_checkpoint(store, step, make_ckpt(tmp_path, step), keep_last=2)
    assert list_checkpoints(store, complete_only=False) == [(5, checkpoint_path(5)), (7, checkpoint_path(7))]
    assert latest_checkpoint(store) == (7, checkpoint_path(7))
    step, _ = restore_latest_checkpoint(store, tmp_path / "r")
    assert step == 7 and read_tree(tmp_path / "r") == read_tree(tmp_path / "ckpt-7")

    # the marker's checkpoint survives pruning even when it is not among the newest
    write_checkpoint(store, 4, make_ckpt(tmp_path, 4))  # e.g. a run restarted from an older step
    assert prune_checkpoints(store, keep_last=1) == [checkpoint_path(5)]
    assert [s for s, _ in list_checkpoints(store)] == [4, 7]
    assert latest_checkpoint(store) == (4, checkpoint_path(4))


def test_checkpoint_argument_errors(store, tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="missing or empty"):
        write_checkpoint(store, 1, tmp_path / "empty")
    with pytest.raises(ValueError, match="non-negative int"):
        write_checkpoint(store, -1, make_ckpt(tmp_path, 1))
    with pytest.raises(ValueError, match="keep_last must be >= 1"):
        write_checkpoint(store, 1, make_ckpt(tmp_path, 1), keep_last=0)
    with pytest.raises(ValueError, match=r"may not set \['step'\]"):
        write_checkpoint(store, 1, make_ckpt(tmp_path, 1), meta={"step": 3})
    with pytest.raises(CorruptFileError, match="is malformed"):
        store.write_text(LATEST_MARKER, '{"nope": 1}')
        read_checkpoint_marker(store)


@pytest.mark.parametrize("marker", ['{"nope": 1}', "\x00garbage{", '{"step": 2, "path": "../../etc"}', "[1, 2]", ""])
def test_an_unreadable_marker_falls_back_to_the_newest_complete_checkpoint(store, tmp_path, marker):
    for step in (1, 2):
        write_checkpoint(store, step, make_ckpt(tmp_path, step))
    store.write_text(LATEST_MARKER, marker)
    said = []
    assert latest_checkpoint(store, warn=said.append) == (2, checkpoint_path(2))
    assert len(said) == 1 and "latest.json" in said[0] and "newest complete checkpoint instead" in said[0]
    assert store.read_text(LATEST_MARKER) == marker  # left as it was, for whoever looks
    write_checkpoint(store, 3, make_ckpt(tmp_path, 3), keep_last=2)  # the next checkpoint rewrites it
    assert read_checkpoint_marker(store)["step"] == 3


def test_a_damaged_checkpoint_is_named_and_moved_aside_never_deleted(store, tmp_path):
    for step in (1, 2):
        write_checkpoint(store, step, make_ckpt(tmp_path, step))
    before = read_tree(tmp_path / "ckpt-2")
    local = store.get_file(f"{checkpoint_path(2)}/optimizer.pt", tmp_path / "optimizer.pt")
    local.write_bytes(local.read_bytes()[:3])  # truncated
    store.put_file(local, f"{checkpoint_path(2)}/optimizer.pt")
    with pytest.raises(DamagedCheckpointError, match=r"optimizer.pt is 3 bytes, its manifest says \d+"):
        fetch_checkpoint(store, checkpoint_path(2), tmp_path / "fetched")
    store.delete(f"{checkpoint_path(1)}/optimizer.pt")
    with pytest.raises(DamagedCheckpointError, match="optimizer.pt is missing"):
        fetch_checkpoint(store, checkpoint_path(1), tmp_path / "fetched-1")
    dest = quarantine_checkpoint(store, checkpoint_path(2), "optimizer.pt is 3 bytes")
    assert dest.startswith("checkpoints/damaged/step-000002-")
    assert json.loads(store.read_text(f"{dest}/_DAMAGED.json"))["why"] == "optimizer.pt is 3 bytes"
    kept = {k[len(dest) + 1:] for k in store.list(dest)}
    assert kept == set(before) | {COMPLETE_FILE, "_DAMAGED.json"}
    assert not store.exists(checkpoint_path(2))
    # out of every listing a run resumes from or prunes
    assert [s for s, _ in list_checkpoints(store, complete_only=False)] == [1]
    write_checkpoint(store, 2, make_ckpt(tmp_path, 2, "again"), keep_last=1)
    assert store.exists(dest) and [s for s, _ in list_checkpoints(store)] == [2]
    assert quarantine_checkpoint(store, checkpoint_path(2), "twice") != dest  # a second one gets its own place


def test_s3_objects_land_under_prefix(s3_server, tmp_path):
    bucket = s3_server.make_bucket()
    store = open_store(f"s3://{bucket}/team/run-7/")
    assert isinstance(store, S3Store) and store.uri == f"s3://{bucket}/team/run-7"
    assert store.endpoint_url == s3_server.endpoint_url and store.region == "us-east-1"
    write_checkpoint(store, 3, make_ckpt(tmp_path, 3))
    resp = s3_server.client().list_objects_v2(Bucket=bucket)
    keys = sorted(o["Key"] for o in resp["Contents"])
    assert keys == [
        "team/run-7/checkpoints/latest.json",
        f"team/run-7/checkpoints/step-000003/{COMPLETE_FILE}",
        "team/run-7/checkpoints/step-000003/adapter_model.safetensors",
        "team/run-7/checkpoints/step-000003/optimizer.pt",
        "team/run-7/checkpoints/step-000003/tokenizer/vocab.json",
    ]
    # a second store at the bucket root sees the same objects with the prefix in their paths
    root = open_store(f"s3://{bucket}")
    assert root.read_json("team/run-7/checkpoints/latest.json")["step"] == 3


def test_s3_missing_bucket_names_it_and_says_how_to_create(s3_server):
    with pytest.raises(BucketNotFoundError) as err:
        open_store("s3://no-such-bucket-sdar/ckpt")
    msg = str(err.value)
    assert "'no-such-bucket-sdar' does not exist" in msg and "aws s3 mb s3://no-such-bucket-sdar" in msg
    assert s3_server.endpoint_url in msg
    # without the early check the first operation reports it the same way
    lazy = open_store("s3://no-such-bucket-sdar", check=False)
    with pytest.raises(BucketNotFoundError, match="no-such-bucket-sdar"):
        lazy.write_text("a.txt", "x")


def test_s3_without_credentials_says_what_to_set(s3_server, monkeypatch):
    bucket = s3_server.make_bucket()
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(CredentialsError, match="AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"):
        open_store(f"s3://{bucket}")


def test_s3_unreachable_endpoint(s3_server, monkeypatch):
    import socket

    with socket.socket() as s:  # a loopback port with nothing listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("SDAR_S3_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    with pytest.raises(StorageError, match=f"cannot reach the S3 endpoint http://127.0.0.1:{port}"):
        S3Store("some-bucket", endpoint_url=None, check=True)


def test_uri_parsing_and_endpoint_precedence(tmp_path, monkeypatch):
    assert isinstance(open_store(tmp_path / "a"), LocalStore)
    local = open_store((tmp_path / "b").as_uri())
    assert isinstance(local, LocalStore) and local.root == (tmp_path / "b").resolve()
    assert local.uri_for("x/y.txt") == (tmp_path / "b" / "x" / "y.txt").as_uri()
    with pytest.raises(ValueError, match="unsupported storage URI scheme 'gs'.*s3://bucket/prefix"):
        open_store("gs://bucket/x")
    with pytest.raises(ValueError, match="invalid S3 bucket name 'My_Bucket'"):
        open_store("s3://My_Bucket/x")
    with pytest.raises(ValueError, match="names no bucket"):
        open_store("s3:///just/a/path")
    with pytest.raises(ValueError, match="names host"):
        open_store("file://otherhost/x")

    for var in ("SDAR_S3_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(var, raising=False)
    assert resolve_endpoint_url() is None
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://generic:1")
    assert resolve_endpoint_url() == "http://generic:1"
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://s3only:2")
    assert resolve_endpoint_url() == "http://s3only:2"
    monkeypatch.setenv("SDAR_S3_ENDPOINT_URL", "http://minio:9000")
    assert resolve_endpoint_url() == "http://minio:9000"
    assert resolve_endpoint_url("http://explicit:3") == "http://explicit:3"


def test_local_store_leaves_no_temp_files(tmp_path):
    store = open_store(tmp_path / "s")
    write_checkpoint(store, 1, make_ckpt(tmp_path, 1), keep_last=1)
    write_checkpoint(store, 2, make_ckpt(tmp_path, 2), keep_last=1)
    on_disk = sorted(p.relative_to(store.root).as_posix() for p in store.root.rglob("*"))
    assert on_disk == [
        "checkpoints",
        "checkpoints/latest.json",
        "checkpoints/step-000002",
        f"checkpoints/step-000002/{COMPLETE_FILE}",
        "checkpoints/step-000002/adapter_model.safetensors",
        "checkpoints/step-000002/optimizer.pt",
        "checkpoints/step-000002/tokenizer",
        "checkpoints/step-000002/tokenizer/vocab.json",
    ]
