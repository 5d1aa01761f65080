"""The test's reader, as a process of its own: every ``--every`` s, kvwatch's /metrics and /api/v1/diagnosis,
then vLLM's own /metrics (the independent ground truth), one JSON line per sample to ``--out``.

A process of its own (and a session, so a scheduling group, of its own: see harness.Observer) keeps the
reads on their cadence however busy the test's process is; the test reads the lines back.
``python -m tests.e2e.observe --kvwatch URL [--vllm URL] --every S --out FILE``; stops on SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import time

import httpx


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvwatch", required=True, help="kvwatch's base URL")
    ap.add_argument("--vllm", help="vLLM's /metrics URL")
    ap.add_argument("--every", type=float, default=1.0)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    # A slow read only delays a sample; a timed-out one loses it, so the timeout is generous.
    with httpx.Client(timeout=5.0) as client, open(a.out, "a") as out:
        while True:
            t = time.time()
            line: dict = {"t": t, "took": {}, "kvwatch": None, "diagnosis": None, "vllm": None}
            took = line["took"]  # seconds from t to the end of each read: a slow peer or a stalled machine
            try:
                r = client.get(f"{a.kvwatch}/metrics")
                took["kvwatch"] = round(time.time() - t, 3)
                if r.status_code == 200:
                    line["kvwatch"] = r.text
                r = client.get(f"{a.kvwatch}/api/v1/diagnosis")
                took["diagnosis"] = round(time.time() - t, 3)
                if r.status_code == 200:
                    line["diagnosis"] = r.json()
            except (httpx.HTTPError, ValueError):
                pass
            if a.vllm:
                try:
                    r = client.get(a.vllm)
                    took["vllm"] = round(time.time() - t, 3)
                    if r.status_code == 200:
                        line["vllm"] = r.text
                except httpx.HTTPError:
                    pass
            out.write(json.dumps(line) + "\n")
            out.flush()
            time.sleep(max(0.0, a.every - (time.time() - t)))


if __name__ == "__main__":
    main()
