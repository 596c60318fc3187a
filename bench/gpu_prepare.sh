#!/usr/bin/env bash
# Adds to the GPU carry folder .gpu/ (after ../shared/gpu/prepare.sh wrote it) what that lacks:
# - the versions the carried transformers checks at import (huggingface_hub and its
#   dependencies, tokenizers, safetensors, regex, accelerate) in .gpu/whl/, which .gpu/setup.sh
#   installs (the GPU machine's own huggingface_hub, 1.33, is too old for transformers 5);
# - Ray: its cp312 wheel is 79 MB, more than a transfer holds, so this unpacks it, drops what a
#   sweep never runs (the Java jars, RLlib, Data, Serve, the LLM library, the dashboard's web
#   client: 60 MB) and packs the rest with xz (about 21 MB) in .gpu/ray/, beside the wheels of
#   its dependencies; bench/gpu_review.sh unpacks it there onto PYTHONPATH.
# Run here, from the project's root.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
[ -d .gpu ] || { echo "run ../shared/gpu/prepare.sh first (it writes .gpu/)"; exit 1; }
PY=.venv/bin/python
ver() { $PY -c "import importlib.metadata as m; print(m.version('$1'))"; }
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
mkdir -p .gpu/ray && rm -f .gpu/ray/*
get() {  # wheels for the GPU machine's python 3.12
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux_2_28_x86_64 -d "$1" "${@:2}" 2>&1 | grep -v "^WARNING: Location" || true
}
get .gpu/whl "huggingface_hub==$(ver huggingface_hub)" --no-deps
get .gpu/whl --no-deps $(for p in httpx2 httpcore2 h11 anyio truststore hf-xet fsspec click \
  typing-extensions tokenizers safetensors regex accelerate; do echo "$p==$(ver $p)"; done)
get "$work" "ray==$(ver ray)"
mkdir "$work/site" && (cd "$work/site" && unzip -q "$work"/ray-*.whl)
rm -rf "$work"/site/ray/{jars,rllib,data,serve,llm,dashboard/client/build}
tar -C "$work/site" -cf - . | xz -9 -T0 > .gpu/ray/ray-site.tar.xz
deps=()
for p in click msgpack jsonschema jsonschema-specifications referencing rpds-py attrs; do
  deps+=("$p==$(ver $p)")
done
get .gpu/ray "${deps[@]}"
du -sh .gpu .gpu/ray; ls .gpu/ray
