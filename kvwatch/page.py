"""The status page at ``/`` and the history behind its charts, ``/api/v1/history``.

The page is three files of ``kvwatch/static/`` served from the package (no CDN, no font, nothing fetched
from elsewhere: it works air-gapped, e.g. through ``kubectl port-forward``). Its script polls
``/api/v1/diagnosis`` and ``/api/v1/history`` and redraws in place; it draws its charts as SVG itself. The
words and colours of the bottlenecks, actions and KV-pressure states, and the thresholds it draws, are the
catalogue's (and the settings'): they are embedded in the page as JSON, never copied into the script.

``add_page_routes(app, monitor)`` is all ``kvwatch.app`` calls.
"""

from __future__ import annotations

import hashlib
import json
from importlib import resources
from typing import TYPE_CHECKING

from aiohttp import web

from kvwatch import __version__
from kvwatch.catalog import Action, Bottleneck, KvPressure, ScrapeReason
from kvwatch.engines import ENGINES
from kvwatch.history import ENGINE_FIELDS, TARGET_FIELDS, parse_seconds

if TYPE_CHECKING:
    from kvwatch.app import Monitor
    from kvwatch.config import Settings

__all__ = ["ASSETS", "add_page_routes", "contrast_ratio", "page_config", "render_page"]

# Grafana's hues for the catalogue's colour names (``Bottleneck.colour`` is a Grafana colour name, so the page
# matches the dashboards). "text" is Grafana's theme text colour: a neutral grey here.
GRAFANA_HEX = {
    "text": "#9fa7b3",
    "green": "#73bf69",
    "blue": "#5794f2",
    "light-blue": "#8ab8ff",
    "yellow": "#fade2a",
    "light-orange": "#ffb357",
    "orange": "#ff9830",
    "dark-yellow": "#e0b400",
    "red": "#f2495c",
    "purple": "#b877d9",
    "dark-red": "#c4162a",
}
_TYPES = {".css": "text/css", ".js": "text/javascript", ".html": "text/html"}
# The page's own files only; nothing else of the package is served.
ASSETS = ("page.css", "charts.js", "page.js")
# Nothing but kvwatch itself: a page that loaded a script from elsewhere would not work air-gapped.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


def _luminance(hex_colour: str) -> float:
    """WCAG 2 relative luminance of ``#rrggbb``."""
    rgb = [int(hex_colour[i : i + 2], 16) / 255 for i in (1, 3, 5)]
    lin = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def contrast_ratio(a: str, b: str) -> float:
    la, lb = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (la + 0.05) / (lb + 0.05)


def _swatch(colour_name: str) -> dict:
    """The catalogue colour as CSS, with the text colour (black or white) that reads best on it."""
    bg = GRAFANA_HEX[colour_name]
    ink = max(("#111111", "#ffffff"), key=lambda c: contrast_ratio(bg, c))
    return {"colour": bg, "ink": ink}


def page_config(settings: Settings, labels: list[str]) -> dict:
    """What the script needs to know: the catalogue's words and colours, the thresholds, the settings."""
    return {
        "version": __version__,
        "targets": labels,
        "interval": settings.interval,
        "poll_seconds": min(5.0, max(1.0, settings.interval)),
        "history_seconds": settings.history,
        "stale_after": settings.stale_after,
        "thresholds": {
            "admission_stall": settings.admission_stall_threshold,
            "preemption_risk": settings.preemption_risk_threshold,
        },
        "hints": {
            "max_num_seqs": settings.max_num_seqs,
            "max_num_batched_tokens": settings.max_num_batched_tokens,
            "max_model_len": settings.max_model_len,
        },
        "bottlenecks": [
            {"name": str(b), "label": b.label, "meaning": b.meaning, "severity": b.severity, **_swatch(b.colour)}
            for b in Bottleneck
        ],
        "actions": {str(a): {"meaning": a.meaning, "flags": {e.name: e.flag(a) for e in ENGINES}} for a in Action},
        "kv_pressure": {str(k): {"label": k.label, **_swatch(k.colour)} for k in KvPressure},
        "network_reasons": [str(r) for r in ScrapeReason if r.network],  # the banner says "unreachable" for these
    }


def _static(name: str) -> str:
    return resources.files("kvwatch").joinpath("static", name).read_text(encoding="utf-8")


def render_page(config: dict) -> str:
    """index.html with the config embedded as JSON (``<`` escaped, so no value can end the script element)."""
    data = json.dumps(config, separators=(",", ":")).replace("<", "\\u003c").replace("&", "\\u0026")
    return _static("index.html").replace("__VERSION__", __version__).replace("__CONFIG__", data)


class _Asset:
    def __init__(self, body: str, content_type: str):
        self.body = body.encode()
        self.content_type = content_type
        self.etag = '"' + hashlib.sha256(self.body).hexdigest()[:16] + '"'

    def response(self, request: web.Request, headers: dict[str, str] | None = None) -> web.Response:
        # Revalidated on each load (no-cache), so an upgraded kvwatch never serves yesterday's script.
        h = {"Cache-Control": "no-cache", "ETag": self.etag, "X-Content-Type-Options": "nosniff", **(headers or {})}
        if request.headers.get("If-None-Match") == self.etag:
            return web.Response(status=304, headers=h)
        return web.Response(body=self.body, content_type=self.content_type, charset="utf-8", headers=h)


def history_json(monitor: Monitor, seconds: float, label: str | None = None) -> dict | None:
    """The history of every target, or of the one labelled ``label`` (None if there is none)."""
    s = monitor.settings
    now = monitor.clock()
    targets = [monitor.targets[url] for url in s.target]
    if label is not None:
        targets = [t for t in targets if t.target == label]
        if not targets:
            return None
    return {
        "now": round(now, 3),
        "seconds": seconds,
        "history_seconds": s.history,
        "interval": s.interval,
        "engine_fields": list(ENGINE_FIELDS),
        "target_fields": list(TARGET_FIELDS),
        "bytes": sum(t.history.nbytes for t in targets),
        "targets": [t.history.as_dict(t.target, now, seconds) for t in targets],
    }


def add_page_routes(app: web.Application, monitor: Monitor) -> None:
    """``/`` (the page), ``/static/<asset>`` and ``/api/v1/history`` on ``app``."""
    labels = [monitor.targets[url].target for url in monitor.settings.target]  # redacted
    page = _Asset(render_page(page_config(monitor.settings, labels)), "text/html")
    assets = {name: _Asset(_static(name), _TYPES[name[name.rindex(".") :]]) for name in ASSETS}

    async def index(request: web.Request) -> web.Response:
        return page.response(request, {"Content-Security-Policy": CSP, "Referrer-Policy": "no-referrer"})

    async def static(request: web.Request) -> web.Response:
        asset = assets.get(request.match_info["name"])
        if asset is None:
            raise web.HTTPNotFound(text="no such file\n")
        return asset.response(request)

    async def history(request: web.Request) -> web.Response:
        try:
            seconds = parse_seconds(request.query.get("seconds"), monitor.settings.history)
        except ValueError as e:
            return web.json_response({"error": str(e), "parameter": "seconds"}, status=400)
        label = request.query.get("target")
        doc = history_json(monitor, seconds, label)
        if doc is None:
            error = "target must be the label of a watched target, as /api/v1/diagnosis names it"
            return web.json_response({"error": error, "parameter": "target"}, status=404)
        return web.Response(text=json.dumps(doc, separators=(",", ":")), content_type="application/json")

    app.router.add_get("/", index)
    app.router.add_get("/static/{name}", static)
    app.router.add_get("/api/v1/history", history)
