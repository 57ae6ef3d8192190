"""Reverb's `reverb.server_executable.server_main`: a replay server configured by a textproto flag.

    python -m replay_tf.server_executable.server_main --config='
        port: 8000
        tables { table_name: "replay" max_size: 1000 sampler { uniform: true } remover { fifo: true }
                 rate_limiter { samples_per_insert: 1.0 min_size_to_sample: 1
                                min_diff: -1e300 max_diff: 1e300 } }'

`--config` is a `deepmind.reverb.ReverbServerConfig` in text format (`reverb_config_pb2`). The server runs
until the process is stopped. Port 0 (or none set) picks a free port, which is logged; Reverb passes 0 on
to gRPC and then reports port 0.
"""
from __future__ import annotations

from typing import Optional

from absl import app
from absl import flags
from absl import logging
from google.protobuf import text_format

from replay_tf.server import Server
from replay_tf.server_executable import reverb_config_pb2
from replay_tf.server_executable import server_from_proto

_CONFIG = flags.DEFINE_string("config", None, "Reverb server config in textproto format", required=True)


def get_server_config_proto() -> reverb_config_pb2.ReverbServerConfig:
    """The `--config` flag parsed as a `ReverbServerConfig`."""
    return text_format.Parse(_CONFIG.value, reverb_config_pb2.ReverbServerConfig())


def server_from_config(config_proto: reverb_config_pb2.ReverbServerConfig, checkpointer=None) -> Server:
    """A started server holding the tables of `config_proto`, on its port (a free one when it is 0)."""
    tables = server_from_proto.tables_from_proto(config_proto.tables)
    logging.info("Configuring reverb for %d tables", len(tables))
    port: Optional[int] = config_proto.port or None
    return Server(tables=tables, port=port, checkpointer=checkpointer)


def main(unused_argv) -> None:
    server = server_from_config(get_server_config_proto())
    logging.info("Reverb started on port %d.", server.port)
    server.wait()


def app_run_main() -> None:
    """Entry point of a console script: runs `main` under absl."""
    app.run(main)


if __name__ == "__main__":
    app_run_main()
