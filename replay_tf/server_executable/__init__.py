"""Reverb's `reverb.server_executable`: a replay server configured by a `ReverbServerConfig` proto.

Modules, as in dm-reverb 0.14 (import them by name, as there: the package itself holds none of their names):
  `server_from_proto`  `selector_from_proto`, `rate_limiter_from_proto`, `tables_from_proto`
  `reverb_config_pb2`  the `deepmind.reverb.ReverbServerConfig` message (tables, port)
  `server_main`        `python -m replay_tf.server_executable.server_main --config='<textproto>'`
"""
