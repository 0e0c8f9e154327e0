"""The processes of this host, as the lease (a driver's liveness) and the worker (its encoders' scratch folders) see
them: a leaf of the driver/worker contract."""

from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """Whether a process of this host exists (signal 0 only checks)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True
