from __future__ import annotations

import pytest
from helpers.tiny_models import CHAT_TEMPLATE, make_tiny_tokenizer

from radixflow.chat_template import LLAMA3_TEMPLATE, ChatTemplate
from radixflow.errors import InvalidRequest


def _render_by_roles(template: ChatTemplate, messages: list[dict]) -> str:
    out, history = [], []
    for m in messages:
        begin, end = template.role_texts(m["role"], history)
        out.append(begin + m["content"] + end)
        history.append(m["role"])
    return "".join(out)


@pytest.mark.parametrize("messages", [
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
     {"role": "assistant", "content": "4"}, {"role": "user", "content": "and 3+3?"}],
])
def test_role_texts_reproduce_apply_chat_template(messages):
    tokenizer = make_tiny_tokenizer()
    template = ChatTemplate.from_tokenizer(tokenizer)
    expected = tokenizer.apply_chat_template(messages, tokenize=False)
    assert _render_by_roles(template, messages) == expected


def test_first_user_turn_carries_the_default_system_prompt():
    template = ChatTemplate(CHAT_TEMPLATE)
    begin, end = template.role_texts("user")
    assert begin.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert begin.endswith("<|im_start|>user\n") and end == "<|im_end|>\n"
    assert template.role_texts("user", ["system"])[0] == "<|im_start|>user\n"
    assert template.end_of_turn("assistant") == "<|im_end|>"


def test_default_template_has_no_end_of_turn_stop():
    template = ChatTemplate(None)
    assert template.is_default
    assert template.role_texts("user") == ("USER: ", "\n")
    assert template.end_of_turn() is None


def test_llama3_template_uses_bos_once_and_eot():
    template = ChatTemplate(LLAMA3_TEMPLATE, bos_token="<|begin_of_text|>")
    first = template.role_texts("system")[0]
    later = template.role_texts("user", ["system"])[0]
    assert first == "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
    assert later == "<|start_header_id|>user<|end_header_id|>\n\n"
    assert template.end_of_turn("assistant", ["user"]) == "<|eot_id|>"


def test_strict_alternation_templates_fall_back_to_a_lone_turn():
    source = ("{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
              "{{ raise_exception('roles must alternate') }}{% endif %}"
              "[{{ m['role'] }}]{{ m['content'] }}[/{{ m['role'] }}]{% endfor %}")
    template = ChatTemplate(source)
    assert template.role_texts("user", ["user"]) == ("[user]", "[/user]")


def test_list_of_named_templates_and_broken_templates():
    assert ChatTemplate([{"name": "default", "template": CHAT_TEMPLATE}]).source == CHAT_TEMPLATE
    with pytest.raises(InvalidRequest, match="does not parse"):
        ChatTemplate("{% for %}")
