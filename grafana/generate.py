#!/usr/bin/env python3
"""Write kvwatch's Grafana dashboards (grafana/dashboards/*.json) from the ``grafana`` package.

Usage:
    python grafana/generate.py            # (re)write the files
    python grafana/generate.py --check    # exit 1 if a committed file differs from what would be written
"""

import sys
from pathlib import Path

# Run as a script, Python puts grafana/ itself first on the path; the package (and kvwatch) live one up.
sys.path[0] = str(Path(__file__).resolve().parents[1])

from grafana import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
