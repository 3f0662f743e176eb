#!/usr/bin/env bash
# Serve a model with Ollama for the inference agent (or any agent speaking OpenAI chat completions with tools),
# and print the models.lock entry that pins what it serves.
#
#   examples/model-servers/serve-ollama.sh MODEL
#
# MODEL is an Ollama tag with tool support (qwen2.5-coder:7b, llama3.1:8b). The server listens on
# OLLAMA_HOST (127.0.0.1:11434); its OpenAI API is at http://OLLAMA_HOST/v1. Ollama reports each model's
# manifest digest (`GET /api/tags`), so the entry pins the exact bytes. DRY_RUN=1 prints the commands.
set -euo pipefail
if [ $# -ne 1 ]; then
    sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
fi
model=$1
export OLLAMA_HOST=${OLLAMA_HOST:-127.0.0.1:11434}
if [ -n "${DRY_RUN:-}" ]; then
    echo "ollama serve &"
    echo "ollama pull $model"
    exit 0
fi
if ! curl -fsS "http://$OLLAMA_HOST/api/version" > /dev/null 2>&1; then
    ollama serve > "${TMPDIR:-/tmp}/ollama-serve.log" 2>&1 &
    for _ in $(seq 50); do
        curl -fsS "http://$OLLAMA_HOST/api/version" > /dev/null 2>&1 && break
        sleep 0.2
    done
fi
ollama pull "$model"
digest=$(curl -fsS "http://$OLLAMA_HOST/api/tags" | python3 -c '
import json, sys
wanted = sys.argv[1]
for m in json.load(sys.stdin)["models"]:
    if wanted in (m.get("name"), m.get("model")):
        print(m["digest"])' "$model")
echo "serve-ollama: http://$OLLAMA_HOST/v1 serves $model; pin it in models.lock:"
printf '[endpoints.%s]\nmodel = "%s"\ndigest = "sha256:%s"\n' "${model//[^A-Za-z0-9_-]/-}" "$model" "${digest#sha256:}"
