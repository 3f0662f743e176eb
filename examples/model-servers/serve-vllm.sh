#!/usr/bin/env bash
# Serve a model with vLLM for the inference agent (or any agent speaking OpenAI chat completions with tools).
#
#   examples/model-servers/serve-vllm.sh MODEL REVISION [NAME]
#
# MODEL is a hub repo (Qwen/Qwen2.5-Coder-7B-Instruct), REVISION the commit to pin (vLLM reports no
# revision over its API, so the pin lives on this command line), NAME the name it is served under
# (default: MODEL). Tool calls need --enable-auto-tool-choice and the parser of the model's family:
# picked from MODEL here, or set TOOL_PARSER. Across GPUs: TENSOR_PARALLEL=N (one machine) and
# PIPELINE_PARALLEL=M (several machines, under a Ray cluster started first). HOST and PORT say where it
# listens (127.0.0.1:8000). DRY_RUN=1 prints the command instead of running it.
set -euo pipefail
if [ $# -lt 2 ]; then
    sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
fi
model=$1 revision=$2 name=${3:-$1}
if [ -z "${TOOL_PARSER:-}" ]; then
    case "${model,,}" in
        *qwen*) TOOL_PARSER=hermes ;;  # Qwen2.5 and Qwen3 write Hermes-style <tool_call> blocks
        *llama-3*|*llama3*) TOOL_PARSER=llama3_json ;;
        *mistral*|*mixtral*|*devstral*) TOOL_PARSER=mistral ;;
        *granite*) TOOL_PARSER=granite ;;
        *deepseek-v3*) TOOL_PARSER=deepseek_v3 ;;
        *hermes*) TOOL_PARSER=hermes ;;
        *) echo "serve-vllm: no tool-call parser known for $model: set TOOL_PARSER (vllm serve --help)" >&2
           exit 2 ;;
    esac
fi
command=(vllm serve "$model" --revision "$revision" --served-model-name "$name"
         --enable-auto-tool-choice --tool-call-parser "$TOOL_PARSER"
         --host "${HOST:-127.0.0.1}" --port "${PORT:-8000}"
         --tensor-parallel-size "${TENSOR_PARALLEL:-1}" --pipeline-parallel-size "${PIPELINE_PARALLEL:-1}")
if [ -n "${DRY_RUN:-}" ]; then
    printf '%q ' "${command[@]}"; echo
    exit 0
fi
echo "serve-vllm: http://${HOST:-127.0.0.1}:${PORT:-8000}/v1 serves $name; pin it in models.lock:" >&2
printf '[endpoints.%s]\nmodel = "%s"\nsource = "%s@%s"\n' "${name//[^A-Za-z0-9_-]/-}" "$name" "$model" "$revision" >&2
exec "${command[@]}"
