"""The settings of Composer channel 3 (N-teacher trace replay to DPO pairs): the teacher endpoints and the
`replay:` section, typed and checked when loaded. Part of the config layer: light imports only, so reading a
config never pulls torch, an HTTP client or the pool."""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

# what a local server gets when no key is configured (OpenAI clients refuse an empty key)
LOCAL_DUMMY_KEY = "sdar-local"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass
class TeacherEndpoint:
    """One teacher: a model behind an OpenAI-compatible `/v1/chat/completions`."""

    name: str = field(metadata={"help": "How stats and logs call it (unique within a pool)."})
    base_url: str = field(metadata={
        "help": "The API root, e.g. \"http://127.0.0.1:8300/v1\" or \"https://api.openai.com/v1\"."})
    model: str = field(metadata={"help": "The model id sent with each request."})
    api_key_env: str | None = field(default=None, metadata={
        "help": "The NAME of the environment variable holding the key; null = a local server that wants no key "
                "(a dummy one is sent)."})
    price_in_per_1k: float = field(default=0.0, metadata={
        "help": "USD per 1,000 prompt tokens (budget and cost stats)."})
    price_out_per_1k: float = field(default=0.0, metadata={
        "help": "USD per 1,000 completion tokens (budget and cost stats)."})
    concurrency: int = field(default=4, metadata={"help": "Requests in flight to this endpoint at most."})
    timeout_s: float = field(default=30.0, metadata={"help": "Per-request timeout, seconds."})
    max_retries: int = field(default=3, metadata={
        "help": "Extra attempts after a retryable failure (connection error, timeout, 408/409/429, 5xx), with "
                "exponential backoff and jitter."})

    def __post_init__(self) -> None:
        where = f"teacher {self.name!r}"
        if not self.name or not str(self.name).strip():
            raise ValueError("a teacher endpoint needs a non-empty name")
        if not str(self.base_url).startswith(("http://", "https://")):
            raise ValueError(f"{where}: base_url must start with http:// or https:// (e.g. http://127.0.0.1:8300/v1), "
                             f"got {self.base_url!r}")
        if not self.model:
            raise ValueError(f"{where}: model is empty; give the model id the endpoint serves")
        if self.api_key_env is not None and not _ENV_NAME.match(str(self.api_key_env)):
            raise ValueError(f"{where}: api_key_env must name an environment variable (letters, digits, _), got "
                             "a value that is not one; put the key itself in that variable, never in the config")
        for f in ("price_in_per_1k", "price_out_per_1k"):
            if float(getattr(self, f)) < 0:
                raise ValueError(f"{where}: {f} must be >= 0 USD, got {getattr(self, f)}")
        if int(self.concurrency) < 1:
            raise ValueError(f"{where}: concurrency must be >= 1, got {self.concurrency}")
        if float(self.timeout_s) <= 0:
            raise ValueError(f"{where}: timeout_s must be > 0, got {self.timeout_s}")
        if int(self.max_retries) < 0:
            raise ValueError(f"{where}: max_retries must be >= 0, got {self.max_retries}")

    @property
    def identity(self) -> str:
        """What the cache keys on: the same model at the same address is the same teacher."""
        return f"{self.base_url.rstrip('/')}|{self.model}"

    def api_key(self) -> str:
        """The key from `api_key_env` (a dummy one when None); a missing variable is an error naming it."""
        if self.api_key_env is None:
            return LOCAL_DUMMY_KEY
        key = os.environ.get(self.api_key_env)
        if not key:
            raise ValueError(f"teacher {self.name!r}: environment variable {self.api_key_env} is not set (or empty); "
                             f"export it (on a cluster: mount the Secret as {self.api_key_env}) or set api_key_env: "
                             "null for a local server without a key")
        return key

    def cost(self, tokens_in: int, tokens_out: int) -> float:
        """USD for one request's token counts."""
        return tokens_in / 1000.0 * self.price_in_per_1k + tokens_out / 1000.0 * self.price_out_per_1k

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TeacherEndpoint:
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(data) - set(known))
        if unknown:
            hint = " (put the key in an environment variable and name it in api_key_env)" if any(
                "key" in k and k != "api_key_env" for k in unknown) else ""
            raise ValueError(f"unknown teacher setting(s) {unknown}; valid settings: {', '.join(known)}{hint}")
        missing = [k for k in ("name", "base_url", "model") if k not in data]
        if missing:
            raise ValueError(f"teacher {data.get('name', '?')!r} lacks {missing}; "
                             "every teacher needs name, base_url, model")
        return cls(**data)


# the local pool's default teachers: two observation-only rule experts that disagree sometimes, so
# min_agree=2 means both saw the same move (names: `sdar.replay.experts.EXPERT_VARIANTS`)
DEFAULT_LOCAL_EXPERTS = ("default", "b")


@dataclass
class ReplayConfig:
    """Where the teachers are and how their votes become DPO pairs (YAML section `replay`)."""

    teachers: list[TeacherEndpoint] = field(default_factory=list, metadata={
        "help": "The teacher endpoints (mappings of `TeacherEndpoint` fields); empty = start the local pool on "
                "127.0.0.1 (`sdar teachers serve`: local_experts plus local_policies)."})
    min_agree: int = field(default=2, metadata={
        "help": "Teachers that must propose the same action for a pair (ALGORITHM.md section 5: 2)."})
    budget_usd: float | None = field(default=None, metadata={
        "help": "Stop asking teachers once this many USD are spent (from `usage` x the endpoint prices); "
                "null = no cap."})
    cache_dir: str | None = field(default=None, metadata={
        "help": "Keep teacher replies on disk here (a rerun asks nothing twice); null = the run's output dir decides."})
    max_tokens: int = field(default=64, metadata={"help": "Completion tokens of every teacher request at most."})
    temperature: float = field(default=0.0, metadata={
        "help": "Sampling temperature of every teacher request (0 = greedy)."})
    local_policies: list[str] = field(default_factory=list, metadata={
        "help": "Local pool only: checkpoints served as teachers, \"PATH\" or \"NAME=PATH\", \":skills\" appended "
                "to prepend the task's privileged skills to their prompts (`sdar.replay.server.ServedPolicy.parse`)."})
    local_experts: list[str] = field(default_factory=lambda: list(DEFAULT_LOCAL_EXPERTS), metadata={
        "help": "Local pool only: rule-expert variants served as teachers (`sdar.replay.experts.EXPERT_VARIANTS`)."})
    lag: int = field(default=1, metadata={
        "help": "1 = a step's pairs enter the next step's loss (the replay runs beside scoring and the update); "
                "0 = the same step."})
    pairs_path: str | None = field(default=None, metadata={
        "help": "A JSONL of pairs made elsewhere (the DAG's teacher_replay step, `write_pairs`) added to the "
                "first step."})

    def __post_init__(self) -> None:
        self.teachers = [t if isinstance(t, TeacherEndpoint) else TeacherEndpoint.from_dict(dict(t))
                         for t in (self.teachers or [])]
        names = [t.name for t in self.teachers]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"replay.teachers: names must be unique; {dup} appear more than once")
        if int(self.min_agree) < 1:
            raise ValueError(f"replay.min_agree must be >= 1, got {self.min_agree}")
        if self.teachers and len(self.teachers) < self.min_agree:
            raise ValueError(f"replay.min_agree={self.min_agree} but only {len(self.teachers)} teacher(s) are "
                             "configured: no turn could ever reach agreement; add teachers or lower min_agree")
        if self.budget_usd is not None and float(self.budget_usd) < 0:
            raise ValueError(f"replay.budget_usd must be >= 0 or null (no cap), got {self.budget_usd}")
        if int(self.max_tokens) < 1:
            raise ValueError(f"replay.max_tokens must be >= 1, got {self.max_tokens}")
        if float(self.temperature) < 0:
            raise ValueError(f"replay.temperature must be >= 0, got {self.temperature}")
        if self.lag not in (0, 1):
            raise ValueError(f"replay.lag must be 0 (same step) or 1 (next step), got {self.lag}")
        for name in ("local_policies", "local_experts"):
            value = getattr(self, name)
            if isinstance(value, str) or not all(isinstance(v, str) and v for v in value):
                raise ValueError(f"replay.{name} must be a list of non-empty strings, got {value!r}")
            setattr(self, name, list(value))

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> ReplayConfig:
        data = dict(data or {})
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise ValueError(f"unknown replay setting(s) {unknown}; valid settings: {', '.join(known)}")
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["teachers"] = [t.to_dict() for t in self.teachers]
        return out


def load_pool_file(path: str | Path) -> dict[str, Any]:
    """A teacher-pool file: a YAML (or JSON) mapping of `replay` settings, e.g. `teachers:` (base_url, model,
    api_key_env, prices, concurrency, timeout), `min_agree`, `budget_usd`; a top-level `replay:` key is
    also accepted. Keys are never in it: each endpoint names the environment variable holding its key."""
    import yaml

    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"teacher pool file {p} not found; write one like configs/teachers/example.yaml")
    data = yaml.safe_load(p.read_text()) or {}
    if isinstance(data, dict) and set(data) == {"replay"}:
        data = data["replay"]
    if not isinstance(data, dict):
        raise ValueError(f"{p} must hold a mapping of replay settings (teachers, min_agree, budget_usd, ...)")
    return data
