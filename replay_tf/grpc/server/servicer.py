"""`ReverbServicer`: the handlers of `deepmind.reverb.ReverbService` over a `replay_tf.Server`'s tables.

The unary calls (Checkpoint, MutatePriorities, Reset, ServerInfo) and InitializeConnection are answered
here; InsertStream and SampleStream are served by `insert_stream` and `sample_stream`. Each table is reached
through its `table_entry.TableEntry`, kept here. `InitializeConnection` always answers `address=0`:
Reverb clients then sample over gRPC (a table pointer can never be shared with another process, and
Python objects have no C++ address anyway).

Errors never stop the server: a malformed or inconsistent request ends its own call with a precise status
(INVALID_ARGUMENT for bad bytes, shapes or dtypes, NOT_FOUND for an unknown table, FAILED_PRECONDITION for
references to chunks the stream does not hold, CANCELLED when the server stops; see `statuses`) and the
chunks held for that stream are released.
"""
from __future__ import annotations

from typing import Iterator

import grpc

from replay_tf import errors
from replay_tf.core import chunk_store as chunk_store_lib
from replay_tf.grpc.server import insert_stream
from replay_tf.grpc.server import sample_stream
from replay_tf.grpc.server import statuses
from replay_tf.grpc.server import table_entry
from replay_tf.wire import limits
from replay_tf.wire import reverb_service_pb2
from replay_tf.wire import schema_pb2

__all__ = ["ReverbServicer"]


class ReverbServicer:
    """The handlers of `deepmind.reverb.ReverbService` over a `replay_tf.Server`'s tables (raw bytes in/out)."""

    def __init__(self, server):
        self._server = server
        self._tables = {name: table_entry.TableEntry(table) for name, table in server.tables.items()}
        # (Not `or`: an empty ChunkStore is falsy, and the server's store must be the one used.)
        store = getattr(server, "chunk_store", None)
        self._chunk_store = chunk_store_lib.ChunkStore() if store is None else store
        state_id = int(getattr(server, "tables_state_id", 0))
        self._tables_state_id = schema_pb2.Uint128(high=state_id >> 64, low=state_id & ((1 << 64) - 1))
        # Refuses chunk tensors whose steps fit no column of the tables' signatures (None: a table has none).
        step_check = limits.StepCheck.for_signatures(table.info.signature for table in server.tables.values())
        self._inserts = insert_stream.InsertStreams(self._entry, self._chunk_store, step_check)
        self._samples = sample_stream.SampleStreams(self._entry)

    def close(self) -> None:
        """Ends the threads the handlers keep between calls (when the calls they serve have ended)."""
        self._inserts.close()

    # --- helpers ---

    def pending_inserts(self, table: str) -> tuple:
        """`(items waiting in the table's pending-insert queue, the queue's limit)`."""
        queue = self._entry(table).table.insert_queue
        return len(queue), queue.limit

    def _entry(self, name: str) -> table_entry.TableEntry:
        entry = self._tables.get(name)
        if entry is None:
            raise statuses.StatusError(grpc.StatusCode.NOT_FOUND, str(errors.table_not_found(name, self._tables)))
        return entry

    # --- unary methods ---

    def checkpoint(self, raw: bytes, context) -> bytes:
        def run():
            statuses.parse(reverb_service_pb2.CheckpointRequest, raw)
            if getattr(self._server, "checkpointer", None) is None:
                raise statuses.StatusError(grpc.StatusCode.INVALID_ARGUMENT,
                                           "no Checkpointer configured for the replay service")
            path = self._server.checkpoint()
            return reverb_service_pb2.CheckpointResponse(checkpoint_path=str(path)).SerializeToString()
        return statuses.run_unary(context, run)

    def mutate_priorities(self, raw: bytes, context) -> bytes:
        def run():
            request = statuses.parse(reverb_service_pb2.MutatePrioritiesRequest, raw)
            table = self._entry(request.table).table
            table.mutate_items([(u.key, u.priority) for u in request.updates], list(request.delete_keys))
            return b""
        return statuses.run_unary(context, run)

    def reset(self, raw: bytes, context) -> bytes:
        def run():
            request = statuses.parse(reverb_service_pb2.ResetRequest, raw)
            self._entry(request.table).table.reset()
            return b""
        return statuses.run_unary(context, run)

    def server_info(self, raw: bytes, context) -> bytes:
        def run():
            statuses.parse(reverb_service_pb2.ServerInfoRequest, raw)
            response = reverb_service_pb2.ServerInfoResponse()
            response.tables_state_id.CopyFrom(self._tables_state_id)
            for entry in self._tables.values():
                response.table_info.append(entry.info_proto())
            return response.SerializeToString()
        return statuses.run_unary(context, run)

    # --- InitializeConnection ---

    def initialize_connection(self, request_iterator, context) -> Iterator[bytes]:
        def run():
            for raw in request_iterator:
                statuses.parse(reverb_service_pb2.InitializeConnectionRequest, raw)
                # Never a pointer: the client falls back to sampling over gRPC.
                yield reverb_service_pb2.InitializeConnectionResponse(address=0).SerializeToString()
                return
        return statuses.run_stream(context, run())

    # --- InsertStream, SampleStream ---

    def insert_stream(self, request_iterator, context) -> Iterator[bytes]:
        return statuses.run_stream(context, self._inserts.stream(request_iterator, context))

    def sample_stream(self, request_iterator, context) -> Iterator[bytes]:
        return statuses.run_stream(context, self._samples.stream(request_iterator, context))
