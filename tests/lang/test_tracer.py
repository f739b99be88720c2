"""Tracing to a program graph, and what the compiler reads from it. No model needed."""

from __future__ import annotations

import pytest
from helpers.fake_backend import FakeBackend

import radixflow as rf


@rf.function
def qa(s, question):
    s += rf.system("You answer in one word.")
    s += rf.user(question)
    s += rf.assistant(rf.gen("answer", max_tokens=8, stop="."))
    s += "Confidence: " + rf.select("conf", choices=["high", "low"])


@rf.function
def tool_loop(s, task):
    s += "Task: " + task + "\n"
    for _ in range(2):
        s += "Expr:" + rf.gen("expr", max_tokens=5, regex=r"[0-9+]+")
        n = len(s["expr"])  # Python between calls
        s += f" (len {n})\n"
    s += "Answer:" + rf.gen("answer", max_tokens=3)


@rf.function
def tree(s):
    s += "Root."
    forks = s.fork(2)
    for i, f in enumerate(forks):
        f += f" B{i}:" + rf.gen("idea", max_tokens=4)
    forks.join("concat")
    s += " Final:" + rf.gen("final", max_tokens=4)


@rf.function
def branch_reads(s):
    s += "P"
    forks = s.fork(2)
    forks += ":" + rf.gen("x", max_tokens=2)
    firsts = [f["x"] for f in forks]
    forks += " more:" + rf.gen("y", max_tokens=2)
    s += "|".join(firsts)
    forks.join("gather")
    s += rf.gen("z", max_tokens=2)


@rf.function
def echo(s, topic):
    s += "About " + topic + ":" + rf.gen("a", max_tokens=4)
    s += " again: " + s["a"]


def test_graph_nodes_and_edges():
    graph = qa.trace()
    assert graph.kinds() == ["role_begin", "text", "role_end", "role_begin", "text", "role_end",
                             "role_begin", "gen", "role_end", "text", "select"]
    assert graph.placeholder_args == ["question"]
    assert graph.nodes[4].data["dynamic"] and graph.nodes[4].label == "{question}"
    assert graph.variables() == ["answer", "conf"]
    assert graph.nodes[7].data["in_role"] == "assistant"
    assert {e.kind for e in graph.edges} == {"next"}


def test_variables_become_edges_and_reads():
    graph = echo.trace(topic="cats")
    assert graph.placeholder_args == []
    kinds = graph.kinds()
    assert kinds == ["text", "gen", "read", "text"]
    var_edges = [(e.src, e.dst, e.label) for e in graph.edges if e.kind == "var"]
    assert var_edges == [(1, 2, "a"), (1, 3, "a")]
    assert graph.nodes[3].label == " again: {s['a']}"


def test_fork_and_join_edges():
    graph = tree.trace()
    fork = graph.kinds().index("fork")
    join = graph.kinds().index("join")
    fork_edges = [e for e in graph.edges if e.kind == "fork"]
    join_edges = [e for e in graph.edges if e.kind == "join"]
    assert [e.src for e in fork_edges] == [fork, fork]
    assert {graph.nodes[e.dst].branch for e in fork_edges} == {"main.0", "main.1"}
    assert [e.dst for e in join_edges] == [join, join]
    assert graph.forks[fork] == ["main.0", "main.1"]


@pytest.mark.parametrize("program, kwargs", [
    (qa, {"question": "Capital of France?"}),
    (tool_loop, {"task": "add"}),
    (tree, {}),
    (branch_reads, {}),
    (echo, {"topic": "cats"}),
])
def test_stretches_predict_the_requests_a_run_makes(program, kwargs):
    fake = FakeBackend(respond=lambda p, sp: "12" if sp.get("regex") else " x")
    state = program.run(backend=fake, **kwargs)
    assert state.ok
    graph = program.trace(**kwargs)
    assert len(graph.stretches()) == len(fake.programs)


def test_stretch_contents():
    assert tool_loop.trace().stretches() == [[0, 1, 2], [4, 5, 6], [8, 9, 10]]
    assert len(tree.trace().stretches()) == 1
    assert len(branch_reads.trace().stretches()) == 4  # parent+forks, then each branch, then z


@rf.function
def lazy_join_then_more(s):
    s += "S"
    forks = s.fork(2)
    forks += "a" + rf.gen("x", max_tokens=1)
    forks.join("concat")
    forks += "b" + rf.gen("y", max_tokens=1)  # after the join: not part of the fork's stretch
    s += "."


@rf.function
def branches_read_in_turn(s):
    s += "P"
    forks = s.fork(3)
    forks += ":" + rf.gen("x", max_tokens=2)
    forks[0]["x"]
    forks += " more:" + rf.gen("y", max_tokens=2)
    s += "|".join(f["y"] for f in forks)


def _num_nodes(nodes):
    return sum(1 + sum(_num_nodes(b) for b in n.get("branches", [])) for n in nodes)


@pytest.mark.parametrize("program", [lazy_join_then_more, branches_read_in_turn, tree,
                                     branch_reads])
def test_each_stretch_is_one_request_with_its_nodes(program):
    fake = FakeBackend(respond=lambda p, sp: "!")
    assert program.run(backend=fake).ok
    stretches = program.trace().stretches()
    assert sorted(len(ids) for ids in stretches) == \
        sorted(_num_nodes(p["nodes"]) for p in fake.programs)


def test_nodes_a_branch_gets_after_a_lazy_join_run_on_their_own():
    stretches = lazy_join_then_more.trace().stretches()
    assert stretches[0] == [0, 1, 2, 3, 4, 5, 6, 11]
    assert sorted(stretches[1:]) == [[7, 8], [9, 10]]


def test_static_prefix_stops_at_the_first_argument_or_gen():
    fake = FakeBackend()
    prefix = qa.trace().static_prefix(fake.chat_template)
    assert prefix == ("<|im_start|>system\nYou answer in one word.<|im_end|>\n"
                      "<|im_start|>user\n")
    assert qa.trace().static_prefix() == ""  # roles need a template to render
    assert tool_loop.trace().static_prefix() == "Task: "
    assert echo.trace(topic="dogs").static_prefix() == "About dogs:"


def test_tracing_stops_where_python_needs_a_real_value():
    @rf.function
    def calculator(s):
        s += "Expr:" + rf.gen("expr", max_tokens=5)
        s += f" = {eval(s['expr'])}"

    graph = calculator.trace()
    assert graph.stopped.startswith("SyntaxError") or graph.stopped.startswith("NameError")
    assert graph.kinds() == ["text", "gen", "read"]
    assert "tracing stopped" in str(graph)


def test_a_loop_on_placeholders_is_bounded():
    @rf.function
    def forever(s):
        while s["done"] != "yes":
            s += rf.gen("done", max_tokens=1)

    with pytest.raises(rf.TraceError, match="more than 2000 nodes"):
        forever.trace()


def test_a_real_bug_is_not_hidden_by_tracing():
    @rf.function
    def buggy(s):
        s += "x"
        raise ZeroDivisionError("bug")

    with pytest.raises(ZeroDivisionError):
        buggy.trace()


def test_print_dot_and_png(tmp_path):
    graph = tree.trace()
    text = str(graph)
    assert "tree: 9 nodes, 1 request stretch(es)" in text and "[main.1]" in text
    dot = graph.to_dot()
    assert dot.startswith('digraph "tree" {') and "cluster" in dot
    assert "n1 -> n2 [style=bold]" in dot
    assert dot.count("->") == len(graph.edges)
    path = tmp_path / "tree.png"
    graph.draw(str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

