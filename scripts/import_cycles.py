#!/usr/bin/env python3
"""Import circles between the files of a crate.

Usage: scripts/import_cycles.py [CRATE_DIR ...]   (default: every crates/*)

Each file under src/ is a module (`src/a/b.rs` and `src/a/b/mod.rs` are
`a::b`). A file depends on another when it names an item there: a `use`
(groups expanded) or an inline path starting `crate::`, `super::`,
`self::` or the name of a child module the file declares (`mod x;`). Paths are resolved to the longest module prefix, so
`crate::a::b::Item` is a dependency on `a::b` when that module exists.
The crate root (lib.rs, main.rs) is left out: it declares and re-exports
everything by design; so are re-exports (`pub use`) anywhere. A module and the modules declared inside it are one
unit of the graph only if they are in one file (inline `mod x { .. }`
blocks, such as tests).

Prints every strongly connected component of more than one file, with one
edge path per circle, and exits 1 if there is any; exits 0 otherwise.
"""
import os
import re
import sys

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def strip_comments_and_strings(src):
    out = []
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            i = n if j < 0 else j
        elif src.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if src.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif src.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    if src[i] == "\n":
                        out.append("\n")
                    i += 1
        elif c == "r" and re.match(r'r#*"', src[i:i + 10]) and (i == 0 or not (src[i - 1].isalnum() or src[i - 1] == "_")):
            m = re.match(r'r(#*)"', src[i:])
            end = '"' + m.group(1)
            j = src.find(end, i + len(m.group(0)))
            j = n if j < 0 else j + len(end)
            out.append('""')
            i = j
        elif c == '"':
            i += 1
            while i < n and src[i] != '"':
                i += 2 if src[i] == "\\" else 1
            i += 1
            out.append('""')
        elif c == "'":
            # char literal or lifetime
            m = re.match(r"'(\\.|[^\\'])'", src[i:i + 12]) or re.match(r"'\\u\{[0-9a-fA-F]+\}'", src[i:i + 14])
            if m:
                out.append("' '")
                i += len(m.group(0))
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def modules_of(src_dir):
    mods = {}
    for root, _, files in os.walk(src_dir):
        for f in files:
            if not f.endswith(".rs"):
                continue
            p = os.path.join(root, f)
            rel = os.path.relpath(p, src_dir)[:-3].split(os.sep)
            if rel[-1] == "mod":
                rel = rel[:-1]
            if rel in (["lib"], ["main"]):
                key = ()
            elif rel[0] == "bin":
                continue
            else:
                key = tuple(rel)
            mods[key] = p
    return mods


def expand_use(tree):
    """'a::{b, c::{d, e}}' -> ['a::b', 'a::c::d', 'a::c::e']"""
    tree = re.sub(r"\s+", "", tree)
    def split_top(s):
        parts, depth, cur = [], 0, ""
        for ch in s:
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            if ch == "," and depth == 0:
                parts.append(cur)
                cur = ""
            else:
                cur += ch
        if cur:
            parts.append(cur)
        return parts
    def rec(s):
        i = s.find("{")
        if i < 0:
            return [s]
        prefix = s[:i]
        inner = s[i + 1:s.rfind("}")]
        res = []
        for part in split_top(inner):
            for r in rec(part):
                res.append(prefix + r)
        return res
    out = []
    for p in rec(tree):
        p = re.sub(r"\bas\b.*$", "", p)
        out.append(p)
    return out


def resolve(path, cur, mods):
    segs = [s for s in path.split("::") if s]
    if not segs:
        return None
    if segs[0] == "crate":
        base, segs = [], segs[1:]
    elif segs[0] in ("super", "self"):
        base = list(cur)
        while segs and segs[0] in ("super", "self"):
            if segs[0] == "super":
                if not base:
                    return None
                base.pop()
            segs = segs[1:]
    else:
        return None
    full = base + segs
    for k in range(len(full), -1, -1):
        if tuple(full[:k]) in mods:
            return tuple(full[:k])
    return None


def deps_of(key, path, mods):
    src = strip_comments_and_strings(open(path, encoding="utf-8").read())
    deps = set()
    # inline modules: track `mod x {` scopes by brace depth
    scope = []  # (name, depth at open)
    depth = 0
    # child modules declared here (`mod x;`) are named without a prefix
    children = [c for c in re.findall(r"\bmod\s+(" + IDENT + r")\s*;", src) if key + (c,) in mods]
    roots = ["crate", "super", "self"] + children
    token = re.compile(r"\bmod\s+(" + IDENT + r")\s*\{|\bpub(?:\s*\([^)]*\))?\s+use\s+[^;]*;|\buse\s+([^;]*);|(?<![:\w])((?:" + "|".join(roots) + r")(?:\s*::\s*" + IDENT + r")+)|[{}]")
    for m in token.finditer(src):
        cur = list(key) + [s for s, _ in scope]
        if m.group(1):
            depth += 1
            scope.append((m.group(1), depth))
            continue
        t = m.group(0)
        if t == "{":
            depth += 1
            continue
        if t == "}":
            if scope and scope[-1][1] == depth:
                scope.pop()
            depth -= 1
            continue
        if m.group(2) is not None:
            paths = expand_use(m.group(2))
        elif m.group(3) is not None:
            paths = [re.sub(r"\s+", "", m.group(3))]
        else:
            continue  # a re-export (`pub use`) is a facade, not a dependency
        for p in paths:
            if p.startswith("::"):
                continue
            if p.split("::")[0] in children and not scope:
                p = "self::" + p
            r = resolve(p, tuple(cur), mods)
            if r is not None:
                deps.add(r)
    deps.discard(key)
    deps.discard(())
    return deps


def sccs(graph):
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]
    sys.setrecursionlimit(10000)
    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(comp)
    for v in graph:
        if v not in index:
            strong(v)
    return out


def cycle_path(graph, comp):
    comp = set(comp)
    start = sorted(comp)[0]
    # BFS back to start
    prev = {start: None}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph.get(v, ())):
            if w not in comp:
                continue
            if w == start:
                path = [v]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return list(reversed(path)) + [start]
            if w not in prev:
                prev[w] = v
                queue.append(w)
    return [start]


def name(k):
    return "::".join(k) if k else "crate"


def check(crate_dir):
    src = os.path.join(crate_dir, "src")
    if not os.path.isdir(src):
        return 0
    mods = modules_of(src)
    graph = {}
    for k, p in mods.items():
        if k == ():
            continue
        graph[k] = deps_of(k, p, mods)
    bad = [c for c in sccs(graph) if len(c) > 1]
    for c in bad:
        path = cycle_path(graph, c)
        print(f"{crate_dir}: import circle among {', '.join(sorted(name(k) for k in c))}")
        print(f"    e.g. {' -> '.join(name(k) for k in path)}")
    return len(bad)


def main():
    dirs = sys.argv[1:]
    if not dirs:
        root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "crates")
        dirs = sorted(os.path.join(root, d) for d in os.listdir(root))
    n = sum(check(d) for d in dirs)
    if n:
        print(f"{n} import circle(s)")
        return 1
    print("no import circles")
    return 0


if __name__ == "__main__":
    sys.exit(main())
