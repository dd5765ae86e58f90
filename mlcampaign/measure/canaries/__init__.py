"""The canaries of a trial: the machine measured on the trial's own nodes in its own process layout, in every
trial, with units and repeat noise (what each canary is: mlcampaign.plan.canaries).

- ``probe``: what a probe is (``CanaryProbe``: a name, the phase of the trial it runs in, whether every rank
  runs it, a ``measure`` function of the ``TrialMachine``), ``probes()``, which finds them, and
  ``measure_canaries``, which runs one phase's probes and leaves out, with the reason in the trial's log, those
  that cannot measure;
- ``probes/``: one module per canary: ``matmul`` (the roofline's matmul peak, reused), ``memory_triad`` (STREAM
  triad), ``allreduce`` (bus bandwidth of the trial's process group), ``dataset_read`` (read rate of the staged
  dataset with its page cache dropped).

Honesty rules every probe follows, as mlcampaign.measure.roofline does: warm-up excluded and said in ``method``;
on GPUs the device synchronised before every clock read; the median of timed repeats, their coefficient of
variation beside it; sizes fixed or derived from the machine (never from the time a rank took, which would let
ranks disagree on a collective's count). What a probe cannot measure is absent, never 0 or NaN.
"""
