"""Energy and power of a trial, over named windows (the timed training; the whole trial).

- ``source``: what a power source is (``PowerSource``: a name, a description, ``read()`` of a
  ``SourceReading``, ``close()``) and ``default_sources()``, which opens those this machine offers and says
  why the others do not;
- ``sources/``: one module per power source (as the results store has one module per backend):
  ``nvml`` (NVIDIA GPUs), ``amdsmi`` (AMD GPUs), ``rapl`` (CPU packages and their DRAM through Linux
  powercap); each optional;
- ``monitor``: the accounting (``EnergyMonitor``): samples every source in a background thread and
  accounts energy, mean and peak power, utilisation and memory over named windows.

Why not Zeus (PyPI ``zeus``; ``zeus-ml`` up to 0.11; Apache-2.0), which wraps the same three: its
``ZeusMonitor`` windows give energy and time per GPU and per CPU package and work without a GPU, but no
peak power (its ``PowerMonitor`` polls power in a separate *process*, started with multiprocessing, a
hazard inside DDP/MPI ranks), no utilisation or memory high-water mark; its window boundaries
synchronise through torch or JAX; and it pulls pydantic, rich, tyro and scikit-learn into every training
environment. NVML (nvidia-ml-py, NVIDIA's own bindings, pure Python) and sysfs give all of it directly,
and one ``PowerSource`` interface lets tests inject known readings.

Honesty rules, which every source and the accounting share: where nothing could be measured a window says
``"not measured: <why>"`` in ``not_measured`` and its numbers are None, never 0 (also when a counter did
not advance over a short window). A source that raises ends *that source's* measurement with the reason
(windows spanning it are not measured for it, and have no total); the trial goes on. Multi-process
trials: every process that starts a monitor measures the devices it was given (``NvmlSource(indices=...)``),
and RAPL packages are shared by the ranks of a node, so one process per node measures the node.
"""
