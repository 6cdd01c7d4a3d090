# One call on a lent GPU machine (the `device` tool): checks first, then every measurement asked for, in order.
#   bash experiments/device_session.sh STEP...      (carry [".whl", ".lcpp"]; `make device-wheels device-llama-src` here)
# Steps:
#   check               GPU against the CPU reference (results/device/reference.json, or reference.STRATEGY.json where
#                       there is one; REFERENCE=NAME takes reference.NAME.json); stops the session on a mismatch
#   synth:PRESET[:Q]    start making that model in the background now (gpt-oss-20b takes minutes); a later step waits for it
#   gemv:TYPE:RxC       one packed matvec against a device copy, journaled (e.g. gemv:Q4_0:8192x2048)
#   floor:TYPE:RxC      the fastest read of such a weight's bytes by one CUDA C kernel, and a hand-written CUDA C Q4_0 matvec
#                       of that shape (experiments/read_floor.py), journaled
#   tune:TYPE:RxC,...   GPU matvec sizes searched per shape (SIZES, default 16 sizes with spans), the best saved to this
#                       device's profile (copied to $OUT), which later steps use; +experts=N,K etc. as for gemv
#   bench:PRESET[:Q]    a synthetic real-shape model made here (quant Q, default the preset's), benched beside llama-bench
#                       (without .lcpp carried: alone, for comparisons inside one call at no build time)
#   exp:NAME:PRESET[:Q] the named experiment (experiments/defs/NAME.yaml) on that model, llama-bench beside its baseline
#   start:PRESET[:Q]    `tinyzoo run` of that model twice on an empty JIT cache: the first run compiles and keeps its JITs,
#                       the second takes them (each run's summary line and wall seconds to the log)
#   profile:PRESET[:Q]  the same model's decode step kernel by kernel, each kernel launched alone (JIT=2), to $OUT
#   ncu:PRESET[:Q]      the decode step kernel by kernel, each kernel's device time inside its CUDA graph (Nsight Compute)
#   ncu-peer:PRESET[:Q] llama-bench's decode of the same model under Nsight Compute alike: each kernel's median time, per launch size
#   gemm:PRESET[:Q]     `tinyzoo gemm` of that model: each GEMM shape of a prompt chunk under each GEMM kernel, cuBLAS beside, journaled
#   ncu-gemm:PRESET[:Q] the hand-written GEMMs of `tinyzoo gemm --kernels mma` under Nsight Compute: throughput, occupancy and
#                       warp stall reasons of each shape's kernel, to $OUT
# A check, gemv, bench, profile or ncu step may end in +SWITCH... (e.g. bench:llama3.2-1b:Q4_0+norm=break): --SWITCH for each;
# bench and profile decode after 32 tokens of context unless one says +depth=D (bench: D[,D...], llama-bench at the same -d)
# (check takes every hint's flag, e.g. check+split-kv=2; gemv --pdl, --pdl-prefetch, --strategies=S, --gpu-sizes=T,B,R,
# --experts=N,K, --mixed and --act, e.g. gemv:Q4_0:28672x4096+experts=8,2+act).
# STRATEGY sets the matmul strategy: of check, gemv and tune (default packed_words), and of bench, start, profile and ncu
# (default the device profile's); TOKENS (default 128) the decoded tokens.
# Journal records (as they are written), profiles and logs land in $OUT; merge $OUT/journal.jsonl's new lines into
# results/journal.jsonl here.
set -uo pipefail
model_strategy=(${STRATEGY:+--strategy "$STRATEGY"})   # a model's steps take the device profile's unless it is given
STRATEGY=${STRATEGY:-packed_words} TOKENS=${TOKENS:-128}
SIZES=${SIZES:-"32,2,4,0 64,1,4,0 16,4,4,0 32,2,4,1 64,1,4,1 16,4,4,1 128,1,4,1 32,2,2,1 64,1,2,1 32,2,8,1 64,1,8,1 16,4,8,1 32,2,4,2 64,1,4,2 16,4,4,2 32,2,8,2"}
source experiments/device_env.sh || exit 1
declare -A making   # model path -> pid of its background synthesis
model_path() {   # PRESET[:Q] -> where its synthetic file goes
  local preset quant
  IFS=: read -r preset quant <<< "$1"
  echo "/tmp/models/$preset${quant:+.$quant}.gguf"
}
synthesize() {   # PRESET[:Q] PATH
  local preset quant
  IFS=: read -r preset quant <<< "$1"
  python3 -m tinyzoo synth "$preset" ${quant:+--quant $quant} -o "$2" >&2
}
model() {   # PRESET[:Q] -> the path of its synthetic file, made once (waiting for a background synthesis of it)
  local out
  out=$(model_path "$1")
  # called in a subshell, which cannot `wait` for its parent's children
  if [ -n "${making[$out]:-}" ]; then while kill -0 "${making[$out]}" 2>/dev/null; do sleep 1; done; fi
  [ -f "$out" ] || synthesize "$1" "$out" || return 1
  echo "$out"
}
peer_flags() {   # -> peer: llama-bench's flags where it built, else --no-peer
  peer=(--no-peer)
  if [ -n "${LLAMA_BENCH:-}" ]; then peer=(--llama-bench "$LLAMA_BENCH"); fi
}
status=0
for item in "$@"; do
  echo "=== $item ($(date +%T))"
  IFS=+ read -r step switches <<< "$item"
  flags=()
  for sw in ${switches//+/ }; do flags+=("--$sw"); done
  case $step in
    synth:*) out=$(model_path "${step#synth:}")
             [ -f "$out" ] || { synthesize "${step#synth:}" "$out" & making[$out]=$!; } ;;
    check) ref=results/device/reference.json   # a strategy that rounds activations its own way has a reference of its own
           [ -f "results/device/reference.$STRATEGY.json" ] && ref="results/device/reference.$STRATEGY.json"
           [ -n "${REFERENCE:-}" ] && ref="results/device/reference.$REFERENCE.json"
           python3 -m experiments.device_check --against "$ref" --strategy "$STRATEGY" "${flags[@]}" || { status=1; break; } ;;
    gemv:*) IFS=: read -r _ type shape <<< "$step"
            python3 -m tinyzoo matvec --shape "$shape" --type "$type" --strategies "$STRATEGY" "${flags[@]}" || status=1 ;;
    floor:*) IFS=: read -r _ type shape <<< "$step"
             python3 -m experiments.read_floor --type "$type" --shape "$shape" || status=1 ;;
    tune:*) IFS=: read -r _ type shapes <<< "$step"
            python3 -m tinyzoo matvec --shape "${shapes//,/ }" --type "$type" --strategies "$STRATEGY" --gpu-sizes "$SIZES" --save-best --iters 20 "${flags[@]}" \
              | grep -E "^kernel|^search|^saved|WRONG" && cp profiles/*.yaml "$OUT/" || status=1 ;;
    bench:*) file=$(model "${step#bench:}") && llama_bench_ready && peer_flags &&
             python3 -m tinyzoo bench "$file" "${model_strategy[@]}" --depth 32 "${flags[@]}" --tokens "$TOKENS" "${peer[@]}" || status=1 ;;
    exp:*) IFS=: read -r _ name model <<< "$step"
           file=$(model "$model") && llama_bench_ready && peer_flags &&
           python3 -m tinyzoo exp run "$name" --model "$file" "${peer[@]}" || status=1 ;;
    start:*) file=$(model "${step#start:}") && cache=$(mktemp -d) &&
             for run in first second; do
               t0=$EPOCHREALTIME
               TINYZOO_CACHE=$cache python3 -m tinyzoo run "$file" -p "The capital of France is" -n 16 --temperature 0 "${model_strategy[@]}" "${flags[@]}" 2>&1 >/dev/null | tail -1
               awk "BEGIN { printf \"$run run: %.1f s wall\\n\", $EPOCHREALTIME - $t0 }"
             done || status=1 ;;
    profile:*) file=$(model "${step#profile:}") &&
               JIT=2 python3 -m tinyzoo profile "$file" "${model_strategy[@]}" "${flags[@]}" > "$OUT/profile-$(basename "$file" .gguf)${switches:+-${switches//[^A-Za-z0-9_.-]/_}}.txt" || status=1 ;;
    ncu:*) file=$(model "${step#ncu:}") &&
           python3 -m tinyzoo profile "$file" "${model_strategy[@]}" --ncu "${flags[@]}" > "$OUT/ncu-$(basename "$file" .gguf).txt" || status=1 ;;
    ncu-peer:*) file=$(model "${step#ncu-peer:}") && llama_bench_ready && [ -n "${LLAMA_BENCH:-}" ] &&
                python3 -m experiments.peer_llamacpp "$file" --ncu-llama-bench "$LLAMA_BENCH" --prompt-tokens 32 --tokens 16 \
                  > "$OUT/ncu-peer-$(basename "$file" .gguf).txt" || status=1 ;;
    gemm:*) file=$(model "${step#gemm:}") && python3 -m tinyzoo gemm "$file" --iters 50 "${flags[@]}" || status=1 ;;
    ncu-gemm:*) file=$(model "${step#ncu-gemm:}") &&
                ncu --kernel-name regex:gemm_mma --section SpeedOfLight --section Occupancy \
                  --section WarpStateStats --section LaunchStats python3 -m tinyzoo gemm "$file" --kernels mma --iters 3 --no-journal \
                  > "$OUT/ncu-gemm-$(basename "$file" .gguf).txt" 2>&1 || status=1 ;;
    *) echo "unknown step $step"; status=1 ;;
  esac
done
exit $status
