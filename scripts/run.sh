#!/usr/bin/env bash
# The main job on a fresh machine, in one command: installs the dependencies, builds, and runs the embedded default
# (GPT pretraining through pretrain() on a corpus shipped in the binary). Extra arguments go to the program.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install_deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build --target pretrain_gpt
build/examples/pretrain_gpt "$@"
