"""A task an earlier process left running is ended `failed` when the service starts, through the
same sweep that ends a dead replica's tasks: the service never asks which backends it has."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import cast

from lmsp.service.responses import ResponsesService
from lmsp.service.tasks import TasksService
from lmsp.state import StateConfig, open_state
from lmsp.store import StoredTask

OWNER = "token:alice001"


def _running(task_id: str) -> StoredTask:
    task = {
        "id": task_id,
        "object": "task",
        "status": "in_progress",
        "created_at": 1_700_000_000,
        "response_id": f"resp_{task_id}",
        "response": None,
    }
    return StoredTask(task=task, model="scripted:test", last_event_id=0)


def test_start_fails_the_tasks_an_earlier_process_left_running(tmp_path: Path) -> None:
    state = open_state(StateConfig(data_dir=tmp_path))
    state.store.store.put_task(OWNER, _running("task_left"))

    async def main() -> None:
        # The sweep reads records and events only: no model is needed to end a dead task (nor
        # stored conversations, whose own retention sweep `start` would start).
        responses = cast(ResponsesService, SimpleNamespace(conversations=None))
        tasks = TasksService(responses, state.store, events=state.events)
        await tasks.start()
        await tasks.aclose()

    try:
        asyncio.run(main())
        ended = state.store.store.get_task(OWNER, "task_left")
        assert ended is not None and state.store.store.running_tasks() == []
        assert ended.task["status"] == "failed" and ended.last_event_id == 0
        response = ended.task["response"]
        assert response["id"] == "resp_task_left" and response["status"] == "failed"
        assert response["error"]["code"] == "generation_failed"
        assert response["error"]["detail"] == "the service stopped before the task finished"
    finally:
        state.close()
