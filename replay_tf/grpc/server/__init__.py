"""The server side of the gRPC layer, `deepmind.reverb.ReverbService`: `service` (`start`, the hook
`replay_tf.Server` calls) over `servicer`, `insert_stream` and `sample_stream` (the two streaming calls),
`table_entry`, `statuses`, `auth` and `stream_slots`."""
