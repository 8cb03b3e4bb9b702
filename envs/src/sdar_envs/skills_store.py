"""Key-value storage of rendered privileged skills per (family, key): SQLite by default, DynamoDB on AWS.

`populate(family)` writes every key of a family's SkillLibrary; the teacher later reads one key per task.
"""

from __future__ import annotations

import sqlite3
import threading
import time
import urllib.parse
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sdar_envs.base import make_env
from sdar_envs.skills import SkillLibrary

# the key under which the general-only rendering (no task-specific skills) is stored
GENERAL_KEY = "*"


def rendered_skills(library: SkillLibrary) -> dict[str, str]:
    """Every entry a store holds for one library: each key's rendering, plus GENERAL_KEY."""
    out = {GENERAL_KEY: library.render(None)}
    for key in library.keys():
        out[key] = library.render(key)
    return out


def library_of(family: str, **env_kwargs: Any) -> SkillLibrary:
    """A family's SkillLibrary, read from an environment built with `env_kwargs` (then closed)."""
    env = make_env(family, **env_kwargs)
    try:
        return env.skill_library()
    finally:
        env.close()


class SkillsStore(ABC):
    """put/get/list of skill texts keyed by (family, key)."""

    @abstractmethod
    def put(self, family: str, key: str, text: str) -> None: ...

    @abstractmethod
    def _get(self, family: str, key: str) -> str | None: ...

    @abstractmethod
    def list(self, family: str | None = None) -> list[tuple[str, str]]:
        """Sorted (family, key) pairs, of one family or of all."""

    def get(self, family: str, key: str | None) -> str:
        """The skill text of (family, key); key None means GENERAL_KEY."""
        key = GENERAL_KEY if key is None else key
        text = self._get(family, key)
        if text is None:
            known = [k for _, k in self.list(family)]
            hint = f"known keys: {', '.join(known)}" if known else f"the store has nothing for {family!r}; run populate({family!r}) first"
            raise KeyError(f"no skills stored for family {family!r}, key {key!r}; {hint}")
        return text

    def put_many(self, family: str, items: dict[str, str]) -> int:
        for key, text in items.items():
            self.put(family, key, text)
        return len(items)

    def populate(self, family: str, library: SkillLibrary | None = None, **env_kwargs: Any) -> int:
        """Write every rendered key of `family`'s library (built from the family unless given)."""
        lib = library if library is not None else library_of(family, **env_kwargs)
        return self.put_many(family, rendered_skills(lib))

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""


class SQLiteSkillsStore(SkillsStore):
    """Skills in one SQLite file (the local default); safe to share between threads."""

    def __init__(self, path: str | Path = "skills.db") -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(self.path), check_same_thread=False, timeout=30.0)
        with self._lock, self._db:
            # WAL: readers (teachers) never wait for a writer; NORMAL sync is safe with WAL
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS skills (family TEXT NOT NULL, key TEXT NOT NULL, text TEXT NOT NULL,"
                " updated_at REAL NOT NULL, PRIMARY KEY (family, key))"
            )

    def put(self, family: str, key: str, text: str) -> None:
        with self._lock, self._db:
            self._db.execute(
                "INSERT INTO skills (family, key, text, updated_at) VALUES (?, ?, ?, ?)"
                " ON CONFLICT(family, key) DO UPDATE SET text = excluded.text, updated_at = excluded.updated_at",
                (family, key, text, time.time()),
            )

    def put_many(self, family: str, items: dict[str, str]) -> int:
        now = time.time()
        with self._lock, self._db:  # one transaction for the whole library
            self._db.executemany(
                "INSERT INTO skills (family, key, text, updated_at) VALUES (?, ?, ?, ?)"
                " ON CONFLICT(family, key) DO UPDATE SET text = excluded.text, updated_at = excluded.updated_at",
                [(family, k, v, now) for k, v in items.items()],
            )
        return len(items)

    def _get(self, family: str, key: str) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT text FROM skills WHERE family = ? AND key = ?", (family, key)).fetchone()
        return None if row is None else row[0]

    def list(self, family: str | None = None) -> list[tuple[str, str]]:
        with self._lock:
            if family is None:
                rows = self._db.execute("SELECT family, key FROM skills ORDER BY family, key").fetchall()
            else:
                rows = self._db.execute("SELECT family, key FROM skills WHERE family = ? ORDER BY key", (family,)).fetchall()
        return [(f, k) for f, k in rows]

    def close(self) -> None:
        with self._lock:
            self._db.close()


@dataclass
class DynamoDBConfig:
    """Where the DynamoDB skills table lives.

    table: table name (partition key "family", sort key "key", attribute "text").
    region: AWS region.
    endpoint_url: a non-AWS endpoint (DynamoDB Local, moto) or None for AWS itself.
    create_table: create the table (on-demand billing) when it does not exist.
    """

    table: str = "sdar-skills"
    region: str = "us-east-1"
    endpoint_url: str | None = None
    create_table: bool = True


class DynamoDBSkillsStore(SkillsStore):
    """Skills in a DynamoDB table (the low-latency KV store of the cluster setup), via boto3."""

    def __init__(self, config: DynamoDBConfig | None = None, **overrides: Any) -> None:
        try:
            import boto3
        except ImportError as exc:
            raise ImportError(
                "the DynamoDB skills store needs boto3: pip install 'sdar-envs[dynamodb]' "
                "(or use a sqlite:///path.db store)"
            ) from exc

        self.config = config or DynamoDBConfig(**overrides)
        self._client = boto3.client("dynamodb", region_name=self.config.region, endpoint_url=self.config.endpoint_url)
        if self.config.create_table:
            self._ensure_table()

    def _ensure_table(self) -> None:
        client = self._client
        try:
            client.describe_table(TableName=self.config.table)
            return
        except client.exceptions.ResourceNotFoundException:
            pass
        client.create_table(
            TableName=self.config.table,
            AttributeDefinitions=[
                {"AttributeName": "family", "AttributeType": "S"},
                {"AttributeName": "key", "AttributeType": "S"},
            ],
            KeySchema=[{"AttributeName": "family", "KeyType": "HASH"}, {"AttributeName": "key", "KeyType": "RANGE"}],
            BillingMode="PAY_PER_REQUEST",
        )
        client.get_waiter("table_exists").wait(TableName=self.config.table, WaiterConfig={"Delay": 1, "MaxAttempts": 60})

    def put(self, family: str, key: str, text: str) -> None:
        self._client.put_item(
            TableName=self.config.table,
            Item={"family": {"S": family}, "key": {"S": key}, "text": {"S": text}, "updated_at": {"N": repr(time.time())}},
        )

    def put_many(self, family: str, items: dict[str, str]) -> int:
        now = repr(time.time())
        requests = [
            {"PutRequest": {"Item": {"family": {"S": family}, "key": {"S": k}, "text": {"S": v}, "updated_at": {"N": now}}}}
            for k, v in items.items()
        ]
        for i in range(0, len(requests), 25):  # BatchWriteItem takes at most 25 items
            pending = {self.config.table: requests[i : i + 25]}
            for attempt in range(8):
                left = self._client.batch_write_item(RequestItems=pending).get("UnprocessedItems") or {}
                if not left:
                    break
                pending = left
                time.sleep(0.05 * 2**attempt)  # throttled: back off and resend what was left
            else:
                raise RuntimeError(f"DynamoDB kept throttling writes to {self.config.table!r}; retry later or raise its capacity")
        return len(items)

    def _get(self, family: str, key: str) -> str | None:
        item = self._client.get_item(
            TableName=self.config.table, Key={"family": {"S": family}, "key": {"S": key}}, ConsistentRead=True
        ).get("Item")
        return None if item is None else item["text"]["S"]

    def list(self, family: str | None = None) -> list[tuple[str, str]]:
        if family is None:
            pages = self._client.get_paginator("scan").paginate(TableName=self.config.table, ProjectionExpression="#f, #k",
                                                                 ExpressionAttributeNames={"#f": "family", "#k": "key"})
        else:
            pages = self._client.get_paginator("query").paginate(
                TableName=self.config.table,
                KeyConditionExpression="#f = :f",
                ExpressionAttributeNames={"#f": "family", "#k": "key"},
                ExpressionAttributeValues={":f": {"S": family}},
                ProjectionExpression="#f, #k",
            )
        return sorted((it["family"]["S"], it["key"]["S"]) for page in pages for it in page.get("Items", []))


def open_skills_store(uri: str) -> SkillsStore:
    """A store from a URI: a file path or 'sqlite:///path.db', or
    'dynamodb://TABLE?region=us-east-1&endpoint_url=http://127.0.0.1:8000&create_table=1'."""
    if uri.startswith("dynamodb://"):
        parts = urllib.parse.urlsplit(uri)
        query = dict(urllib.parse.parse_qsl(parts.query))
        unknown = set(query) - {"region", "endpoint_url", "create_table"}
        if unknown:
            raise ValueError(f"unknown DynamoDB option(s) {sorted(unknown)} in {uri!r}; use region, endpoint_url, create_table")
        d = DynamoDBConfig()
        return DynamoDBSkillsStore(
            DynamoDBConfig(
                table=parts.netloc or d.table,
                region=query.get("region", d.region),
                endpoint_url=query.get("endpoint_url"),
                create_table=query.get("create_table", "1").lower() not in ("0", "false", "no"),
            )
        )
    if uri.startswith("sqlite:///"):
        return SQLiteSkillsStore(uri[len("sqlite:///") :])
    if "://" in uri:
        raise ValueError(f"unsupported skills store {uri!r}; use a file path, sqlite:///path.db or dynamodb://table?region=...")
    return SQLiteSkillsStore(uri)
