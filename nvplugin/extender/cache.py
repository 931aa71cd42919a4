"""Verdicts by free state and pod: found without an admission where
:func:`~nvplugin.extender.judge.one_node_verdict` decides, else put together from parts
(:mod:`nvplugin.extender.parts`) for a one-container pod, else by a whole admission
(:class:`~nvplugin.extender.judge.Judge`, one per free state)."""

from __future__ import annotations

from collections.abc import Callable

from nvplugin.extender.judge import Judge, Needs, StateKey, Verdict, one_node_verdict
from nvplugin.extender.parts import Parts
from nvplugin.fakekubelet.pods import Pod
from nvplugin.fakekubelet.topologymanager import StartupError


class JudgeCache:
    """Judges by free state and verdicts by (state, pod), both bounded (least recently used
    dropped first)."""

    def __init__(self, judges: int = 4096, verdicts: int = 65536) -> None:
        self._judges: dict[StateKey, Judge | StartupError] = {}
        self._verdicts: dict[tuple[StateKey, object], Verdict] = {}
        self._max_judges = judges
        self._max_verdicts = verdicts
        self.built = 0
        self.admitted = 0
        self.short_cut = 0
        self.composed = 0
        self.parts = Parts()

    def judge(self, key: StateKey) -> Judge | StartupError:
        found = self._judges.pop(key, None)
        if found is None:
            try:
                found = Judge(key)
            except StartupError as exc:
                found = exc
            self.built += 1
            if len(self._judges) >= self._max_judges:
                del self._judges[next(iter(self._judges))]
        self._judges[key] = found
        return found

    def verdict(
        self,
        key: StateKey,
        pod: Pod,
        signature: object,
        on_startup: Callable[[str], Verdict],
        needs: Needs | None = None,
    ) -> Verdict:
        """``needs``: given for a one-container pod, what it takes (:func:`one_node_verdict`)."""
        cache_key = (key, signature)
        found = self._verdicts.get(cache_key)
        if found is not None:
            return found
        found = None if needs is None else one_node_verdict(key, needs)
        if found is not None:
            self.short_cut += 1
        elif needs is not None and (found := self.parts.verdict(key, pod, needs)) is not None:
            self.composed += 1
        else:
            judge = self.judge(key)
            if isinstance(judge, StartupError):
                found = on_startup(str(judge))
            else:
                found = judge.judge(pod)
                self.admitted += 1
        if len(self._verdicts) >= self._max_verdicts:
            del self._verdicts[next(iter(self._verdicts))]
        self._verdicts[cache_key] = found
        return found
