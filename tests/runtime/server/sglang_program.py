"""SGLang's own frontend (`import sglang`) against a live `radixflow serve`: run by
test_sglang_client.py in a process of its own (importing sglang patches transformers and sets
cache variables) with the server's URL; prints what it saw as one JSON object."""

import json
import sys

import sglang as sgl
from sglang import assistant, function, gen, select, system, user

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
          "additionalProperties": False}


@function
def regex_and_json(s):
    s += "Phone: " + gen("phone", max_tokens=16, regex=r"\d{3}-\d{4}", temperature=0)
    s += "\nJSON: " + gen("json", max_tokens=64, json_schema=json.dumps(SCHEMA),
                          temperature=0)


@function
def choose(s):
    s += "The capital of France is" + select("city", choices=[" Paris", " London", " Rome"])


@function
def branches(s):
    s += "Two ideas:\n"
    forks = s.fork(2)
    for i, f in enumerate(forks):
        f += f"{i + 1}. " + gen("idea", max_tokens=5, temperature=0, ignore_eos=True)
    s += forks[0]["idea"] + "|" + forks[1]["idea"]


@function
def shared(s, tail):
    s += "A long shared system prompt that every request repeats. " * 8 + tail
    s += gen("out", max_tokens=3, temperature=0)


@function
def story(s):
    s += "Once" + gen("text", max_tokens=12, temperature=0, ignore_eos=True)


@function
def chat(s):
    s += system("Be terse.")
    s += user("Hi")
    s += assistant(gen("reply", max_tokens=4, temperature=0))


def main(url: str) -> None:
    sgl.set_default_backend(sgl.RuntimeEndpoint(url))
    seen = {"schema": SCHEMA}
    st = regex_and_json.run()
    seen["phone"], seen["json"] = st["phone"], st["json"]
    seen["json_finish"] = st.get_meta_info("json")["finish_reason"]
    st = choose.run()
    seen["city"], seen["city_meta"] = st["city"], st.get_meta_info("city")
    st = branches.run()
    seen["branches_text"] = st.text()
    seen["batch"] = [x.get_meta_info("out") for x in
                     shared.run_batch([{"tail": f"Q{i}:"} for i in range(4)], num_threads=1)]
    streamed = story.run(stream=True)
    seen["stream_pieces"] = list(streamed.text_iter("text"))
    seen["stream_final"] = streamed["text"]
    seen["whole"] = story.run()["text"]
    chat_backend = sgl.RuntimeEndpoint(url, chat_template_name="chatml")
    st = chat.run(backend=chat_backend)
    seen["chat_text"], seen["chat_messages"] = st.text(), st.messages()
    print(json.dumps(seen))


if __name__ == "__main__":
    main(sys.argv[1])
