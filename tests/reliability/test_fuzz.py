"""Hypothesis and fixed hostile requests against a real ``nvplugin serve`` over gRPC."""

from __future__ import annotations

from tests.support.reliability import fuzzing, scenarios


def test_every_hostile_or_random_request_is_answered_and_nothing_leaks() -> None:
    outcome = fuzzing.fuzz(scenarios.TEST.fuzz_examples)
    outcome.assert_ok()
    assert outcome.iterations > 2 * scenarios.TEST.fuzz_examples
