#!/usr/bin/env python3
"""Fails when a crate's top-level modules import each other in a cycle.

A cycle hides the layering: neither side can be read, tested or moved without the other. Run by
`make lint` and `make check` on every crate of the workspace (`python3 scripts/module-cycles.py
gateway/src egress-proxy/src ...`; with no argument, the gateway and the egress proxy); prints
each cycle with one place where each of its edges is written, and exits 1.

An edge a -> b is any path to b from code in a's files (`crate::b`, `use crate::{b, ...}`, or
`super::...` climbing to the crate root), outside comments, string literals and `#[cfg(test)]`
modules (a unit test may reach upward). The crate roots (`lib.rs`, `main.rs`) wire the modules
together and are not modules themselves.
"""

import os
import re
import sys

ROOTS = {"lib.rs", "main.rs"}


def code_only(text):
    """`text` with comments, string and char literals blanked (newlines kept, for line numbers)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            end = text.find("\n", i)
            i = n if end < 0 else end
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    out.append("\n" if text[i] == "\n" else " ")
                    i += 1
        elif (m := re.compile(r'b?r(#*)"').match(text, i)) and not _ident_before(text, i):
            close = '"' + m.group(1)
            end = text.find(close, m.end())
            end = n if end < 0 else end + len(close)
            out.append("\n" * text.count("\n", i, end))
            i = end
        elif c == '"':
            i += 1
            while i < n and text[i] != '"':
                if text[i] == "\n":
                    out.append("\n")
                i += 2 if text[i] == "\\" else 1
            i += 1
        elif c == "'" and (m := re.compile(r"'(\\.[^']*|[^'\\])'").match(text, i)):
            i = m.end()
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _ident_before(text, i):
    return i > 0 and (text[i - 1].isalnum() or text[i - 1] == "_")


def without_test_modules(code):
    """`code` with each `#[cfg(test)] mod name { ... }` blanked."""
    for m in reversed(list(re.finditer(r"#\[cfg\(test\)\]\s*(pub(\([^)]*\))?\s+)?mod\s+\w+\s*\{", code))):
        depth, j = 1, m.end()
        while j < len(code) and depth:
            depth += {"{": 1, "}": -1}.get(code[j], 0)
            j += 1
        code = code[: m.start()] + re.sub(r"[^\n]", " ", code[m.start() : j]) + code[j:]
    return code


def references(code, depth):
    """(top-level name, offset) of each path from this file to the crate root's children."""
    for m in re.finditer(r"\bcrate::(\w+)", code):
        yield m.group(1), m.start()
    for m in re.finditer(r"\bcrate::\{", code):
        # `use crate::{a::x, b, c::{d, e}}`: the first name of each item at the top level.
        level, j, start = 1, m.end(), m.end()
        while j < len(code) and level:
            level += {"{": 1, "}": -1}.get(code[j], 0)
            if level == 0 or (level == 1 and code[j] == ","):
                yield from _first_name(code, start, j)
                start = j + 1
            j += 1
    for m in re.finditer(r"\b((?:super::)+)(\w+)", code):
        if m.group(1).count("super") >= depth:
            yield m.group(2), m.start()


def _first_name(code, start, end):
    m = re.compile(r"\s*(\w+)").match(code, start, end)
    if m and m.group(1) != "self":
        yield m.group(1), m.start(1)


def edges(src):
    """{a: {b: "file:line"}} over the top-level modules of `src`."""
    tops = {
        name.removesuffix(".rs")
        for name in os.listdir(src)
        if name not in ROOTS and (name.endswith(".rs") or os.path.isdir(os.path.join(src, name)))
    }
    found = {top: {} for top in tops}
    for root, _, files in os.walk(src):
        for name in sorted(files):
            path = os.path.join(root, name)
            rel = os.path.relpath(path, src)
            parts = rel.removesuffix(".rs").split(os.sep)
            if not name.endswith(".rs") or rel in ROOTS:
                continue
            if parts[-1] == "mod":
                parts.pop()
            with open(path, encoding="utf-8") as file:
                code = without_test_modules(code_only(file.read()))
            for target, offset in references(code, len(parts)):
                if target in tops and target != parts[0]:
                    line = code.count("\n", 0, offset) + 1
                    found[parts[0]].setdefault(target, f"{os.path.join(src, rel)}:{line}")
    return found


def cycles(graph):
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return out


def main(args):
    srcs = args or ["gateway/src", "egress-proxy/src"]
    failed = False
    for src in srcs:
        graph = edges(src)
        for component in cycles(graph):
            failed = True
            print(f"{src}: modules in an import cycle: {{{', '.join(component)}}}")
            for a in component:
                for b, where in sorted(graph[a].items()):
                    if b in component:
                        print(f"  {a} -> {b}  ({where})")
    if failed:
        print(
            "Move the piece both sides need below them (or put it behind a trait the lower "
            "module defines), so each module only uses the ones beneath it."
        )
        return 1
    print(f"no import cycles between the top-level modules of {', '.join(srcs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
