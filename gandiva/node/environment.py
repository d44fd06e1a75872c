"""What of the node's environment a job starts with: an allow-list, never the whole of the
server's or the agent's (which hold ``GANDIVA_DB`` with its password, tokens, Ray's
addresses). A job's own variables come from its spec's ``env``."""

from __future__ import annotations

import os
from collections.abc import Mapping

# who the process runs as and where, its language and zone; where the node keeps its
# libraries, Python packages and certificate authorities; the node's CUDA, NCCL and gloo
# settings and the fabrics NCCL runs over (libfabric, UCX). Not proxies (their URLs carry
# passwords), not HF_* (HF_TOKEN): a job that needs them names them in its spec's env.
KEPT = frozenset({"PATH", "HOME", "USER", "LOGNAME", "LANG", "TZ", "LD_LIBRARY_PATH",
                  "PYTHONPATH", "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE"})
KEPT_PREFIXES = ("LC_", "CUDA_", "NCCL_", "GLOO_", "FI_", "UCX_")


def for_jobs(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The part of ``environ`` (this process's by default) that every job gets."""
    environ = os.environ if environ is None else environ
    return {k: v for k, v in environ.items() if k in KEPT or k.startswith(KEPT_PREFIXES)}
