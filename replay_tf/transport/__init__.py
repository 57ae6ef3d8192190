"""How a client reaches a server: `base` (what a client needs of a connection: `Transport`, `InsertStream`,
`SampleStream`; `make_transport`, `set_connection_options`), `inprocess` (the tables of a `Server` of this
process called directly), `local_servers` (where in-process clients find those servers) and `addresses`
(host:port parsing, which hosts are loopback). The remote transport is `replay_tf.grpc.client`."""
