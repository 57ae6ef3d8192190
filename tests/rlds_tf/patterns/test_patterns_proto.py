"""patterns.proto: wire layout and config round trips against dm-reverb 0.14's `reverb.cc.patterns_pb2`."""
import pathlib
import textwrap
import warnings

import numpy as np
import pytest
import tensorflow as tf
from google.protobuf import descriptor_pb2

from rlds_tf import patterns
from rlds_tf.patterns import patterns_pb2

_PB2_PATH = pathlib.Path(patterns_pb2.__file__).resolve()

_SPEC = {"obs": tf.TensorSpec([2], tf.float32), "act": tf.TensorSpec([], tf.int64),
         "td": tf.TensorSpec([], tf.float32), "flag": tf.TensorSpec([], tf.bool)}

# Snippets building configs with `sw` (Reverb's structured_writer, or rlds_tf.patterns), `ref`, `C`, `spec`.
CONFIGS = [
    "sw.create_config({'o': ref['obs'][-2], 'next': ref['obs'][-1]}, 'transitions')",
    "sw.create_config([ref['obs'][-3:], ref['act'][-4:-1:2]], 'seq', conditions=[C.step_index() % 2 == 0, "
    "C.steps_since_applied() >= 3, C.data(spec)['flag'] != 1, C.step_index() < 7])",
    "sw.create_config((ref['td'][-2:],), 't', conditions=[C.is_end_episode(), C.data(spec)['act'] <= 4],"
    " priority=sw.td_error(0.25, spec, lambda s: s['td']))",
    "sw.create_config({'a': {'b': ref['act'][-1]}}, 't', priority=sw.constant_priority_fn(2.5),"
    " conditions=[C.step_index() > 1])",
]


def _ours():
    scope = dict(sw=patterns, ref=patterns.create_reference_step(_SPEC), C=patterns.Condition, spec=_SPEC)
    return [eval(c, scope) for c in CONFIGS]  # pylint: disable=eval-used


_PEER_CODE = """
import importlib.util, subprocess, sys, textwrap
import tensorflow as tf
from reverb import structured_writer as sw
from reverb.cc import patterns_pb2
from google.protobuf import descriptor_pb2
C = sw.Condition
spec = {'obs': tf.TensorSpec([2], tf.float32), 'act': tf.TensorSpec([], tf.int64),
        'td': tf.TensorSpec([], tf.float32), 'flag': tf.TensorSpec([], tf.bool)}
ref = sw.create_reference_step(spec)
fd = descriptor_pb2.FileDescriptorProto()
patterns_pb2.DESCRIPTOR.CopyToProto(fd)
emit('descriptor', np.frombuffer(fd.SerializeToString(), np.uint8))
for i, code in enumerate(INPUTS['configs']):
    config = eval(code)
    emit(f'config/{i}', np.frombuffer(config.SerializeToString(), np.uint8))
    ours = patterns_pb2.StructuredWriterConfig.FromString(INPUTS[f'ours/{i}'].tobytes())
    emit(f'same/{i}', ours == config)
# Our generated module on protobuf 4.25 (TF 2.15), in a fresh interpreter without reverb's descriptors.
check = textwrap.dedent('''
    import importlib.util, sys, warnings
    import tensorflow.core.protobuf.struct_pb2
    import google.protobuf
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        spec = importlib.util.spec_from_file_location('ours_pb2', sys.argv[1])
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    assert not caught, [str(w.message) for w in caught]
    c = module.StructuredWriterConfig(table='t')
    c.flat.add(flat_source_index=1, start=-2)
    print(google.protobuf.__version__, c.SerializeToString().hex())
''')
proc = subprocess.run([sys.executable, '-c', check, INPUTS['pb2_path']], capture_output=True, text=True)
emit('load_425', [proc.returncode, proc.stdout.strip(), proc.stderr[-2000:]])
"""


@pytest.fixture(scope="module")
def peer_out(peer):
    inputs = {"configs": CONFIGS, "pb2_path": str(_PB2_PATH)}
    for i, config in enumerate(_ours()):
        inputs[f"ours/{i}"] = np.frombuffer(config.to_proto().SerializeToString(), np.uint8)
    return peer.run(textwrap.dedent(_PEER_CODE), inputs)


def _layout(fd: descriptor_pb2.FileDescriptorProto) -> dict:
    def message(m, prefix=""):
        out = {}
        name = prefix + m.name
        out[name] = sorted((f.name, f.number, f.type, f.label, f.type_name.split(".")[-1],
                            m.oneof_decl[f.oneof_index].name if f.HasField("oneof_index") else None)
                           for f in m.field)
        for nested in m.nested_type:
            out.update(message(nested, name + "."))
        return out
    layout = {}
    for m in fd.message_type:
        layout.update(message(m))
    return layout


@pytest.mark.peer
def test_wire_layout_matches_reverb(peer_out):
    theirs = descriptor_pb2.FileDescriptorProto.FromString(peer_out["descriptor"].tobytes())
    ours = descriptor_pb2.FileDescriptorProto()
    patterns_pb2.DESCRIPTOR.CopyToProto(ours)
    assert ours.package == theirs.package == "deepmind.reverb"
    assert list(ours.dependency) == list(theirs.dependency) == ["tensorflow/core/protobuf/struct.proto"]
    assert _layout(ours) == _layout(theirs)


@pytest.mark.peer
@pytest.mark.parametrize("index", range(len(CONFIGS)))
def test_reverb_configs_read_as_ours_and_back(peer_out, index):
    ours = _ours()[index]
    theirs = patterns.StructuredWriterConfig.from_proto(peer_out[f"config/{index}"].tobytes())
    assert theirs == ours
    assert peer_out[f"same/{index}"] is True  # Reverb parses our bytes into a config equal to its own


@pytest.mark.peer
def test_generated_code_loads_on_protobuf_4_25(peer_out):
    returncode, stdout, stderr = peer_out["load_425"]
    assert returncode == 0, stderr
    assert stdout.startswith("4.25"), stdout


def test_generated_code_loads_without_warnings_here():
    import importlib.util
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        spec = importlib.util.spec_from_file_location("patterns_pb2_copy", _PB2_PATH)
        source = _PB2_PATH.read_text()
        assert "ValidateProtobufRuntimeVersion" not in source  # no runtime-version gate
        module = importlib.util.module_from_spec(spec)
        del module
    assert not caught


@pytest.mark.parametrize("index", range(len(CONFIGS)))
def test_round_trip_through_proto(index):
    config = _ours()[index]
    proto = config.to_proto()
    assert patterns.StructuredWriterConfig.from_proto(proto) == config
    assert patterns.StructuredWriterConfig.from_proto(proto.SerializeToString()) == config
    assert patterns.as_config(proto) == config
