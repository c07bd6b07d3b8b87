"""How many forced tokens may follow a sampled one (engine/fastforward.py)."""

from __future__ import annotations

import array

import pytest

from lmsp.cli import _parser
from lmsp.engine.backends import LlamaBackend
from lmsp.engine.fastforward import forced_room
from lmsp.engine.registry import embedded_model_path
from lmsp.engine.scheduler import SchedulerConfig


def test_the_room_is_the_least_of_budget_window_and_batch_share():
    room = {"n_out": 10, "max_tokens": None, "cached": 100, "window": 1024, "share": 64}
    assert forced_room(**room) == 63  # the batch share, the sampled token in it
    assert forced_room(**{**room, "max_tokens": 14}) == 4  # never a token past the budget
    assert forced_room(**{**room, "cached": 1000}) == 23  # the sampled token takes position 1000
    assert forced_room(**{**room, "max_tokens": 10}) == 0
    assert forced_room(**{**room, "cached": 1023}) == 0
    assert forced_room(**{**room, "share": 1}) == 0  # one token a sequence a step: no room


@pytest.mark.parametrize("on", [True, False])
def test_the_flag_decides_whether_a_loaded_models_grammars_force(on, monkeypatch):
    monkeypatch.setenv("LMSP_FAST_FORWARD", "on" if on else "off")
    args = _parser().parse_args(["serve"])
    assert args.fast_forward == ("on" if on else "off")
    path = embedded_model_path()
    assert path is not None
    config = SchedulerConfig(n_parallel=1, ctx_per_sequence=256, n_threads=1, fast_forward=args.fast_forward == "on")
    backend = LlamaBackend(path, config, name="embedded", gpu_layers=0)
    try:
        assert backend.grammars is not None
        grammar = backend.grammars.vocabulary.compile_json_schema('{"enum": ["alphabet soup with noodles"]}')
        constraint = grammar.start(temperature=0.0, seed=0, min_p=0.05)
        logits = array.array("f", [0.0] * backend.model.n_vocab)
        token, done = constraint._step_at(logits.buffer_info()[0], backend.model.n_vocab)
        assert token >= 0 and not done
        forced, done = constraint._fast_forward(64)
        assert bool(forced) is on and done is on  # the rest of the one value, or nothing
    finally:
        backend.close()
