# Sourced at the start of a command on a lent GPU machine (the `device` tool), from the copied tree's root:
#   source experiments/device_env.sh && python3 -m experiments.device_check ... && llama_bench_ready && python3 -m tinyzoo bench ...
# Installs the carried wheels (.whl: tinygrad, gguf; make them with `make device-wheels`), selects tinygrad's CUDA backend,
# and builds llama.cpp's llama-bench for sm_90 from the carried source (.lcpp/llama.cpp.tgz, `make device-llama-src`) in
# the background: about 4 minutes on 16 cores, while tinygrad checks and compiles. `llama_bench_ready` waits for it and
# sets LLAMA_BENCH. Records are journaled into $OUT/journal.jsonl (TINYZOO_JOURNAL), so every record comes back,
# also from a command cut off at its time limit: merge its new lines here.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || return 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DEV=CUDA
LLAMA_DIR=/tmp/llama.cpp
# one build a machine, whichever command sourcing this starts it (its pid in $LLAMA_DIR.pid; a later one waits for it). It
# runs in a session of its own, so that it goes on after the command that started it returns (the machine kills the
# rest); a build cut off anyway is taken up where it stopped.
llama_building() { [ -f $LLAMA_DIR.pid ] && kill -0 "$(cat $LLAMA_DIR.pid)" 2>/dev/null; }
if [ -f .lcpp/llama.cpp.tgz ] && [ ! -x $LLAMA_DIR/build/bin/llama-bench ] && ! llama_building; then
  [ -f $LLAMA_DIR/CMakeLists.txt ] || { mkdir -p $LLAMA_DIR && tar xzf .lcpp/llama.cpp.tgz -C $LLAMA_DIR; }
  setsid bash -c "cmake -S $LLAMA_DIR -B $LLAMA_DIR/build -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF -DGGML_CUDA_FA_ALL_QUANTS=OFF \
    && cmake --build $LLAMA_DIR/build --target llama-bench -j14" > /tmp/llama_build.log 2>&1 < /dev/null &
  echo $! > $LLAMA_DIR.pid
fi

llama_bench_ready() {   # without the carried source (no .lcpp) there is no peer: benches run without one
  [ -f .lcpp/llama.cpp.tgz ] || { unset LLAMA_BENCH; return 0; }
  while llama_building; do sleep 1; done
  if [ -x $LLAMA_DIR/build/bin/llama-bench ]; then export LLAMA_BENCH=$LLAMA_DIR/build/bin/llama-bench
  else echo "llama-bench did not build:"; tail -5 /tmp/llama_build.log; return 1; fi
}

if [ -n "${OUT:-}" ]; then export TINYZOO_JOURNAL="$OUT/journal.jsonl"; fi
