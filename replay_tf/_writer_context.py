"""The context-manager behaviour every writer shares (Reverb's): leaving the block flushes, unless a
`ReverbError` ended it, then closes."""
from __future__ import annotations

from replay_tf import errors


class FlushAndCloseOnExit:
    """Mixin for writers with `flush()` and `close()`."""

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc_value, tb) -> None:
        if exc_type is None or not issubclass(exc_type, errors.ReverbError):
            self.flush()
        self.close()
