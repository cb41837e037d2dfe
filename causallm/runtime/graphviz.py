"""The compiled layer graph as Graphviz DOT (``main.py --graph FILE.dot|FILE.svg``).

What ``Model.summarize`` lists, drawn: one box per layer (``Model.getLayerTable``) with its
name, type, output dims and parameter count; one edge per entry of its ``input_layers``, from
the producer to the reader (labelled ``(k)`` when it reads the producer's output k > 0); the
layers of each stage inside a cluster ``cluster_<stage>`` labelled ``stage <name>``, in the
order the stages run (one, ``model``, for a decoder-only or embedding model; ``vision``,
``encoder``, ``decoder`` for the staged ones). An SVG is the DOT laid out by Graphviz's ``dot``
executable, which must be on the PATH.
"""

from __future__ import annotations

import os
import shutil
import subprocess

from causallm.errors import CausalLMError
from causallm.io.files import atomic_write


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def to_dot(model, name: str = "model") -> str:
    """The DOT text of a compiled ``model`` (causallm.runtime.graph.Model)."""
    rows = model.getLayerTable()
    lines = [f"digraph {_quote(name)} {{",
             '  node [shape=box, fontname="monospace", fontsize=10];']
    for stage in model.getStageNames():
        lines += [f"  subgraph {_quote('cluster_' + stage)} {{",
                  f"    label={_quote('stage ' + stage)};"]
        for row in rows:
            if row.stage == stage:
                dims = " ".join(str(d) for d in row.output_dims)
                label = "\\n".join([row.name.replace("\\", "\\\\").replace('"', '\\"'),
                                    row.type, dims, f"{row.params:,} params"])
                lines.append(f'    {_quote(row.name)} [label="{label}"];')
        lines.append("  }")
    for row in rows:
        for producer, k in row.inputs:
            edge = f"  {_quote(producer)} -> {_quote(row.name)}"
            lines.append(edge + (f' [label="({k})"];' if k else ";"))
    lines.append("}")
    return "\n".join(lines) + "\n"


def write_graph(model, path: str, name: str = "model") -> None:
    """Write ``model``'s graph to ``path``: DOT for ``.dot`` / ``.gv``, an SVG laid out by
    Graphviz's ``dot`` for ``.svg`` (without ``dot`` on the PATH, a one-line error saying
    Graphviz is needed). Written to a temporary name and renamed."""
    ext = os.path.splitext(path)[1].lower()
    if ext not in (".dot", ".gv", ".svg"):
        raise CausalLMError(f"--graph {path}: expected a .dot, .gv or .svg file name")
    dot = to_dot(model, name)
    if ext in (".dot", ".gv"):
        data = dot.encode()
    elif ext == ".svg":
        exe = shutil.which("dot")
        if exe is None:
            raise CausalLMError(f"--graph {path}: an SVG needs Graphviz's 'dot' program on the "
                                f"PATH (install graphviz, or write FILE.dot)")
        done = subprocess.run([exe, "-Tsvg"], input=dot.encode(), capture_output=True)
        if done.returncode != 0:
            message = done.stderr.decode(errors="replace").strip().splitlines()
            raise CausalLMError(f"--graph {path}: dot failed: "
                                f"{message[0] if message else f'status {done.returncode}'}")
        data = done.stdout
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise CausalLMError(f"--graph {path}: no such directory {folder}")
    try:
        atomic_write(path, lambda f: f.write(data))
    except OSError as e:
        raise CausalLMError(f"--graph {path}: cannot write it ({e.strerror or e})") from None
