"""Storage outages do not end runs: checkpoints wait in a local spool and are uploaded when the S3 server is
back; a run stopped by a long outage resumes from the spool. A real S3 API (moto) on loopback, really stopped."""

from __future__ import annotations

import threading

import pytest

from sdar.storage import StorageError, open_store
from sdar.train.checkpoint import latest_checkpoint

from .conftest import make_trainer, small_config


class Outage:
    """A moto S3 server on a fixed loopback port that can go down and come back (its data lives in the
    process's moto backends, so it survives the restart)."""

    def __init__(self) -> None:
        from sdar.ports import free_port

        self.port = free_port()
        self.server = None
        self.up()

    def up(self) -> None:
        from moto.server import ThreadedMotoServer

        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.server.start()

    def down(self) -> None:
        self.server.stop()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@pytest.fixture
def outage(s3_server, monkeypatch):
    o = Outage()
    monkeypatch.setenv("SDAR_S3_ENDPOINT_URL", o.url)
    yield o
    o.down()


def _bucket(outage) -> str:
    import boto3

    name = "outage-test"
    boto3.client("s3", endpoint_url=outage.url, region_name="us-east-1").create_bucket(Bucket=name)
    return name


def test_a_short_s3_outage_at_a_checkpoint_costs_nothing(tiny_ckpt, tmp_path, outage, monkeypatch):
    import sdar.train.trainer as tr

    uri = f"s3://{_bucket(outage)}/run"
    real = tr.Trainer.save_checkpoint

    def down_at_1(self, step):
        if step == 1:  # the server dies just before this checkpoint and comes back 4 s later
            outage.down()
            threading.Timer(4.0, outage.up).start()
        real(self, step)

    monkeypatch.setattr(tr.Trainer, "save_checkpoint", down_at_1)
    trainer = make_trainer(small_config(tmp_path, arm="grpo", steps=3, **{"checkpoint.uri": uri}, tracking=False))
    summary = trainer.run()
    assert summary["steps"] == 3
    assert len(trainer.checkpoints.outages) >= 1 and all(s > 0 for s in trainer.checkpoints.outages)
    assert latest_checkpoint(open_store(uri))[0] == 3


def test_a_long_outage_stops_the_run_and_the_rerun_resumes_from_the_spool(tiny_ckpt, tmp_path, outage):
    uri = f"s3://{_bucket(outage)}/long"
    make_trainer(small_config(tmp_path, arm="grpo", steps=1, **{"checkpoint.uri": uri}, tracking=False)).run()
    outage.down()
    trainer = make_trainer(small_config(tmp_path, arm="grpo", steps=2, **{"checkpoint.uri": uri}, tracking=False,
                                   **{"checkpoint.retry_s": 2.0}))
    with pytest.raises(StorageError, match=r"unreachable for .* kept in .*checkpoint-spool.*rerun"):
        trainer.run()
    assert (tmp_path / "checkpoint-spool" / "checkpoints" / "step-000002").is_dir()
    # while the store is still down, a rerun already resumes from the spool (the newest checkpoint)
    again = make_trainer(small_config(tmp_path, arm="grpo", steps=2, **{"checkpoint.uri": uri}, tracking=False))
    assert again.resume() and again.step == 2
    outage.up()
    again.checkpoints.flush(wait=False)  # nothing pending in a fresh process: the spool is only read
    assert latest_checkpoint(open_store(uri))[0] == 1
