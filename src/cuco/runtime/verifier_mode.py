"""Where a job's checks run: ``process`` (a verifier process per rank, the default) or
``inline`` (in the worker, the candidate's own process: for machines where a second CUDA
context per GPU cannot be had). ``CUCO_VERIFIER`` picks it when no option does."""

from __future__ import annotations

import os

ENV_VAR = "CUCO_VERIFIER"
PROCESS, INLINE = "process", "inline"
MODES = (PROCESS, INLINE)


def verifier_mode(value: str | None = None) -> str:
    """``value`` (else ``$CUCO_VERIFIER``, else ``process``), checked: a clear
    :class:`ValueError` for anything but :data:`MODES`."""
    source = "verifier" if value is not None else ENV_VAR
    raw = value if value is not None else os.environ.get(ENV_VAR, "")
    mode = raw.strip().lower() or PROCESS
    if mode not in MODES:
        raise ValueError(f"{source}={raw!r}: the verifier runs as 'process' (its own process "
                         "per rank, the default) or 'inline' (in the worker)")
    return mode
