# hetbench: `make demo` runs the main job on this machine's devices, `make test` runs the tests,
# `make bench` prints hetbench's figures as ratios to the plain library calls measured in the same run.
# Each builds the virtualenv first if it is missing (.venv, the package with the opencl and mpich extras,
# plus clblast where Debian's libclblast-dev is installed).

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
MPIEXEC := $(VENV)/bin/mpiexec
HETBENCH := $(VENV)/bin/hetbench
# pyclblast has no wheel: it builds from source against libclblast (apt-get install libclblast-dev)
HAVE_CLBLAST := $(shell (ldconfig -p 2>/dev/null | grep -q libclblast) && echo 1)
EXTRAS ?= opencl,mpich,report,dev$(if $(HAVE_CLBLAST),$(comma)clblast)
comma := ,
DEMO_SIZE ?= 2048

.PHONY: demo test bench env clean

env: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[$(EXTRAS)]'
	touch $@

demo: env
	$(HETBENCH) devices
	$(MPIEXEC) -n 2 $(HETBENCH) matmul --size $(DEMO_SIZE)
	$(MPIEXEC) -n 2 $(HETBENCH) matmul --size $(DEMO_SIZE) --backend 0=sim:h100,1=sim:mi300x
	$(MPIEXEC) -n 2 $(HETBENCH) collectives --progress --op allreduce,allgather --max-bytes 4M --backend 0=sim:h100,1=sim:mi300x

test: env
	$(PY) -m pytest -q

bench: env
	$(PY) -m hetbench.bench gemm
	$(MPIEXEC) -n 2 $(PY) -m hetbench.bench allreduce
	$(PY) -m hetbench.bench opencl

clean:
	rm -rf $(VENV) build dist *.egg-info
