"""tools/install_torch.py: torch comes from PyTorch's CPU index when that index answers (a real HTTP server on
127.0.0.1 plays it here), else from the configured index, and the line printed says which."""

from __future__ import annotations

import http.server
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> list[str]:
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "install_torch.py"), "torch==2.13.0", "--dry-run", *args],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    return out.splitlines()


def test_the_cpu_index_when_it_answers(tmp_path):
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "index.html").write_text("<a href='torch-2.13.0+cpu.whl'>torch</a>")
    handler = lambda *a, **k: http.server.SimpleHTTPRequestHandler(*a, directory=str(tmp_path), **k)  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    index = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        said, *cmds = _run("--index", index)
    finally:
        server.shutdown()
    assert said == f"installing torch==2.13.0: the CPU build from {index}"
    assert cmds == [f"-m pip install --quiet --no-deps --index-url {index} torch==2.13.0",
                    "-m pip install --quiet torch==2.13.0"]  # then its dependencies from the configured index


def test_the_configured_index_when_it_does_not_and_says_so():
    said, *cmds = _run("--index", "http://127.0.0.1:9/nothing-listens-here")
    assert "does not answer, so from the configured index" in said and "CUDA build" in said
    assert cmds == ["-m pip install --quiet torch==2.13.0"]
    said, *cmds = _run("--index", "")
    assert said.endswith("from the configured index (no CPU index asked for)") and cmds == ["-m pip install --quiet torch==2.13.0"]
