"""The lifecycle every writer shares (dm-reverb's `TrajectoryWriter`'s): leaving a `with` block flushes
(unless a `ReverbError` ended it) and the writer stays usable; it is closed by `close()` or when it is
garbage-collected, and a closed writer refuses every call."""
from __future__ import annotations

import sys

from replay_tf import errors


class FlushOnExitCloseOnDelete:
    """Mixin for writers with `flush()` and `close()`; `close()` must set `_closed`."""

    _closed = False

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc_value, tb) -> None:
        if exc_type is None or not issubclass(exc_type, errors.ReverbError):
            self.flush()

    def __del__(self, _is_finalizing=sys.is_finalizing):
        # (bound at definition: while the interpreter tears modules down, this module's `sys` may be None)
        if _is_finalizing():
            return  # (gRPC may already be gone; the process ends anyway)
        try:
            self.close()
        except Exception:  # noqa: BLE001  (a half-built writer, or its server gone)
            pass

    def _raise_closed(self):
        raise RuntimeError(f"{type(self).__name__}::Close has been called.")
