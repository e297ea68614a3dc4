#!/usr/bin/env bash
# The checks that need a CUDA GPU, in one bounded run (about 5 minutes on one H100):
#   1. the GPU executors' and plugins' tests (cudnn, cupy, nvfuser, te, apex, cudagraphs; each
#      skips with its own probe's reason where its library is missing) and the core's CUDA tests
#      (tests/test_cuda.py: changing shapes, training, Hugging Face generate on the device),
#   2. benchmarks/gpu_training_step.py: a litgpt training step, eager / torch.compile / thunder_core,
#   3. the inductor executor's OpInfo conformance kit with samples on CUDA (Triton kernels).
# It uses the machine's Python with its CUDA build of torch. Packages it lacks can be given as
# wheels in .whl/ (the project's own, litgpt, nvidia-cudnn-frontend, ...): they are installed into
# a private folder, never over the machine's own packages. Logs go to $OUT (default: a temp dir).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$(mktemp -d)}"
PYTHON="${PYTHON:-python3}"
if compgen -G ".whl/*.whl" >/dev/null; then
    site="$(mktemp -d)"
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" .whl/*.whl || exit 1
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
"$PYTHON" - <<'EOF'
import torch, thunder_core
from thunder_core.testing import plugin_info
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name()}, thunder_core {thunder_core.__version__}")
for name in ("cudnn", "cupy", "nvfuser", "te", "apex", "inductor", "numba", "reduce-overhead"):
    try:
        info = plugin_info(name)
        print(f"  {name:10s} {info.status:10s} {info.reason or ''}")
    except KeyError:
        print(f"  {name:10s} not installed")
EOF
gpu_tests=(tests/test_cuda.py)
for folder in executors/*/tests plugins/thunder-plugin-cudagraphs/tests; do
    case "$folder" in *numba*|*inductor*) continue ;; esac
    gpu_tests+=("$folder")
done
echo "== GPU executors' and plugins' tests"
status=0
timeout "${TESTS_TIMEOUT:-200}" "$PYTHON" -m pytest -q -rfEs -p no:cacheprovider -n "${WORKERS:-8}" \
    --timeout 150 --junitxml "$OUT/gpu-tests.xml" "${gpu_tests[@]}" 2>&1 | tee "$OUT/gpu-tests.log" | tail -60 || status=1
echo "== benchmarks/gpu_training_step.py"
# One round of four fresh processes takes about 2 minutes (first calls compile for 25-30 s each).
timeout "${BENCH_TIMEOUT:-240}" "$PYTHON" benchmarks/gpu_training_step.py ${BENCH_ARGS:---rounds 1} 2>&1 | tee "$OUT/bench.log" | tail -30 || status=1
echo "== inductor conformance on CUDA"
THUNDER_CONFORMANCE_DEVICE=cuda timeout "${CONFORMANCE_TIMEOUT:-150}" "$PYTHON" -m pytest -q -rfE -p no:cacheprovider \
    -n "${WORKERS:-8}" --timeout 120 executors/thunder-executor-inductor/tests/test_inductor_conformance.py \
    2>&1 | tee "$OUT/inductor-cuda.log" | tail -30 || status=1
exit "$status"  # non-zero when any step failed
