"""Bounded specs in table signatures keep their class and bounds: over gRPC, and in `replay-tf serve` configs.

TF-Agents' specs are TF's `BoundedTensorSpec` (a `Trajectory`'s discount), and TF-Agents compares a table's
signature with `==` (`rlds_to_reverb.push_rlds_to_reverb`), which holds only between specs of the same class
and bounds. dm-reverb's client decodes the signature with TF's coder, which gives `BoundedTensorSpec`s back.
"""
import re

import pytest
import tensorflow as tf
from tensorflow.python.framework import tensor_spec  # the oracle's class  # pylint: disable=g-direct-tensorflow-import

import proc_testlib
import replay_tf as reverb
from replay_tf import cli

Bounded = tensor_spec.BoundedTensorSpec

SIGNATURE = {"discount": Bounded([None], tf.float32, 0.0, 1.0, name="discount"),
             "action": Bounded([None], tf.int64, -2, 5), "obs": tf.TensorSpec([None, 2], tf.float32, "obs")}


def _assert_same_specs(got, want):
    assert got == want, (got, want)
    for g, w in zip(tf.nest.flatten(got), tf.nest.flatten(want)):
        assert type(g) is type(w), (g, w)


@pytest.fixture(scope="module")
def server():
    server = reverb.Server([reverb.Table.queue("q", 4, signature=SIGNATURE)])
    yield server
    server.stop()


def test_grpc_server_info_keeps_bounded_specs(server):
    client = proc_testlib.remote_client(f"localhost:{server.port}")  # gRPC, not the in-process shortcut
    _assert_same_specs(client.server_info()["q"].signature, SIGNATURE)


@pytest.mark.parametrize("leaf, expected", [
    ({"shape": [None], "dtype": "float32", "name": "discount", "minimum": 0.0, "maximum": 1.0},
     Bounded([None], tf.float32, 0.0, 1.0, name="discount")),
    ({"shape": [2], "dtype": "int64", "minimum": [0, -1], "maximum": 3}, Bounded([2], tf.int64, [0, -1], 3)),
    ({"shape": [2], "dtype": "int64"}, tf.TensorSpec([2], tf.int64)),
])
def test_config_leaves_with_bounds_are_bounded_specs(leaf, expected):
    [table] = cli.build_tables({"tables": [{"name": "q", "queue": 2, "signature": {"x": leaf}}]})
    _assert_same_specs(table.info.signature, {"x": expected})


def test_config_leaf_with_one_bound_is_refused():
    config = {"tables": [{"name": "q", "queue": 2, "signature": {"x": {"dtype": "float32", "minimum": 0.0}}}]}
    with pytest.raises(cli.ConfigError, match=re.escape("tables[0].signature.x: invalid tensor spec") +
                       ".*'minimum' needs the other bound too"):
        cli.build_tables(config)


_PEER_CLIENT = '''
import reverb
from tensorflow.python.framework import tensor_spec
import tensorflow as tf
signature = reverb.Client(INPUTS["address"]).server_info()["q"].signature
Bounded = tensor_spec.BoundedTensorSpec
emit("types", {k: type(v).__name__ for k, v in signature.items()})
emit("equal", signature == {"discount": Bounded([None], tf.float32, 0.0, 1.0, name="discount"),
                            "action": Bounded([None], tf.int64, -2, 5),
                            "obs": tf.TensorSpec([None, 2], tf.float32, "obs")})
'''


@pytest.mark.peer
def test_dm_reverb_client_reads_our_bounded_specs(peer, server):
    out = peer.run(_PEER_CLIENT, {"address": f"localhost:{server.port}"}, timeout_s=300)
    assert out["types"] == {"action": "BoundedTensorSpec", "discount": "BoundedTensorSpec", "obs": "TensorSpec"}
    assert out["equal"] is True
