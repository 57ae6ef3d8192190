"""rlds_tf.structure_coder against TF's private `nested_structure_coder`, here (TF 2.21) and in the peer (TF 2.15).

`_CASES` runs unchanged in both interpreters and fills `CASES[name] = nest`; the oracle is each TF's own
`nested_structure_coder.encode_structure` (tests may reach into TF; the package may not), compared byte for
byte with our `encode_structure`. One peer process serializes every case.
"""
import collections
import doctest
import pathlib
import re

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import struct_pb2
from tensorflow.python.saved_model import nested_structure_coder  # the oracle  # pylint: disable=g-direct-tensorflow-import

from rlds_tf import nests
from rlds_tf import structure_coder as coder

_CASES = r'''
import collections
import tensorflow as tf
from tensorflow.python.framework import tensor_spec  # BoundedTensorSpec (TF-Agents' specs are these)

Point = collections.namedtuple('Point', ['x', 'y'])
Empty = collections.namedtuple('Empty', [])
Bounded = tensor_spec.BoundedTensorSpec

CASES = {
    'none': None,
    'bools': (True, False),
    'ints': [0, 1, -1, 2**63 - 1, -2**63],
    'floats': [0.0, -1.5, float('inf'), 1e300, 5e-324],
    'strings': ['', 'a', 'ünïcode ✓'],
    'empties': [[], (), {}, Empty()],
    'nested': {'b': [1, (2, None)], 'a': {'z': 1.5, 'y': 's'}},
    'dict_reversed_keys': {f'k{i}': i for i in reversed(range(40))},
    'ordered_dict': collections.OrderedDict([('z', 1), ('a', 2)]),
    'namedtuple': Point(x=1, y=Point(x=tf.TensorSpec([2], tf.float32), y=None)),
    'shapes': (tf.TensorShape(None), tf.TensorShape([]), tf.TensorShape([None, 3]), tf.TensorShape([0])),
    'dtypes': [tf.float32, tf.float64, tf.int8, tf.int64, tf.uint16, tf.bool, tf.string, tf.bfloat16,
               tf.complex64, tf.half],
    'specs': [tf.TensorSpec([2, 3], tf.float32), tf.TensorSpec([], tf.string, 's'),
              tf.TensorSpec(None, tf.int32, 'unknown_rank'), tf.TensorSpec([None, 4], tf.uint8, '')],
    'bounded': (Bounded([], tf.int32, 0, 3), Bounded([2], tf.float32, [-1.0, 0.0], 1.0, name='a'),
                Bounded([2, 2], tf.int64, -5, [[1, 2], [3, 4]], 'b'), Bounded([], tf.bool, False, True)),
    'reverb_signature': {
        'observation': {'pixels': tf.TensorSpec([None, 84, 84, 3], tf.uint8, 'observation/pixels'),
                        'state': tf.TensorSpec([None, 10, 5], tf.float32, 'observation/state')},
        'action': tf.TensorSpec([None], tf.int64, 'action'),
        'reward': tf.TensorSpec([None], tf.float64, 'reward'),
    },
    'pattern_structure': {'o': None, 'next': [None, (None,)], 'meta': Point(x=None, y=None)},
}
'''

_PEER = _CASES + r'''
import sys
import types
from tensorflow.python.saved_model import nested_structure_coder
for name, source in (('rlds_tf', ''), ('rlds_tf.nests', INPUTS['nests_source'])):  # the coder's one import of ours
    sys.modules[name] = types.ModuleType(name)
    exec(source, sys.modules[name].__dict__)
ours = types.ModuleType('structure_coder')
exec(INPUTS['coder_source'], ours.__dict__)  # our module, run on TF 2.15 and its protobuf runtime
emit('theirs', {name: nested_structure_coder.encode_structure(nest).SerializeToString().hex()
                for name, nest in CASES.items()})
emit('ours', {name: ours.encode_structure(nest).SerializeToString().hex() for name, nest in CASES.items()})
'''


def _cases():
    scope = {}
    exec(_CASES, scope)  # pylint: disable=exec-used
    return scope["CASES"]


CASES = _cases()
_NAMES = sorted(CASES)


def _plain(nest):
    """What decoding gives back: dict keys sorted, unnamed specs named None, bounded specs with their bounds."""
    if isinstance(nest, tf.TensorSpec) and hasattr(nest, "minimum"):
        return type(nest)(nest.shape, nest.dtype, nest.minimum, nest.maximum, name=nest.name or None)
    if isinstance(nest, tf.TensorSpec):
        return tf.TensorSpec(nest.shape, nest.dtype, nest.name or None)
    if isinstance(nest, collections.abc.Mapping):
        return {k: _plain(nest[k]) for k in sorted(nest)}
    if isinstance(nest, tuple) and hasattr(nest, "_fields"):
        return type(nest)(*(_plain(v) for v in nest))
    if isinstance(nest, (list, tuple)):
        return type(nest)(_plain(v) for v in nest)
    return nest


def _assert_same_nest(got, want, path="<root>"):
    """Equal values, and equal types all the way down (namedtuples: same name and fields; dicts: key order)."""
    if isinstance(want, tuple) and hasattr(want, "_fields"):
        assert type(got).__name__ == type(want).__name__ and got._fields == want._fields, path
    else:
        assert type(got) is type(want), f"{path}: {type(got)} != {type(want)}"
    if isinstance(want, dict):
        assert list(got) == list(want), path
        for k in want:
            _assert_same_nest(got[k], want[k], f"{path}/{k}")
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), path
        for i, (g, w) in enumerate(zip(got, want)):
            _assert_same_nest(g, w, f"{path}/{i}")
    else:
        assert got == want, f"{path}: {got!r} != {want!r}"


@pytest.fixture(scope="module")
def peer_encoded(peer):
    out = peer.run(_PEER, {"coder_source": pathlib.Path(coder.__file__).read_text(),
                           "nests_source": pathlib.Path(nests.__file__).read_text()})
    return {side: {name: bytes.fromhex(h) for name, h in out[side].items()} for side in ("theirs", "ours")}


@pytest.mark.parametrize("name", _NAMES)
def test_bytes_match_installed_tf(name):
    want = nested_structure_coder.encode_structure(CASES[name]).SerializeToString()
    assert coder.encode_structure(CASES[name]).SerializeToString() == want


@pytest.mark.peer
@pytest.mark.parametrize("name", _NAMES)
def test_bytes_match_tf_2_15(peer_encoded, name):
    # On TF 2.15 and its protobuf runtime (4.25), our module writes what TF 2.15's coder writes.
    assert peer_encoded["ours"][name] == peer_encoded["theirs"][name]
    # Across runtimes the bytes agree up to the order of map entries, which each protobuf runtime picks
    # (upb's hash order changed after 4.25): deterministic serialization sorts them.
    ours = coder.encode_structure(CASES[name]).SerializeToString(deterministic=True)
    theirs = struct_pb2.StructuredValue.FromString(peer_encoded["theirs"][name])
    assert ours == theirs.SerializeToString(deterministic=True)


@pytest.mark.peer
@pytest.mark.parametrize("name", _NAMES)
def test_decodes_tf_2_15_bytes(peer_encoded, name):
    _assert_same_nest(coder.decode_structure(peer_encoded["theirs"][name]), _plain(CASES[name]))


@pytest.mark.parametrize("name", _NAMES)
def test_decode_matches_installed_tf(name):
    proto = nested_structure_coder.encode_structure(CASES[name])
    ours = coder.decode_structure(proto)
    theirs = nested_structure_coder.decode_proto(proto)
    _assert_same_nest(ours, _plain(theirs))
    # Decoding loses nothing but dict order: re-encoding the sorted nest is stable.
    assert coder.decode_structure(coder.encode_structure(ours)) == ours


def test_decode_accepts_foreign_protos_and_bytes():
    proto = coder.encode_structure({"a": (1, None)})
    assert coder.decode_structure(proto.SerializeToString()) == {"a": (1, None)}

    class Foreign:  # e.g. a StructuredValue from Reverb's descriptor pool
        def SerializeToString(self):  # noqa: N802
            return proto.SerializeToString()
    assert coder.decode_structure(Foreign()) == {"a": (1, None)}


def test_decoded_namedtuples_share_a_type():
    point = collections.namedtuple("Point", ["x", "y"])
    a = coder.decode_structure(coder.encode_structure(point(1, 2)))
    b = coder.decode_structure(coder.encode_structure([point(3, 4)]))[0]
    assert type(a) is type(b) and a._fields == ("x", "y") and type(a).__name__ == "Point"


def test_bounded_spec_bounds_stay_in_the_proto():
    from tensorflow.python.framework import tensor_spec  # pylint: disable=g-direct-tensorflow-import
    spec = tensor_spec.BoundedTensorSpec([2], tf.float32, [-1.0, 0.0], 1.0, name="a")
    proto = coder.encode_structure(spec)
    np.testing.assert_array_equal(tf.make_ndarray(proto.bounded_tensor_spec_value.minimum), [-1.0, 0.0])
    np.testing.assert_array_equal(tf.make_ndarray(proto.bounded_tensor_spec_value.maximum), [1.0, 1.0])
    # Decoded as TF's coder decodes it (TF-Agents compares signatures with ==, which needs the same class).
    decoded = coder.decode_structure(proto)
    assert type(decoded) is tensor_spec.BoundedTensorSpec and decoded == spec
    np.testing.assert_array_equal(decoded.minimum, [-1.0, 0.0])
    assert decoded != tf.TensorSpec([2], tf.float32, "a")


@pytest.mark.parametrize("nest,error,match", [
    ({"a": [1, np.int64(2)]}, TypeError, r"leaf at a/1: .*2.* of type numpy\.int64"),
    ((b"bytes",), TypeError, r"leaf at 0: b'bytes' of type builtins\.bytes; supported: None, bool"),
    (object(), TypeError, r"leaf at <root>: .* of type builtins\.object"),
    ({"r": tf.RaggedTensorSpec([None, None], tf.int32)}, TypeError, r"leaf at r: .* is a RaggedTensorSpec"),
    ({"a": {1: None}}, TypeError, r"mapping at a has key 1 of type int; StructuredValue dicts need str keys"),
    ([2**63], ValueError, r"int at 0 \(9223372036854775808\) does not fit in 64 bits"),
    (tf.constant(1), TypeError, r"leaf at <root>: .*EagerTensor"),
])
def test_encode_rejects_unsupported_leaves(nest, error, match):
    with pytest.raises(error, match=match):
        coder.encode_structure(nest)


def test_decode_rejects_unsupported_fields():
    proto = struct_pb2.StructuredValue()
    proto.list_value.values.add().type_spec_value.type_spec_class_name = "Foo"
    with pytest.raises(TypeError, match=re.escape("StructuredValue at 0: field 'type_spec_value' is not")):
        coder.decode_structure(proto)


def test_doctests():
    result = doctest.testmod(coder)
    assert result.attempted > 0 and result.failed == 0
