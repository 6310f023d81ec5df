#!/usr/bin/env bash
# Regenerate the Python modules (and their .pyi stubs) of the .proto files under apis/.
# The generated *_pb2.py / *_pb2.pyi are committed; only this script needs grpcio-tools, which the
# runtime does not (requirements/lock.txt pins grpcio and protobuf only):
#   .venv/bin/pip install grpcio-tools==1.85.1 && scripts/gen_protos.sh
# The protoc bundled with grpcio-tools must not be newer than the protobuf runtime in
# requirements/lock.txt (the generated modules check it at import).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
PROTOS=(
  apis/runtime/v1alpha1/api.proto
  apis/cri/v1/api.proto
  apis/nri/v1alpha1/api.proto
  apis/ttrpc/request.proto
)
# -I . keeps each file's registered name unique (three of them are called api.proto upstream).
"$PY" -m grpc_tools.protoc -I . --python_out=. --pyi_out=. "${PROTOS[@]}"
echo "generated: ${PROTOS[*]/%.proto/_pb2.py}"
