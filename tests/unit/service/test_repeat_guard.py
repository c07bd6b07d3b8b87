"""The tool rules on their own: a call made again ends the calls (service/toolcalls.py
RepeatGuard), and tool parameters closed where they say nothing (engine/tools.py)."""

from __future__ import annotations

from test_toolcalls import _Recorder

from lmsp.engine.tools import HERMES, call_text, closed_schema
from lmsp.service.toolcalls import CallSplitter, RepeatGuard


def _guarded(output: str, piece: int = 3) -> tuple[_Recorder, RepeatGuard]:
    recorder = _Recorder()
    guard = RepeatGuard(recorder)
    splitter = CallSplitter(guard, HERMES)
    for i in range(0, len(output), piece):
        splitter.feed(output[i : i + piece])
        if guard.repeated:
            break
    splitter.flush(cut=False)
    return recorder, guard


def test_a_repeated_call_is_dropped_and_ends_the_calls():
    tokyo = call_text("get_weather", '{"city": "Tokyo"}')
    recorder, guard = _guarded(tokyo + "\n" + tokyo + "\n" + tokyo)
    assert guard.repeated
    assert recorder.of("call") == ["get_weather"] and recorder.of("done") == ['{"city": "Tokyo"}']


def test_a_call_that_differs_goes_out_whole_after_being_held():
    first = call_text("get_weather", '{"city": "Tokyo"}')
    second = call_text("get_weather", '{"city": "Tokyo Bay"}')
    other = call_text("get_time", '{"city": "Tokyo"}')
    recorder, guard = _guarded(first + "\n" + second + "\n" + other, piece=1)
    assert not guard.repeated
    assert recorder.of("call") == ["get_weather", "get_weather", "get_time"]
    assert recorder.of("done") == ['{"city": "Tokyo"}', '{"city": "Tokyo Bay"}', '{"city": "Tokyo"}']
    # The held call's deltas went out in full, in order, before it finished.
    events = recorder.events
    second_start = [i for i, e in enumerate(events) if e == ("call", "get_weather")][1]
    assert "".join(d for k, d in events[second_start:] if k == "args").startswith('{"city": "Tokyo Bay"}')


def test_parameters_close_where_they_list_properties_and_say_nothing():
    schema = {
        "type": "object",
        "properties": {
            "place": {"type": "object", "properties": {"city": {"type": "string"}}},
            "tags": {"type": "array", "items": {"type": "object", "properties": {"k": {"type": "string"}}}},
            "extra": {"type": "object", "properties": {}, "additionalProperties": True},
            "free": {"type": "object"},
        },
        "allOf": [{"properties": {"a": {"type": "string"}}}],
    }
    closed = closed_schema(schema)
    assert closed["additionalProperties"] is False
    assert closed["properties"]["place"]["additionalProperties"] is False
    assert closed["properties"]["tags"]["items"]["additionalProperties"] is False
    assert closed["properties"]["extra"]["additionalProperties"] is True  # it says so
    assert "additionalProperties" not in closed["properties"]["free"]  # lists nothing: any object
    assert "additionalProperties" not in closed["allOf"][0]  # one part of the properties
    assert "additionalProperties" not in schema  # the tool's own schema is left as it was
