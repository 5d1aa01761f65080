"""Test harness shared by the alert and dashboard tests.

- ``tests.helpers.prometheus``: run the real ``prometheus`` / ``alertmanager`` binaries and ``python -m kvwatch``
  on free loopback ports (start, wait ready, query, stop), plus ``WebhookReceiver`` (local stand-in for Slack /
  PagerDuty / heartbeat endpoints).
- ``tests.helpers.replay``: ``SnapshotServer`` serves recorded vLLM ``/metrics`` captures in real time, looping,
  counters kept monotonic.

See each module's docstring for the API. Import as ``from tests.helpers.prometheus import Prometheus``.
"""
