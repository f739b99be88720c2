"""The program graph built by tracing: nodes, edges, and what the compiler reads from it.

Node kinds: text, gen, select, role_begin, role_end, fork, join, and read (Python reading a
variable or the text: the point where a straight-line stretch ends). Edge kinds: next (program
order within a branch), fork (fork -> a branch's first node), join (a branch's last node ->
join), var (the gen/select that wrote a variable -> where it is used).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import stretch
from .placeholder import text_before_markers

if TYPE_CHECKING:
    from .chat_template import ChatTemplate

MODEL_KINDS = ("gen", "select")
_COLORS = {"text": "#f2f2f2", "gen": "#cfe8ff", "select": "#ffe4b5", "role_begin": "#e0f5e0",
           "role_end": "#e0f5e0", "fork": "#f5d0f5", "join": "#f5d0f5", "read": "#ffd6d6"}


@dataclass
class GraphNode:
    id: int
    kind: str
    label: str
    branch: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class Edge:
    src: int
    dst: int
    kind: str  # next | fork | join | var
    label: str | None = None


@dataclass
class Graph:
    """A traced program. `print(graph)` lists it; `to_dot()` / `draw(path)` draw it."""

    name: str = "program"
    nodes: list[GraphNode] = field(default_factory=list)
    edges: list[Edge] = field(default_factory=list)
    forks: dict[int, list[str]] = field(default_factory=dict)  # fork node id -> branch names
    placeholder_args: list[str] = field(default_factory=list)
    stopped: str | None = None  # why tracing stopped early, if it did

    def add_node(self, kind: str, label: str, branch: str, **data: Any) -> int:
        self.nodes.append(GraphNode(len(self.nodes), kind, label, branch, data))
        return len(self.nodes) - 1

    def add_edge(self, src: int, dst: int, kind: str, *, label: str | None = None) -> None:
        self.edges.append(Edge(src, dst, kind, label))

    def kinds(self) -> list[str]:
        return [n.kind for n in self.nodes]

    def variables(self) -> list[str]:
        """Names written by gen/select, in program order."""
        names = [n.data.get("name") for n in self.nodes if n.kind in MODEL_KINDS]
        return list(dict.fromkeys(n for n in names if n))

    # ---- what the compiler uses ----

    def static_prefix(self, template: ChatTemplate | None = None) -> str:
        """The text every run starts with: main-branch text up to the first argument, gen,
        select, read or fork. Role turns count only when `template` is given to render them."""
        out: list[str] = []
        roles: list[str] = []
        for node in self.nodes:
            if node.branch != "main":
                continue
            if node.kind == "text":
                if node.data["dynamic"]:
                    out.append(text_before_markers(node.data["text"]))
                    break
                out.append(node.data["text"])
            elif node.kind in ("role_begin", "role_end") and template is not None:
                begin, end = template.role_texts(node.data["role"], roles)
                if node.kind == "role_begin":
                    out.append(begin)
                else:
                    out.append(end)
                    roles.append(node.data["role"])
            else:
                break
        return "".join(out)

    def stretches(self) -> list[list[int]]:
        """The straight-line stretches the lazy interpreter sends, one request each: the node
        ids of each, following the interpreter's rule (stretch.py) in traced order. Only
        stretches with a gen or select are listed: text-only ones cost no request."""
        found: list[list[int]] = []
        lines = {"main": _ReplayLine(self, found)}
        forks: dict[int, stretch.Fork] = {}
        for node in self.nodes:
            line = lines[node.branch]
            match node.kind:
                case "read":
                    stretch.read(line)
                case "fork":
                    branches = [_ReplayLine(self, found) for _ in self.forks[node.id]]
                    forks[node.id] = stretch.Fork(line, branches, node=node.id)
                    lines.update(zip(self.forks[node.id], branches, strict=True))
                case "join":
                    stretch.join(forks[node.data["fork"]], node.id)
                case _:
                    line._record(node.id)
        stretch.finish(lines["main"])
        return found

    # ---- display ----

    def __str__(self) -> str:
        stretches = self.stretches()
        stretch_of = {i: k for k, ids in enumerate(stretches) for i in ids}
        incoming: dict[int, list[str]] = {}
        for e in self.edges:
            if e.kind == "var":
                incoming.setdefault(e.dst, []).append(f"{e.label} <- #{e.src}")
        lines = [f"{self.name}: {len(self.nodes)} nodes, {len(stretches)} request stretch(es)"]
        for n in self.nodes:
            depth = n.branch.count(".")
            stretch = f"S{stretch_of[n.id]}" if n.id in stretch_of else "  "
            label = n.label if len(n.label) <= 70 else n.label[:67] + "..."
            line = f"  {stretch:>3} #{n.id:<3} {'  ' * depth}[{n.branch}] {n.kind:<10} {label!r}"
            if n.id in incoming:
                line += "   (" + ", ".join(incoming[n.id]) + ")"
            lines.append(line)
        if self.stopped:
            lines.append(f"  (tracing stopped: {self.stopped})")
        return "\n".join(lines)

    def to_dot(self) -> str:
        """Graphviz DOT text of the graph (render with `dot -Tpng`)."""

        def esc(s: str) -> str:
            s = s if len(s) <= 60 else s[:57] + "..."
            return s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

        lines = [f'digraph "{esc(self.name)}" {{', '  rankdir=TB;',
                 '  node [shape=box, style="rounded,filled", fontname="Helvetica"];']
        branches: dict[str, list[int]] = {}
        for n in self.nodes:
            branches.setdefault(n.branch, []).append(n.id)
        for n in self.nodes:
            lines.append(f'  n{n.id} [label="{n.kind}\\n{esc(n.label)}", '
                         f'fillcolor="{_COLORS.get(n.kind, "#ffffff")}"];')
        for k, (branch, ids) in enumerate(branches.items()):
            if branch != "main":
                lines.append(f'  subgraph cluster_{k} {{ label="branch {branch}"; '
                             + " ".join(f"n{i};" for i in ids) + " }")
        style = {"next": "", "fork": ' [style=bold]', "join": ' [style=bold]'}
        for e in self.edges:
            attr = (f' [style=dashed, color="#3070c0", label="{esc(e.label or "")}"]'
                    if e.kind == "var" else style[e.kind])
            lines.append(f"  n{e.src} -> n{e.dst}{attr};")
        lines.append("}")
        return "\n".join(lines)

    def draw(self, path: str | None = None, *, dpi: int = 100):
        """Draw with matplotlib; save a PNG to `path` if given. Returns the Figure."""
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        columns: dict[str, int] = {}
        for n in self.nodes:
            columns.setdefault(n.branch, len(columns))
        pos = {n.id: (columns[n.branch] * 3.2, -n.id) for n in self.nodes}
        fig = Figure(figsize=(2.0 + 3.2 * len(columns), 1.0 + 0.55 * max(len(self.nodes), 1)),
                     dpi=dpi)
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        ax.set_axis_off()
        for e in self.edges:
            (x0, y0), (x1, y1) = pos[e.src], pos[e.dst]
            dashed = e.kind == "var"
            ax.annotate("", xy=(x1, y1 + 0.22), xytext=(x0, y0 - 0.22),
                        arrowprops=dict(arrowstyle="->", lw=1.0,
                                        color="#3070c0" if dashed else "#444444",
                                        linestyle="--" if dashed else "-",
                                        connectionstyle="arc3,rad=0.25" if dashed else "arc3"))
        for n in self.nodes:
            x, y = pos[n.id]
            label = n.label if len(n.label) <= 34 else n.label[:31] + "..."
            ax.text(x, y, f"{n.kind}: {label}", ha="center", va="center", fontsize=8,
                    bbox=dict(boxstyle="round,pad=0.3", fc=_COLORS.get(n.kind, "white"),
                              ec="#666666"))
        ax.set_xlim(-1.8, 3.2 * max(len(columns) - 1, 0) + 1.8)
        ax.set_ylim(-len(self.nodes), 1)
        ax.set_title(self.name)
        if path is not None:
            fig.savefig(path)
        return fig


class _ReplayLine(stretch.Line):
    """A traced branch: running a stretch lists the node ids in it."""

    def __init__(self, graph: Graph, found: list[list[int]]):
        super().__init__()
        self.graph = graph
        self.found = found

    def _run_recorded(self) -> bool:
        ids = self._ids(self._take())
        if any(self.graph.nodes[i].kind in MODEL_KINDS for i in ids):
            self.found.append(ids)
        return True

    def _ids(self, items: list) -> list[int]:
        ids = []
        for item in items:
            if isinstance(item, stretch.Fork):
                item.done()
                ids.append(item.node)
                for taken in item.taken:
                    ids += self._ids(taken)
            else:
                ids.append(item)
        return ids
