"""The call splitter on its own (lmsp/service/toolcalls.py): each frame's calls kept out of the
text however the output is cut, custom calls, cut calls; and the builder keeping the items its
log ring has dropped."""

from __future__ import annotations

import pytest

from lmsp._core import EventLog
from lmsp.engine.tools import HERMES, LLAMA3, MISTRAL, CallFormat
from lmsp.protocol.events import fold
from lmsp.service.builder import EventBuilder
from lmsp.service.toolcalls import CallSplitter


class _Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def text(self, delta: str) -> None:
        self.events.append(("text", delta))

    def call_started(self, name: str) -> None:
        self.events.append(("call", name))

    def custom_call_started(self, name: str) -> None:
        self.events.append(("custom", name))

    def arguments(self, delta: str) -> None:
        self.events.append(("args", delta))

    def call_done(self, arguments: str, *, complete: bool = True) -> None:
        self.events.append(("done" if complete else "cut", arguments))

    def of(self, kind: str) -> list[str]:
        return [d for k, d in self.events if k == kind]


def _split(calls: CallFormat, output: str, piece: int, *, cut: bool = False) -> _Recorder:
    recorder = _Recorder()
    splitter = CallSplitter(recorder, calls)
    for i in range(0, len(output), piece):
        splitter.feed(output[i : i + piece])
    splitter.flush(cut=cut)
    return recorder


# Each frame as its template writes two calls (the first one's string argument holds the
# frame's own closer, which must not end it), after some text where the frame allows text.
_FRAMED = {
    "hermes": (
        'Checking <tool or <tool_x, then:<tool_call>\n{"name": "get_weather", '
        '"arguments": {"city": "}\\n</tool_call>"}}'
        '\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
        "Checking <tool or <tool_x, then:",
    ),
    "mistral": (
        'Sure [TOOL [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "}, \\"id\\""}, "id": "a1B2c3D4e"}, '
        '{"name": "get_time", "arguments": {}, "id": "000000000"}]',
        "Sure [TOOL ",
    ),
}
_CITY = {"hermes": '{"city": "}\\n</tool_call>"}', "mistral": '{"city": "}, \\"id\\""}'}


@pytest.mark.parametrize("piece", [1, 2, 5, 1000])
@pytest.mark.parametrize("calls", [HERMES, MISTRAL], ids=lambda c: c.name)
def test_the_splitter_keeps_calls_out_of_text_however_the_output_is_cut(calls, piece):
    output, text = _FRAMED[calls.name]
    recorder = _split(calls, output, piece)
    assert "".join(recorder.of("text")) == text
    assert recorder.of("call") == ["get_weather", "get_time"]
    assert recorder.of("done") == [_CITY[calls.name], "{}"]
    assert "".join(recorder.of("args")) == _CITY[calls.name] + "{}"


@pytest.mark.parametrize("piece", [1, 2, 5, 1000])
def test_a_custom_call_s_input_ends_at_the_closer_the_end_or_next_call_follows(piece):
    # The first input holds the closer itself (a Lark grammar may allow it) followed by more input.
    first = "ls\n</tool_call>x;\n</tool"
    output = (
        f'<tool_call>\n{{"name": "run"}}\n{first}\n</tool_call>\n<tool_call>\n{{"name": "get_time", "arguments": {{}}}}'
        '\n</tool_call>\n<tool_call>\n{"name": "date"}\n2024-01-02\n</tool_call>'
    )
    recorder = _split(HERMES, output, piece)
    assert [(k, d) for k, d in recorder.events if k in ("call", "custom")] == [
        ("custom", "run"),
        ("call", "get_time"),
        ("custom", "date"),
    ]
    assert recorder.of("done") == [first, "{}", "2024-01-02"] and not recorder.of("text")
    assert "".join(recorder.of("args")) == first + "{}" + "2024-01-02"
    cut = _split(HERMES, '<tool_call>\n{"name": "run"}\nls;\n</tool', piece, cut=True)
    assert cut.of("cut") == ["ls;\n</tool"]


@pytest.mark.parametrize("piece", [1, 3, 1000])
def test_the_llama3_frame_is_a_call_only_at_the_start(piece):
    call = _split(LLAMA3, '{"name": "get_time", "parameters": {"zone": "UTC"}}', piece)
    assert call.of("call") == ["get_time"] and call.of("done") == ['{"zone": "UTC"}'] and not call.of("text")
    text = _split(LLAMA3, 'It is {"name": "x", "parameters": {}} noon', piece)
    assert "".join(text.of("text")) == 'It is {"name": "x", "parameters": {}} noon' and not text.of("call")


def test_a_cut_call_ends_incomplete_with_the_arguments_it_got_and_held_back_text_is_flushed():  # covers: R6.3-7
    recorder = _split(HERMES, "all done <tool", 1000)
    assert recorder.events == [("text", "all done "), ("text", "<tool")]
    recorder = _split(HERMES, '<tool_call>\n{"name": "get_time", "arguments": {"a', 1, cut=True)
    assert recorder.of("call") == ["get_time"] and recorder.of("cut") == ['{"a'] and not recorder.of("done")
    assert "".join(recorder.of("args")) == '{"a'
    # Cut inside the head: no item was opened, so there is nothing to close.
    recorder = _split(HERMES, '<tool_call>\n{"name": "get_ti', 1, cut=True)
    assert recorder.events == []


def test_the_builder_keeps_items_its_log_ring_has_dropped():  # covers: R6.3-4, R6.3-7
    # A message, then a call whose argument deltas push the message's events out of a small
    # ring: the response object still holds both, as a stored response must.
    log = EventLog(max_events=4)
    builder = EventBuilder(log, "resp_01M8Q0SWQS3S71JS3EZEDT9Q3D", calls=HERMES)
    builder.created()
    output = 'On it.<tool_call>\n{"name": "get_time", "arguments": {"zone": "' + "x" * 40 + '"}}\n</tool_call>'
    for ch in output:
        builder.on_text(ch)
    builder.on_finish("stop", 10, len(output))
    response = builder.response(created_at=0, model="m")
    assert [(i["type"], i["status"]) for i in response["output"]] == [
        ("message", "completed"),
        ("function_call", "completed"),
    ]
    assert response["output"][0]["content"][0]["text"] == "On it."
    folded = fold(log.entries_after(log.first_id - 1), response_id=builder.response_id, created_at=0, model="m")
    assert len(folded["output"]) < 2  # what the ring alone would have given
