"""Simulated weekly histories of one cell for the change detectors' tests (mlcampaign.analysis.detection)."""

import numpy as np

from mlcampaign.analysis import detection

SETTINGS = detection.DetectionSettings()


def history(cv: float, step: float, runs: int = 20, trials: int = 3, seed: int = 0) -> list[np.ndarray]:
    """Throughput around 1000 with a step of ``step`` (relative, down) from run 10."""
    rng = np.random.default_rng(seed)
    return [1000 * (1 - step * (run >= 10)) * (1 + cv * rng.standard_normal(trials)) for run in range(runs)]


def scanned(trials, direction="higher", settings=SETTINGS) -> detection.ScanResult:
    return detection.scan(detection.run_series(trials), direction, settings)


def verdicts(trials, direction="higher", settings=SETTINGS) -> list[detection.StepResult]:
    return scanned(trials, direction, settings).steps
