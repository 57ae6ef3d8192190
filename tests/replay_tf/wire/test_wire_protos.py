"""Our deepmind.reverb protos against the descriptors shipped in the dm-reverb 0.14 wheel.

The wheel ships `schema_pb2.py`, `patterns_pb2.py` and `checkpoint_pb2.py`; `reverb_service.proto` only
exists compiled into `libreverb_service_cc_proto.so`, whose embedded serialized FileDescriptorProto we
read back. Every message, field (name, number, type, label, message type, oneof, options), reserved range
and service method must be identical. The peer process also imports our generated code under protobuf
4.25 with warnings as errors, which is the oldest runtime we support (TF 2.16).
"""
import base64
import pathlib

import pytest
from google.protobuf import descriptor_pb2

from replay_tf.wire import checkpoint_pb2
from replay_tf.wire import reverb_service_pb2
from replay_tf.wire import schema_pb2

from proc_testlib import ROOT

REPO = pathlib.Path(ROOT)
PATTERNS_PB2 = REPO / "rlds_tf" / "patterns" / "patterns_pb2.py"

# Reverb's proto file -> our generated module path (relative to the repository root).
OURS = {
    "reverb/cc/schema.proto": "replay_tf/wire/schema_pb2.py",
    "reverb/cc/reverb_service.proto": "replay_tf/wire/reverb_service_pb2.py",
    "reverb/cc/checkpointing/checkpoint.proto": "replay_tf/wire/checkpoint_pb2.py",
    "reverb/cc/patterns.proto": "rlds_tf/patterns/patterns_pb2.py",
}

_PEER_CODE = r'''
import ast, base64, glob, importlib, os, site, sys, types, warnings
# TF and protobuf first, outside the warning filter: their own import-time noise is not under test.
from google.protobuf import timestamp_pb2
from tensorflow.core.framework import tensor_pb2
from tensorflow.core.protobuf import struct_pb2

repo = INPUTS["repo"]
# Import our generated modules without running our packages' __init__ (which need TF >= 2.16).
for package in ("replay_tf", "replay_tf.wire", "rlds_tf", "rlds_tf.patterns"):
    module = types.ModuleType(package)
    module.__path__ = [os.path.join(repo, *package.split("."))]
    sys.modules[package] = module
with warnings.catch_warnings():
    warnings.simplefilter("error")
    for name in INPUTS["ours"]:
        module = importlib.import_module(name)
        emit("ours:" + module.DESCRIPTOR.name, base64.b64encode(module.DESCRIPTOR.serialized_pb).decode())

import google.protobuf
emit("protobuf_version", google.protobuf.__version__)
reverb_dir = next(d for d in site.getsitepackages() if os.path.isdir(os.path.join(d, "reverb")))
reverb_dir = os.path.join(reverb_dir, "reverb")
emit("reverb_dir", reverb_dir)
# The wheel's *_pb2.py hold the serialized file in an AddSerializedFile(b"...") literal: read it without
# executing the module (its symbols would clash with ours in this process's default pool).
for rel in ("cc/schema_pb2.py", "cc/patterns_pb2.py", "cc/checkpointing/checkpoint_pb2.py"):
    tree = ast.parse(open(os.path.join(reverb_dir, rel)).read())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "AddSerializedFile":
            emit("reverb:" + rel, base64.b64encode(node.args[0].value).decode())
'''


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def _embedded_file_descriptor(library: bytes, proto_name: str) -> descriptor_pb2.FileDescriptorProto:
    """The serialized FileDescriptorProto that protoc's C++ output embeds in a shared library."""
    name = proto_name.encode()
    start = library.find(b"\n" + bytes([len(name)]) + name)  # field 1 (name), length-delimited
    assert start >= 0, f"{proto_name} is not embedded in the library"
    pos = start
    # Walk top-level fields of FileDescriptorProto (numbers 1..14, varint or length-delimited) until the
    # bytes stop looking like one: that is the end of the embedded array.
    while pos < len(library):
        tag, after = _read_varint(library, pos)
        field, wire_type = tag >> 3, tag & 7
        if not 1 <= field <= 14 or wire_type not in (0, 2):
            break
        length, after = _read_varint(library, after)
        pos = after + (length if wire_type == 2 else 0)
    return descriptor_pb2.FileDescriptorProto.FromString(library[start:pos])


def _normalize(file_proto: descriptor_pb2.FileDescriptorProto) -> dict:
    """name -> message/service descriptor, without what differs legitimately (file names, comments)."""
    out = {}

    def visit(message: descriptor_pb2.DescriptorProto, prefix: str):
        message = descriptor_pb2.DescriptorProto.FromString(message.SerializeToString())
        # Declaration order has no wire effect: compare fields by number.
        fields = sorted(message.field, key=lambda field: field.number)
        message.ClearField("field")
        for field in fields:
            field.ClearField("json_name")
            message.field.add().CopyFrom(field)
        nested = list(message.nested_type)
        message.ClearField("nested_type")
        out[f"message {prefix}{message.name}"] = message
        for child in nested:
            visit(child, f"{prefix}{message.name}.")

    for message in file_proto.message_type:
        visit(message, f"{file_proto.package}.")
    for enum in file_proto.enum_type:
        out[f"enum {file_proto.package}.{enum.name}"] = enum
    for service in file_proto.service:
        out[f"service {file_proto.package}.{service.name}"] = service
    return out


# rl-data-tf's additions to Reverb's protocol (field numbers from 1000, and the messages only they use):
# Reverb peers ignore them (proto3 keeps unknown fields), so they must be the only difference.
_EXTENSIONS = {"replay_tf/wire/reverb_service.proto": {
    "message deepmind.reverb.StackedSamples",
    "field deepmind.reverb.SampleStreamRequest.replay_tf_stacked = 1000",
    "field deepmind.reverb.SampleStreamResponse.replay_tf_stacked = 1000",
    "message deepmind.reverb.SharedMemoryRing",
    "message deepmind.reverb.SharedSlot",
    "field deepmind.reverb.SampleStreamRequest.replay_tf_shared_memory = 1001",
    "field deepmind.reverb.SampleStreamResponse.replay_tf_shared_slot = 1001",
}}


_EXTENSION_MESSAGES = {name for name in _EXTENSIONS["replay_tf/wire/reverb_service.proto"] if name.startswith("message ")}


def _without_extensions(normalized: dict) -> set:
    """Removes rl-data-tf's extensions from `_normalize`'s result; returns what it removed."""
    removed = set()
    for name in [n for n in normalized if n in _EXTENSION_MESSAGES]:
        del normalized[name]
        removed.add(name)
    for name, message in normalized.items():
        if not name.startswith("message "):
            continue
        extensions = [f for f in message.field if f.number >= 1000]
        for field in extensions:
            removed.add(f"field {name[len('message '):]}.{field.name} = {field.number}")
        if extensions:
            kept = [f for f in message.field if f.number < 1000]
            message.ClearField("field")
            for field in kept:
                message.field.add().CopyFrom(field)
    return removed


@pytest.fixture(scope="module")
def peer_descriptors(peer):
    ours = ["replay_tf.wire.schema_pb2", "replay_tf.wire.reverb_service_pb2", "replay_tf.wire.checkpoint_pb2"]
    if PATTERNS_PB2.exists():
        ours.append("rlds_tf.patterns.patterns_pb2")
    out = peer.run(_PEER_CODE, {"repo": str(REPO), "ours": ours}, timeout_s=180)
    reverb = {}
    for key, value in out.items():
        if key.startswith("reverb:"):
            file_proto = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(value))
            reverb[file_proto.name] = file_proto
    library = pathlib.Path(out["reverb_dir"], "libreverb_service_cc_proto.so").read_bytes()
    reverb["reverb/cc/reverb_service.proto"] = _embedded_file_descriptor(library, "reverb/cc/reverb_service.proto")
    ours_loaded = {key[len("ours:"):]: descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(value))
                   for key, value in out.items() if key.startswith("ours:")}
    return reverb, ours_loaded, out["protobuf_version"]


@pytest.mark.peer
@pytest.mark.parametrize("reverb_file", sorted(OURS))
def test_layout_matches_reverb_wheel(peer_descriptors, reverb_file):
    reverb, ours_loaded, _ = peer_descriptors
    our_file = OURS[reverb_file].replace("_pb2.py", ".proto")
    if our_file not in ours_loaded:
        pytest.skip(f"{our_file} is not generated yet")
    theirs, ours = _normalize(reverb[reverb_file]), _normalize(ours_loaded[our_file])
    assert _without_extensions(ours) == _EXTENSIONS.get(our_file, set())
    assert sorted(ours) == sorted(theirs), f"{our_file}: definitions differ from {reverb_file}"
    for name, expected in theirs.items():
        assert ours[name] == expected, f"{our_file}: {name} differs:\nours:\n{ours[name]}\nreverb:\n{expected}"


@pytest.mark.peer
def test_generated_code_loads_on_old_protobuf(peer_descriptors):
    _, ours_loaded, protobuf_version = peer_descriptors
    assert protobuf_version.startswith("4."), protobuf_version
    assert {"replay_tf/wire/schema.proto", "replay_tf/wire/reverb_service.proto",
            "replay_tf/wire/checkpoint.proto"} <= set(ours_loaded)


def test_generated_code_is_up_to_date_with_sources():
    # The serialized descriptor in each *_pb2.py must describe the .proto beside it: compare field
    # numbers parsed from the source text with the loaded descriptor (catches a forgotten regeneration).
    import re
    for module in (schema_pb2, reverb_service_pb2, checkpoint_pb2):
        source = (REPO / module.DESCRIPTOR.name).read_text()
        declared = set(re.findall(r"^\s*(?:repeated\s+)?[\w.]+\s+(\w+)\s*=\s*(\d+)", source, re.M))
        loaded = set()

        def visit(message):
            loaded.update((field.name, str(field.number)) for field in message.fields)
            for nested in message.nested_types:
                visit(nested)

        for message in module.DESCRIPTOR.message_types_by_name.values():
            visit(message)
        assert declared == loaded, f"{module.DESCRIPTOR.name}: regenerate with replay_tf/wire/regenerate_protos.sh"


def test_service_methods_and_file_names_do_not_collide():
    service = reverb_service_pb2.DESCRIPTOR.services_by_name["ReverbService"]
    assert service.full_name == "deepmind.reverb.ReverbService"
    assert [m.name for m in service.methods] == [
        "Checkpoint", "InsertStream", "MutatePriorities", "Reset", "SampleStream", "ServerInfo",
        "InitializeConnection"]
    names = {schema_pb2.DESCRIPTOR.name, reverb_service_pb2.DESCRIPTOR.name, checkpoint_pb2.DESCRIPTOR.name}
    assert all(name.startswith("replay_tf/wire/") for name in names)


def test_generated_code_has_no_runtime_version_check():
    # protobuf >= 5.26 gencode pins a minimum runtime and warns across majors; ours must load on 4.25..7.x.
    for module in (schema_pb2, reverb_service_pb2, checkpoint_pb2):
        text = pathlib.Path(module.__file__).read_text()
        assert "ValidateProtobufRuntimeVersion" not in text, f"{module.__name__} has a runtime-version check"
