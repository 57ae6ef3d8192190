"""Error classes, named as Reverb names them (`reverb.ReverbError`, `reverb.DeadlineExceededError`)."""

# Reverb's status text for a rate-limiter timeout (inserts and samples alike); clients match on it.
RATE_LIMITER_TIMEOUT_MESSAGE = "Rate Limiter: Timeout exceeded before the right to insert was acquired."


class ReverbError(Exception):
    """Base class for replay server errors."""


class DeadlineExceededError(ReverbError):
    """A call to the server timed out (for example waiting on a rate limiter)."""


class TableNotFoundError(ValueError, RuntimeError):
    """A call named a table the server does not have. dm-reverb's client raises `RuntimeError` there (its
    status message is the same), and an unknown name is a `ValueError` in Python: both `except` clauses catch
    it."""


class CancelledError(ReverbError):
    """A call was cancelled because its table (or server) was closed while it waited."""


class UnavailableError(ReverbError):
    """A table refuses inserts for now (its server is shutting down); the gRPC status is UNAVAILABLE, on which
    writers reconnect and send their unconfirmed items again."""


def table_not_found(name: str, tables) -> TableNotFoundError:
    """The error for a call naming table `name` on a server whose tables are `tables` (names)."""
    return TableNotFoundError(f"Priority table {name} was not found. The server has tables: {sorted(tables)}")


def rate_limiter_timeout() -> DeadlineExceededError:
    """The error a rate-limited call raises when its `timeout_ms` runs out."""
    return DeadlineExceededError(RATE_LIMITER_TIMEOUT_MESSAGE)
