"""How a Job ended, read from the Job and its pod as the API returns them (camelCase dicts).

The container's own termination is the most specific evidence (exit code, ``OOMKilled``); a
pod the kubelet stopped says why in its status (``DeadlineExceeded``, ``Evicted``); the Job's
conditions cover the rest (e.g. a Job deleted pods and all). Nothing here asks for the
``previous`` container log: with ``restartPolicy: Never`` there is none, and the kubelet answers
such a request with an error.
"""

from __future__ import annotations

import dataclasses

from snakemake_executor_plugin_eidf.manifest import CONTAINER_NAME

# Pod status reasons set when the kubelet or the control plane stopped the pod.
_POD_STOP_REASONS = ("DeadlineExceeded", "Evicted", "Preempting", "NodeLost", "Shutdown", "Terminated")


@dataclasses.dataclass(frozen=True)
class Outcome:
    succeeded: bool
    reason: str  # Kubernetes' own word: Completed, Error, OOMKilled, DeadlineExceeded, Evicted, ...
    message: str

    def __str__(self) -> str:
        return f"{self.reason}: {self.message}" if self.message else self.reason


def job_outcome(job: dict, pods: list[dict]) -> Outcome | None:
    """The Job's final outcome, or None while it is queued, starting or running."""
    for pod in sorted(pods, key=lambda p: p["metadata"].get("creationTimestamp") or "", reverse=True):
        status = pod.get("status") or {}
        if status.get("phase") == "Failed" and status.get("reason") in _POD_STOP_REASONS:
            return Outcome(False, status["reason"], _with_exit(status.get("message") or "", _terminated(status)))
        terminated = _terminated(status)
        if terminated is not None:
            if terminated.get("exitCode") == 0:
                return Outcome(True, "Completed", "")
            reason = terminated.get("reason") or "Error"
            message = terminated.get("message") or ""
            if reason == "OOMKilled":
                message = message or "the container exceeded its memory limit"
            return Outcome(False, reason, _with_exit(message, terminated))
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("status") != "True":
            continue
        if condition["type"] == "Complete":
            return Outcome(True, "Completed", "")
        if condition["type"] == "Failed":
            return Outcome(False, condition.get("reason") or "Failed", condition.get("message") or "")
    return None


def _terminated(pod_status: dict) -> dict | None:
    for container in pod_status.get("containerStatuses") or []:
        if container.get("name") == CONTAINER_NAME:
            return (container.get("state") or {}).get("terminated")
    return None


def _with_exit(message: str, terminated: dict | None) -> str:
    if terminated is None or terminated.get("exitCode") is None:
        return message
    code = f"exit code {terminated['exitCode']}"
    return f"{message} ({code})" if message else code
