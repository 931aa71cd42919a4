"""What the daemon's Kubernetes API publishers share (:mod:`nvplugin.plugin.nodefeature`,
:mod:`nvplugin.plugin.nrt`): who they publish as, where they count and log, the owner of their
background task, their backoff, and saying once why they cannot publish at all."""

from __future__ import annotations

from nvplugin.config.pod import PodIdentity
from nvplugin.log import get_logger
from nvplugin.plugin.metrics import Metrics
from nvplugin.plugin.tasks import Tasks


class ApiPublisher:
    """The common part of a publisher. ``tasks``: the owner of its background task (the daemon's
    whole life); ``backoff``: the first and the longest wait between attempts, in seconds;
    ``logger``: the name it logs under."""

    def __init__(
        self,
        pod: PodIdentity,
        metrics: Metrics,
        *,
        tasks: Tasks,
        backoff: tuple[float, float],
        logger: str,
    ) -> None:
        self._pod = pod
        self._metrics = metrics
        self._tasks = tasks
        self._backoff = backoff
        self._log = get_logger(logger, node=pod.node_name)
        self._said_off = False

    def _refused(self, problem: str | None, what: str) -> bool:
        """Whether ``problem`` (None: none) stops publishing ``what``; said once, as an error."""
        if problem is None:
            return False
        if not self._said_off:
            self._log.error(f"cannot publish the {what}", reason=problem)
            self._said_off = True
        return True
