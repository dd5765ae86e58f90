"""The TensorFlow/Keras path: Keras models of the benchmarks, their FLOP count, and the trial.

A Keras trial reads the same files through the same readers and sampler as a torch trial and
writes the same record and MLPerf log (``mlcampaign.trial.TrialRun``); only the model, the
optimizer and the collectives are TensorFlow's. TensorFlow is imported only when a trial of
framework ``tensorflow`` runs.
"""
