"""Screenshot of the comparison's MLflow view, for the docs: what the URL `sdar run` / `sdar demo` / `sdar ui` print
shows in a browser that has never seen MLflow.

Starts `mlflow server` on 127.0.0.1 over a comparison's store (the demo's runs/kfp-local/mlflow.db by default),
opens the view of its newest pipeline job (or --job) in headless Chromium with a fresh profile, the way
tests/integration/test_mlflow_ui.py does (sdar.tracking.ui.render), and saves docs/images/mlflow-comparison.png.
Usage:
    python tools/mlflow_screenshot.py [--store runs/kfp-local/mlflow.db] [--out docs/images/mlflow-comparison.png]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from sdar.tracking.ui import comparison_view, render, serve
    from sdar.tracking.view import view_runs, view_url

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--store", default="runs/kfp-local/mlflow.db", help="MLflow store: a SQLite file or a URI")
    p.add_argument("--job", default=None, help="pipeline job id; default: the newest comparison in the store")
    p.add_argument("--out", default="docs/images/mlflow-comparison.png")
    p.add_argument("--window", default="1900,1150", help="browser window WIDTH,HEIGHT")
    args = p.parse_args(argv)
    uri = args.store if "://" in args.store else f"sqlite:///{Path(args.store).expanduser().resolve()}"
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).is_file():
        raise SystemExit(f"no MLflow store at {uri}; run `sdar run --local --quick` first or pass --store")
    width, height = (int(x) for x in args.window.split(","))
    with serve(uri) as base:
        exp_id, job = comparison_view(uri, args.job)
        url = view_url(base, exp_id, job)
        names = [r.info.run_name for r in view_runs(uri, exp_id, job)]
        page = render(url, lambda text: all(n in text for n in names) and "held-out success" in text,
                      window=(width, height), settle_s=4)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(page.png)
    print(f"saved {out} ({len(page.png) / 1024:.0f} KiB) of {len(names)} runs ({', '.join(names)}) in "
          f"{page.seconds:.1f} s; page: {url}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
