"""kvwatch: a sidecar that tells you which limit binds your vLLM server."""

__version__ = "0.1.0"
