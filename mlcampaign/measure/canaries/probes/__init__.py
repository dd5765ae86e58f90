"""The canary probes, one module each: a module defines ``PROBE = CanaryProbe(...)``
(mlcampaign.measure.canaries.probe) under its canary's name, and the trial runs every one its cell measures."""
