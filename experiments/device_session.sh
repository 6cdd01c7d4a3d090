# One call on a lent GPU machine (the `device` tool): checks first, then every measurement asked for, in order.
#   bash experiments/device_session.sh STEP...      (carry [".whl", ".lcpp"]; `make device-wheels device-llama-src` here)
# Steps:
#   check               GPU against the CPU reference (experiments/device_reference.json); stops the session on a mismatch
#   gemv:TYPE:RxC       one packed matvec against a device copy, journaled (e.g. gemv:Q4_0:8192x2048)
#   bench:PRESET[:Q]    a synthetic real-shape model made here (quant Q, default the preset's), benched beside llama-bench
#   profile:PRESET[:Q]  the same model's decode step kernel by kernel, each kernel launched alone (JIT=2), to $OUT
#   ncu:PRESET[:Q]      the decode step kernel by kernel, each kernel's device time inside its CUDA graph (Nsight Compute)
# STRATEGY (default packed_words) and TOKENS (default 128) set the matmul strategy and the decoded tokens.
# Journal records, profiles and logs land in $OUT; merge $OUT/journal.jsonl's new lines into experiments/journal.jsonl.
set -uo pipefail
STRATEGY=${STRATEGY:-packed_words} TOKENS=${TOKENS:-128}
source experiments/device_env.sh || exit 1
model() {   # PRESET[:Q] -> the path of its synthetic file, made once
  local preset=${1%%:*} quant=${1#*:} out
  [ "$quant" = "$1" ] && quant=""
  out=/tmp/models/$preset${quant:+.$quant}.gguf
  [ -f "$out" ] || python3 -m tinyzoo synth "$preset" ${quant:+--quant $quant} -o "$out" >&2 || return 1
  echo "$out"
}
status=0
for step in "$@"; do
  echo "=== $step ($(date +%T))"
  case $step in
    check) python3 -m experiments.device_check --against experiments/device_reference.json --strategy "$STRATEGY" || { status=1; break; } ;;
    gemv:*) IFS=: read -r _ type shape <<< "$step"
            python3 -m tinyzoo matvec --shape "$shape" --type "$type" --strategies "$STRATEGY" || status=1 ;;
    bench:*) file=$(model "${step#bench:}") && llama_bench_ready &&
             python3 -m tinyzoo bench "$file" --strategy "$STRATEGY" --prompt-tokens 32 --tokens "$TOKENS" --llama-bench "$LLAMA_BENCH" || status=1 ;;
    profile:*) file=$(model "${step#profile:}") &&
               JIT=2 python3 -m tinyzoo profile "$file" --strategy "$STRATEGY" > "$OUT/profile-$(basename "$file" .gguf).txt" || status=1 ;;
    ncu:*) file=$(model "${step#ncu:}") &&
           python3 -m tinyzoo profile "$file" --strategy "$STRATEGY" --ncu > "$OUT/ncu-$(basename "$file" .gguf).txt" || status=1 ;;
    *) echo "unknown step $step"; status=1 ;;
  esac
done
device_journal
exit $status
