"""A train worker on a small machine takes one job at a time (each holds its own model)."""

from __future__ import annotations

from tests.support.services import built


def test_a_train_worker_fetches_no_more_jobs_than_it_may_train_at_once() -> None:
    env = {"RETRACE_TRAIN_MAX_JOBS": "1", "RETRACE_CONSUMER_CONCURRENCY": "4"}
    service = built("train", env)
    assert service.cfg.consumer.concurrency == 1
    service = built("train", {})
    assert service.cfg.consumer.concurrency == 4
