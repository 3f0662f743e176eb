#!/usr/bin/env bash
# The loop soak: drain N scripted tasks through the real kernel and fail on any broken bound.
#   SOAK_TASKS=500 SOAK_REPORT=soak-report .github/scripts/run-loop-soak.sh [extra loop-harness soak args]
# Exit status: 0 when every bound held, non-zero when one broke (the report says which).
set -euo pipefail
cd "$(dirname "$0")/../.."
tasks="${SOAK_TASKS:-500}"
report="${SOAK_REPORT:-soak-report}"
make --no-print-directory .venv/.installed >/dev/null
.venv/bin/loop-harness soak --tasks "$tasks" --report "$report" "$@"
