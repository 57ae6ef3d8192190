"""The gRPC side of replay_tf: the remote client transport and the `deepmind.reverb.ReverbService` server.

`client/`: `client_transport` (`Transport`) with its `insert_stream` and `sample_stream`. `server/`: `service`
(`start`, the hook `replay_tf.Server` calls) over `servicer`, `insert_stream` and `sample_stream` (the
server's ends of the two streams), `table_entry`, `statuses`, `auth` and `stream_slots`. Both sides use
`common` (service path, channel options, errors), `malloc` (glibc thresholds for message buffers) and
`shared_memory` (same-machine sample slots).
"""
