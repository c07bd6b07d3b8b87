"""A DELETE's reach into the prompt cache from the service's side (issue 38): the model manager
asks every loaded model to forget an owner's states and deletes that owner's files of every
model in the cache folder, loaded or not; another owner's and a shared scope's stay."""

from __future__ import annotations

import asyncio
from pathlib import Path

from lmsp.engine.backends import ScriptedBackend
from lmsp.engine.prompt_disk import DiskTier, join_scope
from lmsp.engine.scheduler import SchedulerConfig
from lmsp.service.models import ModelManager
from lmsp.service.responses import cache_owner_key


def test_the_manager_forgets_an_owners_files_of_every_model(tmp_path: Path) -> None:
    alice, bob = cache_owner_key("token:alice"), cache_owner_key("token:bob")
    assert alice != bob and "token:alice" not in alice
    tokens = list(range(64))
    for model in ("m:1", "m:2"):  # neither is loaded: only their files are left
        disk = DiskTier(tmp_path, model, "id", 1 << 20)
        for scope in (join_scope(alice, ""), join_scope(alice, "salt"), join_scope(bob, ""), join_scope("", "s")):
            assert disk.write(tokens, bytearray(100), scope)
    scripted = ScriptedBackend()
    models = ModelManager([], SchedulerConfig(cache_dir=tmp_path), extra={"scripted": scripted})
    try:
        assert asyncio.run(models.forget_cache_owner(alice)) == 4
        assert asyncio.run(models.forget_cache_owner(alice)) == 0  # the same state again: a retry
    finally:
        scripted.close()
    left = {e.scope for m in ("m:1", "m:2") for e in DiskTier(tmp_path, m, "id", 1 << 20).entries.values()}
    assert left == {join_scope(bob, ""), join_scope("", "s")}
    # Without a cache folder there is nothing on disk to reach.
    assert asyncio.run(ModelManager([], SchedulerConfig()).forget_cache_owner(alice)) == 0
