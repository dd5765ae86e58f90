"""The benchmarks, one folder each: its models (torch, and Keras where it has one), its dataset formats'
readers, its dataset generators with the cost of generating a sample, its MLPerf keys (and how a published
submission's settings are read back) and its FLOP cross-check. A folder's ``__init__.py`` declares what it
adds to the registries (``BENCHMARK = Benchmark(...)``, mlcampaign.plan.registry), by name and dotted path,
importing nothing else: planning reads the declarations without importing torch or Keras. Code that two
benchmarks share is a module of its own here (``climate``: the CAM5 fields of DeepCAM and extreme weather).

Adding a benchmark is a folder here and a ``config/benchmarks/<name>.yaml`` (config/README.md).
"""
