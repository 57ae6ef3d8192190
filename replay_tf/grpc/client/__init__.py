"""The remote client side of the gRPC layer: `client_transport` (`Transport`, what `make_transport` returns for
a server of another process) with its `insert_stream` and `sample_stream`."""
