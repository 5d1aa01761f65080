"""``python -m tests.helpers.llamacpp_server``: llama.cpp's own HTTP server (``llama-server``), from the PyPI wheel
``xllamacpp``, as a process of its own.

The wheel has no ``llama-server`` program: it embeds llama.cpp's server (the same ``/completion``, ``/v1/*``,
``/health``, ``/metrics``, ``/slots`` handlers) behind a Python API, ``xllamacpp.Server(CommonParams)``, which
starts listening in the constructor and serves from C++ threads. This entry takes ``llama-server``'s own flag
names, builds the ``CommonParams`` (llama.cpp's ``common_params``) and keeps the process alive until a signal
ends it (SIGTERM's default action: nothing here needs a clean shutdown). ``tests/helpers/llamacpp.py`` starts
it; nothing else should.

    python -m tests.helpers.llamacpp_server --model tiny.gguf --port 8080 --parallel 2 --ctx-size 1024 --metrics --slots
"""

from __future__ import annotations

import argparse
import signal
import sys

# Value names of --cache-type-k/-v, as llama-server spells them (common/arg.cpp's kv_cache_types).
CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tests.helpers.llamacpp_server", description=__doc__.splitlines()[0])
    p.add_argument("--model", "-m", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--parallel", "-np", type=int, default=1, help="slots (llama-server -np)")
    p.add_argument("--ctx-size", "-c", type=int, default=1024, help="total context, split between the slots")
    p.add_argument("--batch-size", "-b", type=int, default=None)
    p.add_argument("--ubatch-size", "-ub", type=int, default=None)
    p.add_argument("--cache-type-k", "-ctk", choices=CACHE_TYPES, default=None)
    p.add_argument("--cache-type-v", "-ctv", choices=CACHE_TYPES, default=None)
    p.add_argument("--kv-unified", "-kvu", action="store_true", help="one KV buffer shared by every slot")
    p.add_argument("--threads", "-t", type=int, default=1, help="decode threads (1: a polite neighbour in CI)")
    p.add_argument("--metrics", action="store_true", help="serve /metrics")
    p.add_argument("--slots", action="store_true", help="serve /slots")
    return p.parse_args(argv)


def common_params(args: argparse.Namespace):  # -> xllamacpp.CommonParams
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = args.model
    params.hostnames = [args.host]
    params.port = args.port
    params.n_parallel = args.parallel
    params.n_ctx = args.ctx_size
    if args.batch_size is not None:
        params.n_batch = args.batch_size
    if args.ubatch_size is not None:
        params.n_ubatch = args.ubatch_size
    for attr, name in (("cache_type_k", args.cache_type_k), ("cache_type_v", args.cache_type_v)):
        if name is not None:
            setattr(params, attr, getattr(xllamacpp.ggml_type, f"GGML_TYPE_{name.upper()}"))
    params.kv_unified = args.kv_unified
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    params.endpoint_metrics = args.metrics
    params.endpoint_slots = args.slots
    return params


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    import xllamacpp

    server = xllamacpp.Server(common_params(args))  # listening once this returns
    print(f"llamacpp_server: xllamacpp {xllamacpp.__version__} listening on {server.listening_address}", flush=True)
    while True:
        signal.pause()  # the server runs on its own threads; SIGTERM/SIGINT end the process


if __name__ == "__main__":
    raise SystemExit(main())
