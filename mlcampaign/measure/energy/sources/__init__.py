"""The power sources, one module each: a module defines ``SOURCE = PowerSourceKind(...)``
(mlcampaign.measure.energy.source), and the energy monitor opens every one this machine offers."""
