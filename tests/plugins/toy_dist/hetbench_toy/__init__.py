"""The test suite's plugin package: a benchmark (`hetbench axpy`, axpy.py) and a backend (`--backend toy`,
backend.py) that hetbench loads through the entry points its folder's hetbench_toy-0.1.dist-info declares, as it
would those of any installed package. Nothing in hetbench names them: tests/plugins/test_plugins.py puts the folder above
on PYTHONPATH and runs the real CLI."""
