"""The constraint engine's fast path (sample from the whole row, check that one token, mask only
when it is refused) against its reference (the full mask at every token), on the real model's
logits: at temperature 0 every step picks the same token, so every corpus output is the same,
byte for byte. The sampled distribution at temperature 1 is checked exactly, on a vocabulary
small enough to compute it, by the Rust unit tests (crates/lmsp-constrain)."""

from __future__ import annotations

import array
import json
from typing import Any

import jsonschema
import orjson

from fixture_files import json_schema_corpus
from lmsp._core import Constraint, Vocabulary
from lmsp.engine.chat_template import CHATML, ChatTemplate
from lmsp.engine.llama import Batch, Context, ContextConfig, LlamaModel
from lmsp.engine.sampling import DEFAULT_MIN_P

CORPUS: list[dict[str, Any]] = json_schema_corpus()
# Sequences decoded together; the corpus outputs stay well under this many tokens.
GROUP = 8
MAX_TOKENS = 400


def _prompt(model: LlamaModel, text: str) -> list[int]:
    template = ChatTemplate(
        model.meta("tokenizer.chat_template") or CHATML, bos_token=model.bos_text, eos_token=model.eos_text
    )
    return model.tokenize(template.render([{"role": "user", "content": text}]), add_special=False)


def _lockstep(
    model: LlamaModel, cases: list[dict[str, Any]], temperature: float
) -> dict[str, tuple[list[int], list[int], dict[str, int]]]:
    """Each case's output from both paths stepped on the same logits rows, GROUP cases per
    decode; the paths stop at their first disagreement (the fast path's stats come back too)."""
    vocabulary = Vocabulary(model.token_table(), model.end_tokens())
    ctx = Context(model, ContextConfig(n_ctx=1024 * GROUP, n_seq_max=GROUP, n_batch=1024, n_threads=1))
    prefill, steps = Batch(1024), Batch(GROUP)
    results: dict[str, tuple[list[int], list[int], dict[str, int]]] = {}
    # One group's sequences at a time (cleared for each group), keyed by sequence id.
    paths: dict[int, tuple[Constraint, Constraint]] = {}
    fast_paths: dict[int, Constraint] = {}
    outputs: dict[int, tuple[list[int], list[int]]] = {}
    positions: dict[int, int] = {}
    rows: dict[int, int] = {}

    def step(seq: int) -> None:
        fast, reference = paths[seq]
        address = ctx.logits_address(rows[seq])
        a, a_done = fast._step_at(address, model.n_vocab)
        b, b_done = reference._step_at(address, model.n_vocab)
        outputs[seq][0].append(a)
        outputs[seq][1].append(b)
        if (a, a_done) != (b, b_done) or a < 0 or a_done or len(outputs[seq][0]) >= MAX_TOKENS:
            del paths[seq]
        else:
            rows[seq] = steps.add(a, positions[seq], seq, True)
            positions[seq] += 1

    try:
        for first in range(0, len(cases), GROUP):
            group = cases[first : first + GROUP]
            paths.clear()
            fast_paths.clear()
            outputs.clear()
            positions.clear()
            rows.clear()
            steps.clear()
            for seq, case in enumerate(group):
                ctx.forget(seq)
                prefill.clear()
                prompt = _prompt(model, case["prompt"])
                for i, token in enumerate(prompt):
                    prefill.add(token, i, seq, i == len(prompt) - 1)
                assert ctx.decode(prefill) == 0
                grammar = vocabulary.compile_json_schema(orjson.dumps(case["schema"]).decode())
                sampling = {"temperature": temperature, "seed": 7, "min_p": DEFAULT_MIN_P}
                paths[seq] = (grammar.start(**sampling), grammar.start(**sampling, mask_every_token=True))
                outputs[seq] = ([], [])
                positions[seq], rows[seq] = len(prompt), len(prompt) - 1
                fast_paths[seq] = paths[seq][0]
                step(seq)  # the next prompt's decode replaces these logits
            while paths:
                assert ctx.decode(steps) == 0
                steps.clear()  # the rows stay readable in the context until the next decode
                for seq in list(paths):
                    step(seq)
            for seq, case in enumerate(group):
                results[case["name"]] = (*outputs[seq], fast_paths[seq].stats)
    finally:
        steps.close()
        prefill.close()
        ctx.close()
    return results


def test_greedy_outputs_equal_the_full_mask_outputs_over_the_corpus(model):  # covers: R6.5-6
    results = _lockstep(model, CORPUS, 0.0)
    masks = steps = 0
    for case in CORPUS:
        fast, reference, stats = results[case["name"]]
        text = b"".join(model.piece(t) for t in fast if t >= 0)
        assert fast == reference, f"{case['name']}: the paths part after {text!r}"
        jsonschema.Draft202012Validator(case["schema"]).validate(json.loads(text))
        masks += stats["masks"]
        steps += stats["steps"]
    # The fast path is the one taken: most steps need no mask at all.
    assert steps > 1000 and masks < steps / 2, (masks, steps)


def test_only_the_reference_path_masks_an_allowed_choice(model):
    vocabulary = Vocabulary(model.token_table(), model.end_tokens())
    grammar = vocabulary.compile_json_schema('{"type": "boolean"}')
    logits = array.array("f", [0.0] * model.n_vocab)
    logits[model.tokenize("true", add_special=False)[0]] = 10.0  # the model's choice is allowed
    address, _ = logits.buffer_info()
    for mask_every_token in (False, True):
        constraint = grammar.start(temperature=0.0, seed=0, min_p=DEFAULT_MIN_P, mask_every_token=mask_every_token)
        token, _ = constraint._step_at(address, model.n_vocab)
        assert token >= 0
        assert constraint.stats["steps"] == 1
        assert constraint.stats["masks"] == (1 if mask_every_token else 0)
