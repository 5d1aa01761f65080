"""kvwatch's performance benchmark: ``python -m bench`` (see bench/README.md)."""
