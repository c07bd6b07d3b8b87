"""Control jobs (a DELETE's forgetting of cached prompts, issue 38) reach a model's thread even
when its queue is full, ahead of every request, and are answered when it stops."""

from __future__ import annotations

import pytest

from lmsp.engine.sampling import Sampling
from lmsp.engine.sequence import ControlJob, GenerationRequest, ModelUnavailable, Overloaded, SubmissionQueue


class _Sink:
    def on_text(self, text: str) -> None: ...

    def on_finish(self, *args: object) -> None: ...

    def on_error(self, message: str) -> None: ...


def _request() -> GenerationRequest:
    return GenerationRequest(prompt=[1, 2, 3], max_tokens=1, sampling=Sampling(), sink=_Sink())  # type: ignore[arg-type]


def test_a_control_job_passes_a_full_queue_and_goes_first() -> None:
    q = SubmissionQueue(maxsize=2)
    first = q.submit(_request())
    q.submit(_request())
    with pytest.raises(Overloaded):
        q.submit(_request())
    job = ControlJob(lambda: 7)
    q.submit_control(job)
    assert q.qsize() == 3
    (taken,) = q.take_controls()
    assert taken is job and q.take_controls() == [] and q.get_nowait() is first
    taken.perform()
    assert job.result.result(timeout=0) == 7
    failing = ControlJob(lambda: 1 // 0)
    failing.perform()
    assert isinstance(failing.result.exception(timeout=0), ZeroDivisionError)


def test_a_control_job_left_at_close_is_answered_and_none_is_taken_after() -> None:
    q = SubmissionQueue(maxsize=2)
    job = ControlJob(lambda: 7)
    q.submit_control(job)
    assert q.close() == []
    assert isinstance(job.result.exception(timeout=0), ModelUnavailable)
    with pytest.raises(ModelUnavailable):
        q.submit_control(ControlJob(lambda: 7))
