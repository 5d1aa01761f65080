"""Rewrite docs/status-page.png, the README's picture of the status page: ``python docs/screenshot.py``.

It runs what a user runs, ``kvwatch demo`` (the simulator's ``tour`` and kvwatch), opens the page in Debian's
headless Chromium (tests/helpers/browser.py; ``bash .ci/install-tools.sh`` installs it) at 1280 px, waits
until the tour has gone round once and the page shows the KV-cache-bound state, and saves the whole page.
About a minute.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kvwatch.catalog import Bottleneck  # noqa: E402
from tests.helpers.browser import Browser  # noqa: E402
from tests.helpers.ports import free_port  # noqa: E402
from tests.helpers.process import Process  # noqa: E402

# Until the strip shows most of the tour (a second round), and the engine has been KV-bound for 3 s.
READY = f"""(() => {{
  const seen = new Set([...document.querySelectorAll('svg.strip rect[data-bottleneck]')].map(r => r.dataset.bottleneck));
  const b = document.querySelector('article.engine [data-role=bottleneck]');
  const held = /held (\\d+) s/.exec((document.querySelector('[data-role=confidence]') || {{}}).textContent || '');
  return seen.size >= 4 && b && b.dataset.bottleneck === {str(Bottleneck.KV_CACHE)!r} && held && +held[1] >= 3
    && document.querySelector('svg.chart[data-chart=kv] path.series').dataset.points > 100;
}})()"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=REPO / "docs" / "status-page.png")
    p.add_argument("--width", type=int, default=1280)
    args = p.parse_args()
    port = free_port()
    logs = REPO / "artifacts" / "screenshot"
    argv = [sys.executable, "-m", "kvwatch", "demo", "--plain", "--listen", f"127.0.0.1:{port}"]
    with Process(argv, logs / "demo.log", name="kvwatch demo", cwd=REPO) as demo, Browser(logs) as browser:
        demo.wait_for_url(f"http://127.0.0.1:{port}/readyz", timeout=60)
        page = browser.new_page()
        page.set_viewport(args.width, 800)
        page.goto(f"http://127.0.0.1:{port}/")
        page.wait_for(READY, timeout=300, what="a round of the tour and the KV-bound state on screen")
        page.screenshot(args.out)
        if page.console_errors:
            print("console errors:", *page.console_errors, sep="\n  ", file=sys.stderr)
            return 1
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
