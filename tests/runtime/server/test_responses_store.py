"""responses_store (bounded by count and bytes, least recently used out first) and
responses_items (items -> chat messages, and the 400s), without a server."""

from __future__ import annotations

import pytest

from radixflow.runtime.errors import InvalidRequest
from radixflow.runtime.server.responses_items import chat_messages, history_items, input_items
from radixflow.runtime.server.responses_store import ResponseNotFound, ResponseStore, Stored


def _record(rid: str, text: str = "") -> Stored:
    return Stored({"id": rid, "status": "completed", "output": [], "text": text}, [])


def test_store_evicts_the_least_recently_used_past_its_count():
    store = ResponseStore(max_records=2)
    for rid in ("a", "b"):
        store.put(_record(rid))
    store.get("a")  # now the most recently used
    store.put(_record("c"))
    assert "a" in store and "c" in store and "b" not in store
    with pytest.raises(ResponseNotFound, match="'b'"):
        store.get("b")


def test_store_is_bounded_in_bytes():
    store = ResponseStore(max_records=100, max_bytes=1000)
    for k in range(5):
        store.put(_record(f"r{k}", "x" * 300))
    assert len(store) == 2 and store.bytes <= 1000 and {"r3", "r4"} <= {"r3", "r4"}
    assert "r4" in store and "r3" in store
    store.put(_record("huge", "x" * 5000))  # bigger than the whole budget: not kept
    assert "huge" not in store and "r4" in store
    store.pop("r4")
    store.pop("r3")
    assert store.bytes == 0


def test_items_become_chat_messages():
    items = input_items([
        {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "Let me look.", "annotations": []}]},
        {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"},
        {"type": "function_call", "call_id": "call_2", "name": "g", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        {"type": "reasoning", "id": "rs_1", "summary": []},
    ])
    assert all(i["id"] for i in items)
    messages = chat_messages("Be brief.", items)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool"]
    assert messages[2]["content"] == "Let me look."
    assert [c["id"] for c in messages[2]["tool_calls"]] == ["call_1", "call_2"]
    assert messages[3] == {"role": "tool", "content": "sunny", "tool_call_id": "call_1"}


def test_output_items_are_the_next_turns_history():
    output = [{"type": "reasoning", "id": "rs_1", "summary": [], "content": []},
              {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
               "content": [{"type": "output_text", "text": "Hi", "annotations": []}]},
              {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "f",
               "arguments": "{}", "status": "completed"}]
    history = history_items(output)
    messages = chat_messages(None, [*input_items("hello"), *history])
    assert messages[1]["content"] == "Hi" and messages[1]["tool_calls"][0]["id"] == "call_1"


@pytest.mark.parametrize("raw, param", [
    ([], "input"),
    (["text"], "input.0"),
    ([{"type": "computer_call"}], "input.0.type"),
    ([{"role": "tool", "content": "x"}], "input.0.role"),
    ([{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}],
     "input.0.content.0.type"),
    ([{"type": "function_call", "call_id": "c", "name": "f"}], "input.0.arguments"),
    ([{"type": "item_reference", "id": "msg_1"}], "input.0.type"),
])
def test_bad_items_are_400s_naming_the_field(raw, param):
    with pytest.raises(InvalidRequest) as err:
        input_items(raw)
    assert err.value.param == param


def test_a_conversation_needs_a_message():
    with pytest.raises(InvalidRequest, match="no message"):
        chat_messages("only instructions", [])
