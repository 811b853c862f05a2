#!/usr/bin/env bash
# The main job on a fresh machine, in one command: installs the dependencies, builds bridge-pretrain, and runs its
# embedded default (the tiny recipe, examples/recipes/tiny.yaml, on the embedded corpus of generated fables; about a
# minute on 2 CPU cores). Extra arguments go to bridge-pretrain: key=value overrides, --config, --help.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install_deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build --target bridge-pretrain
build/tools/bridge-pretrain "$@"
