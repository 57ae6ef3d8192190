#!/usr/bin/env bash
# Regenerates the committed *_pb2.py files of rl-data-tf from their .proto sources:
#   replay_tf/wire/{schema,reverb_service,checkpoint}.proto, rlds_tf/patterns/patterns.proto and
#   replay_tf/server_executable/reverb_config.proto.
#
# Usage (from anywhere): bash replay_tf/wire/regenerate_protos.sh
#
# Why this way:
# - protoc comes from grpcio-tools 1.62 (protobuf 4.25-era gencode) in a scratch venv, so the generated
#   code carries no runtime-version check and loads without warnings on protobuf 4.25 (TF 2.16) through
#   protobuf 7.x (TF 2.21).
# - TF's wheel ships *_pb2.py but not always the .proto sources, so the imports
#   tensorflow/core/framework/tensor.proto and tensorflow/core/protobuf/struct.proto (and
#   google/protobuf/timestamp.proto) are resolved from a descriptor set built from the DESCRIPTORs of
#   the modules TF itself loads. Our files keep their repository paths as proto names
#   (replay_tf/wire/schema.proto, ...), so they never collide with TF's or Reverb's in the default pool.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PYTHON="${PYTHON:-python}"                      # an interpreter with tensorflow installed
PROTOC_VENV="${PROTOC_VENV:-/tmp/protoc-venv}"  # scratch venv holding grpcio-tools 1.62

if [[ ! -x "${PROTOC_VENV}/bin/python" ]] || ! "${PROTOC_VENV}/bin/python" -c "import grpc_tools" 2>/dev/null; then
  "${PYTHON}" -m venv "${PROTOC_VENV}"
  "${PROTOC_VENV}/bin/pip" install -q "grpcio-tools==1.62.*"
fi

WORK="$(mktemp -d)"
trap 'rm -rf "${WORK}"' EXIT

# A FileDescriptorSet of TF's tensor.proto, struct.proto, timestamp.proto and everything they import.
TF_CPP_MIN_LOG_LEVEL=3 "${PYTHON}" - "${WORK}/deps.pb" <<'PY'
import sys
from google.protobuf import descriptor_pb2
from google.protobuf import timestamp_pb2
from tensorflow.core.framework import tensor_pb2
from tensorflow.core.protobuf import struct_pb2

out = descriptor_pb2.FileDescriptorSet()
seen = set()

def add(file_descriptor):
    # Dependencies first, each file once.
    if file_descriptor.name in seen:
        return
    seen.add(file_descriptor.name)
    for dependency in file_descriptor.dependencies:
        add(dependency)
    file_descriptor.CopyToProto(out.file.add())

for module in (timestamp_pb2, tensor_pb2, struct_pb2):
    add(module.DESCRIPTOR)
with open(sys.argv[1], "wb") as f:
    f.write(out.SerializeToString())
PY

cd "${ROOT}"
PROTOS=(replay_tf/wire/schema.proto replay_tf/wire/reverb_service.proto replay_tf/wire/checkpoint.proto
        replay_tf/server_executable/reverb_config.proto)
if [[ -f rlds_tf/patterns/patterns.proto ]]; then
  PROTOS+=(rlds_tf/patterns/patterns.proto)
fi
"${PROTOC_VENV}/bin/python" -m grpc_tools.protoc \
  --descriptor_set_in="${WORK}/deps.pb" \
  --proto_path=. \
  --python_out=. \
  "${PROTOS[@]}"
echo "regenerated: ${PROTOS[*]/.proto/_pb2.py}"
