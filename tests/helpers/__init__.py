"""Helpers shared by the tests and the benchmark (bench/ imports them too); one of each.

- ``tests.helpers.ports``: ``free_port()``, a free TCP port on 127.0.0.1.
- ``tests.helpers.process``: ``Process``, a child process in a session of its own, logging to a file, waited
  for (``wait_until`` / ``wait_for_url``), stopped with SIGTERM then SIGKILL and always reaped; ``wait_for``.
- ``tests.helpers.fake_vllm``: ``FakeVllm``, a fake vLLM ``/metrics`` (aiohttp) serving bodies, captures or a
  recording in real time, with faults on demand (slow, truncated, error status, gzip bomb, ...).
- ``tests.helpers.recordings``: ``recording()`` / ``captures()``, ``<unix_time>.prom`` directories read with
  kvwatch's own reader (``kvwatch.recording``); ``FIXTURES``, the real vLLM 0.32 captures.
- ``tests.helpers.prometheus``: the real ``prometheus`` / ``alertmanager`` binaries and ``python -m kvwatch``
  as ``Process``es on free ports (start, wait ready, query, stop), plus ``WebhookReceiver`` (local stand-in
  for Slack / PagerDuty / heartbeat endpoints).
- ``tests.helpers.dashboards``: the dashboards' queries run as Grafana runs them (variables resolved by their
  ``label_values`` queries, ``$__rate_interval``, ``$__range``) against a real Prometheus; the rule files of alerts/.

See each module's docstring for the API. Import from the module: ``from tests.helpers.process import Process``.
"""
