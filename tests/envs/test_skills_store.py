"""The skills store: SQLite file by default, DynamoDB against a real moto server on 127.0.0.1."""

from __future__ import annotations

import threading

import pytest

from sdar_envs.base import register_env
from sdar_envs.skills_store import (
    GENERAL_KEY,
    DynamoDBConfig,
    DynamoDBSkillsStore,
    SQLiteSkillsStore,
    open_skills_store,
    rendered_skills,
)
from tests.envs.test_server import GuessEnv

register_env("guess_skills", GuessEnv)


def _check_store(store) -> None:
    lib = GuessEnv.skill_library()
    assert store.populate("guess_skills") == 3  # two keys + the general-only entry
    assert store.list("guess_skills") == [("guess_skills", GENERAL_KEY), ("guess_skills", "parity_even"), ("guess_skills", "parity_odd")]
    assert store.get("guess_skills", "parity_odd") == lib.render("parity_odd")
    assert "the digit is odd" in store.get("guess_skills", "parity_odd")
    assert store.get("guess_skills", None) == lib.render(None) and "digit is" not in store.get("guess_skills", None)
    # put overwrites; families stay apart
    store.put("guess_skills", "parity_odd", "new text")
    store.put("other", "k1", "other text")
    assert store.get("guess_skills", "parity_odd") == "new text"
    assert store.list("other") == [("other", "k1")]
    assert set(store.list()) == {*store.list("guess_skills"), ("other", "k1")}
    with pytest.raises(KeyError, match="no skills stored for family 'guess_skills', key 'nope'; known keys: \\*, parity_even"):
        store.get("guess_skills", "nope")
    with pytest.raises(KeyError, match="run populate\\('empty'\\) first"):
        store.get("empty", "x")
    # a library given directly is written as rendered
    n = store.populate("guess_lib", library=lib)
    assert n == len(rendered_skills(lib)) and store.get("guess_lib", "parity_even") == lib.render("parity_even")


def test_sqlite_store(tmp_path):
    path = tmp_path / "sub" / "skills.db"
    store = open_skills_store(f"sqlite:///{path}")
    assert isinstance(store, SQLiteSkillsStore)
    _check_store(store)
    store.close()
    # the file persists and is shared by a second handle
    again = SQLiteSkillsStore(path)
    assert again.get("guess_skills", "parity_odd") == "new text"
    again.close()


def test_sqlite_store_is_safe_across_threads(tmp_path):
    store = SQLiteSkillsStore(tmp_path / "s.db")
    errors = []

    def writer(i):
        try:
            for j in range(25):
                store.put(f"f{i}", f"k{j}", f"{i}-{j}")
                assert store.get(f"f{i}", f"k{j}") == f"{i}-{j}"
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(store.list()) == 150
    store.close()


@pytest.fixture(scope="module")
def moto_endpoint():
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def aws_env(monkeypatch, tmp_path):
    """Dummy credentials and no profile, role or endpoint settings: only the moto server is reachable."""
    for var in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ENDPOINT_URL",
                "AWS_ENDPOINT_URL_DYNAMODB", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def test_dynamodb_store_against_a_moto_server(moto_endpoint, aws_env):
    store = open_skills_store(f"dynamodb://sdar-skills-test?region=eu-west-1&endpoint_url={moto_endpoint}")
    assert isinstance(store, DynamoDBSkillsStore) and store.config.region == "eu-west-1"
    _check_store(store)
    # a second client sees the same table (it exists now, so it is not re-created)
    other = DynamoDBSkillsStore(DynamoDBConfig(table="sdar-skills-test", region="eu-west-1", endpoint_url=moto_endpoint))
    assert other.get("guess_skills", "parity_even") == GuessEnv.skill_library().render("parity_even")


def test_dynamodb_batches_more_than_25_items(moto_endpoint, aws_env):
    store = DynamoDBSkillsStore(table="sdar-skills-batch", region="us-east-1", endpoint_url=moto_endpoint)
    items = {f"key{i:03d}": f"text {i}" for i in range(60)}
    assert store.put_many("big", items) == 60
    assert len(store.list("big")) == 60 and store.get("big", "key059") == "text 59"


def test_store_uris_are_checked():
    with pytest.raises(ValueError, match="unsupported skills store 'redis://x'"):
        open_skills_store("redis://x")
    with pytest.raises(ValueError, match=r"unknown DynamoDB option\(s\) \['regoin'\]"):
        open_skills_store("dynamodb://t?regoin=us-east-1")
