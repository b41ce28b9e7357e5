#!/usr/bin/env bash
# Oracle solution for toml-version-bump.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
sed -i 's/^version = "1.4.2"/version = "1.5.0"/' package.toml
