"""Test harness shared by the alert and dashboard tests.

- ``tests.support.prometheus``: run the real ``prometheus`` / ``alertmanager`` binaries and ``python -m kvwatch``
  on free loopback ports (start, wait ready, query, stop), plus ``WebhookReceiver`` (local stand-in for Slack /
  PagerDuty / heartbeat endpoints).
- ``tests.support.replay``: ``SnapshotServer`` serves recorded vLLM ``/metrics`` captures in real time, looping,
  counters kept monotonic.

See each module's docstring for the API. ``tests/`` has no ``__init__.py``, so pytest (default "prepend"
import mode) puts ``tests/`` on ``sys.path``: import as ``from support.prometheus import Prometheus``.
"""
