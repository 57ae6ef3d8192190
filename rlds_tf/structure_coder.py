"""Nests of specs and Python scalars <-> `tensorflow.StructuredValue`, on public APIs only.

Reverb stores table signatures and pattern structures as `tensorflow.StructuredValue` protos written by
TF's private `nested_structure_coder`. This module writes the same bytes for the values those protos hold
in practice, using only the public proto module `tensorflow.core.protobuf.struct_pb2` and public TF
calls (`TensorShape.as_proto`, `DType.as_datatype_enum`, `tf.make_tensor_proto`):

| Python value                                  | `StructuredValue` field      | decoded as                      |
|-----------------------------------------------|------------------------------|---------------------------------|
| `None`                                        | `none_value`                 | `None`                          |
| `bool`                                        | `bool_value`                 | `bool`                          |
| `int` (not bool, 64 bit)                      | `int64_value`                | `int`                           |
| `float`                                       | `float64_value`              | `float`                         |
| `str`                                         | `string_value`               | `str`                           |
| `list`                                        | `list_value`                 | `list`                          |
| `tuple`                                       | `tuple_value`                | `tuple`                         |
| `collections.abc.Mapping` (str keys)          | `dict_value`                 | `dict`, keys sorted             |
| namedtuple                                    | `named_tuple_value`          | namedtuple of same name, fields |
| `tf.TensorShape`                              | `tensor_shape_value`         | `tf.TensorShape`                |
| `tf.DType`                                    | `tensor_dtype_value`         | `tf.DType`                      |
| `tf.TensorSpec`                               | `tensor_spec_value`          | `tf.TensorSpec`                 |
| `tf.TensorSpec` with `minimum` and `maximum`  | `bounded_tensor_spec_value`  | TF's `BoundedTensorSpec`        |
|   (TF's and TF-Agents' `BoundedTensorSpec`)   |                              |                                 |

Mappings are written in their iteration order, as TF does (protobuf keeps a map's insertion order on the
wire, so sorting would change the bytes); decoding returns a `dict` with its keys sorted, the order
`tf.nest` flattens it in. Bounded specs decode to TF's `BoundedTensorSpec` with their bounds, as TF's coder
(and so dm-reverb's `server_info`) gives them: TF-Agents' specs are of that class and TF-Agents compares
signatures with `==`, which holds only between specs of the same class (`rlds_to_reverb.push_rlds_to_reverb`
checks a table's signature that way). TF exports no name for that class; it is taken as the subclass of
`tf.TensorSpec` named `BoundedTensorSpec` (a TF without one decodes bounded specs to a plain `tf.TensorSpec`).
Other leaves (numpy scalars other than `np.float64`, bytes, other `tf.TypeSpec`s, ...) raise `TypeError` naming
their path.

>>> proto = encode_structure({'obs': tf.TensorSpec([2], tf.float32, 'obs'), 'n': (1, None)})
>>> proto.dict_value.fields['obs'].tensor_spec_value.dtype == tf.float32.as_datatype_enum
True
>>> decode_structure(proto)
{'n': (1, None), 'obs': TensorSpec(shape=(2,), dtype=tf.float32, name='obs')}
"""
from __future__ import annotations

import collections
import collections.abc
import functools
from typing import Any

import tensorflow as tf
from tensorflow.core.protobuf import struct_pb2

from rlds_tf.nests import format_path

_SUPPORTED = ("None, bool, int, float, str, list, tuple, namedtuple, Mapping with str keys, tf.TensorShape, "
              "tf.DType, tf.TensorSpec (bounded or not)")


def _is_named_tuple(value: Any) -> bool:
    # The test TF's coder uses: a tuple with a `_fields` sequence of strings.
    fields = getattr(value, "_fields", None)
    return (isinstance(value, tuple) and isinstance(fields, collections.abc.Sequence)
            and all(isinstance(f, str) for f in fields))


def _is_bounded_spec(value: Any) -> bool:
    return isinstance(value, tf.TensorSpec) and hasattr(value, "minimum") and hasattr(value, "maximum")


def _encoded(value: Any, path: tuple) -> struct_pb2.StructuredValue:
    """`value` as a new message, which the caller copies into its slot.

    As TF's coder builds every element apart and copies it in: the order of a map's entries on the wire
    is the protobuf runtime's, and follows how the map was built (a copied map may list its entries in
    another order than the one it was copied from), so only the same steps give the same bytes.
    """
    out = struct_pb2.StructuredValue()
    _encode_into(out, value, path)
    return out


def _encode_into(out: struct_pb2.StructuredValue, value: Any, path: tuple) -> None:
    """Writes `value` into `out`, checking types in the order TF's coder does (most specific first)."""
    if _is_bounded_spec(value):
        spec = out.bounded_tensor_spec_value
        spec.shape.CopyFrom(value.shape.as_proto())
        spec.dtype = value.dtype.as_datatype_enum
        if value.name:
            spec.name = value.name
        spec.minimum.CopyFrom(tf.make_tensor_proto(value.minimum))
        spec.maximum.CopyFrom(tf.make_tensor_proto(value.maximum))
    elif isinstance(value, tf.TensorSpec):
        spec = out.tensor_spec_value
        spec.shape.CopyFrom(value.shape.as_proto())
        spec.dtype = value.dtype.as_datatype_enum
        if value.name:
            spec.name = value.name
    elif isinstance(value, tf.TensorShape):
        out.tensor_shape_value.CopyFrom(value.as_proto())
    elif isinstance(value, tf.DType):
        out.tensor_dtype_value = value.as_datatype_enum
    elif isinstance(value, collections.abc.Mapping):
        fields = out.dict_value.fields
        out.dict_value.SetInParent()  # an empty mapping is still a dict_value
        for key, item in value.items():  # iteration order, as TF: it decides the bytes
            if not isinstance(key, str):
                raise TypeError(f"mapping at {format_path(path)} has key {key!r} of type {type(key).__name__}; "
                                f"StructuredValue dicts need str keys")
            fields[key].CopyFrom(_encoded(item, path + (key,)))
    elif isinstance(value, tf.TypeSpec):
        raise TypeError(f"cannot encode the leaf at {format_path(path)}: {value!r} is a {type(value).__name__}, "
                        f"not a tf.TensorSpec; supported: {_SUPPORTED}")
    elif isinstance(value, bool):
        out.bool_value = value
    elif value is None:
        out.none_value.SetInParent()
    elif isinstance(value, str):
        out.string_value = value
    elif isinstance(value, int):
        if not -2**63 <= value < 2**63:
            raise ValueError(f"int at {format_path(path)} ({value}) does not fit in 64 bits")
        out.int64_value = value
    elif isinstance(value, float):
        out.float64_value = value
    elif _is_named_tuple(value):
        named = out.named_tuple_value
        named.name = type(value).__name__
        for key, item in zip(value._fields, value):
            named.values.add(key=key).value.CopyFrom(_encoded(item, path + (key,)))
    elif isinstance(value, tuple):
        out.tuple_value.SetInParent()
        for i, item in enumerate(value):
            out.tuple_value.values.add().CopyFrom(_encoded(item, path + (i,)))
    elif isinstance(value, list):
        out.list_value.SetInParent()
        for i, item in enumerate(value):
            out.list_value.values.add().CopyFrom(_encoded(item, path + (i,)))
    else:
        raise TypeError(f"cannot encode the leaf at {format_path(path)}: {value!r} of type "
                        f"{type(value).__module__}.{type(value).__qualname__}; supported: {_SUPPORTED}")


def encode_structure(nest: Any) -> struct_pb2.StructuredValue:
    """Encodes `nest` as a `tensorflow.StructuredValue`, byte for byte as TF's `nested_structure_coder`.

    Args:
      nest: a nest of the values in the module docstring's table.

    Returns:
      The `StructuredValue` proto.

    Raises:
      TypeError: a leaf (or a mapping key) of a type not in the table; the message names its path.
      ValueError: an int outside the 64-bit range.

    >>> encode_structure([None, 2.5]).list_value.values[1].float64_value
    2.5
    """
    out = struct_pb2.StructuredValue()
    _encode_into(out, nest, ())
    return out


@functools.lru_cache(maxsize=None)
def _bounded_spec_type() -> type | None:
    """TF's `BoundedTensorSpec` class: the subclass of `tf.TensorSpec` of that name (TF exports no name for it)."""
    for cls in tf.TensorSpec.__subclasses__():
        if cls.__name__ == "BoundedTensorSpec" and cls.__module__.startswith("tensorflow."):
            return cls
    return None


def bounded_tensor_spec(shape, dtype, minimum, maximum, name=None) -> tf.TensorSpec:
    """TF's (and TF-Agents') `BoundedTensorSpec(shape, dtype, minimum, maximum, name)`.

    Raises:
      TypeError: this TF has no `BoundedTensorSpec` class.
    """
    bounded = _bounded_spec_type()
    if bounded is None:
        raise TypeError(f"this TensorFlow ({tf.__version__}) has no BoundedTensorSpec class (a subclass of "
                        f"tf.TensorSpec of that name); use a spec without minimum and maximum")
    return bounded(shape, dtype, minimum=minimum, maximum=maximum, name=name)


@functools.lru_cache(maxsize=None)
def _named_tuple_type(name: str, fields: tuple) -> type:
    # One type per (name, fields), so that decoding twice gives values of the same type.
    return collections.namedtuple(name, fields)


def _decode(value: struct_pb2.StructuredValue, path: tuple) -> Any:
    kind = value.WhichOneof("kind")
    if kind == "none_value":
        return None
    if kind == "bool_value":
        return value.bool_value
    if kind == "int64_value":
        return int(value.int64_value)
    if kind == "float64_value":
        return value.float64_value
    if kind == "string_value":
        return value.string_value
    if kind == "list_value":
        return [_decode(v, path + (i,)) for i, v in enumerate(value.list_value.values)]
    if kind == "tuple_value":
        return tuple(_decode(v, path + (i,)) for i, v in enumerate(value.tuple_value.values))
    if kind == "dict_value":
        fields = value.dict_value.fields
        return {key: _decode(fields[key], path + (key,)) for key in sorted(fields)}
    if kind == "named_tuple_value":
        pairs = value.named_tuple_value.values
        named_tuple_type = _named_tuple_type(value.named_tuple_value.name, tuple(p.key for p in pairs))
        return named_tuple_type(*(_decode(p.value, path + (p.key,)) for p in pairs))
    if kind == "tensor_shape_value":
        return tf.TensorShape(value.tensor_shape_value)
    if kind == "tensor_dtype_value":
        return tf.dtypes.as_dtype(value.tensor_dtype_value)
    if kind in ("tensor_spec_value", "bounded_tensor_spec_value"):
        spec = getattr(value, kind)
        shape, dtype, name = tf.TensorShape(spec.shape), tf.dtypes.as_dtype(spec.dtype), spec.name or None
        bounded = _bounded_spec_type()
        if kind == "bounded_tensor_spec_value" and bounded is not None:
            return bounded(shape, dtype, minimum=tf.make_ndarray(spec.minimum),
                           maximum=tf.make_ndarray(spec.maximum), name=name)
        return tf.TensorSpec(shape, dtype, name)
    raise TypeError(f"cannot decode the StructuredValue at {format_path(path)}: field {kind!r} is not supported "
                    f"(supported: the fields for {_SUPPORTED})")


def decode_structure(proto: Any) -> Any:
    """Decodes a `tensorflow.StructuredValue` (or its serialized bytes) into a nest.

    Args:
      proto: a `StructuredValue`, from any descriptor pool (e.g. Reverb's), or its serialized bytes.

    Returns:
      The nest: see the module docstring's table (dicts with sorted keys; bounded specs with their bounds).

    Raises:
      TypeError: a field this module does not decode (e.g. `type_spec_value`); the message names its path.

    >>> decode_structure(encode_structure((None, [1, 'a'])))
    (None, [1, 'a'])
    """
    if isinstance(proto, bytes):
        proto = struct_pb2.StructuredValue.FromString(proto)
    elif not isinstance(proto, struct_pb2.StructuredValue):
        # A StructuredValue from another descriptor pool: re-read its bytes.
        proto = struct_pb2.StructuredValue.FromString(proto.SerializeToString())
    return _decode(proto, ())
