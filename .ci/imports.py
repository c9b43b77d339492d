"""The crate's import rules, checked on its source (outside test modules):

- no two modules import each other, directly or around a circle. A module is a file
  (`foo.rs`, or `foo/mod.rs` for `foo`); a module may use its ancestors' items (a
  parent is the room its children share), so only edges to a module that is not an
  ancestor make a circle — two siblings that import each other do;
- every import names the module an item lives in: no `crate::Item` through the crate
  root's re-exports (those are for users);
- protocol/ imports nothing of the crate but ids, error, codec and itself.

Paths are read from `use` trees (braces expanded) and from paths in code, and resolved
as Rust resolves them: `crate::`, `super::` (from a `mod.rs`, the parent of the
directory), `self::`. Prints what breaks a rule and exits 1; `-v` prints the graph.
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent / "src"
PROTOCOL_MAY_IMPORT = {"ids", "error", "codec"}


def module_of(path):
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "mod":
        parts = parts[:-1]
    if parts in (["lib"], ["main"]) or parts[0] == "bin":
        return None
    return tuple(parts)


MODULES = {m for m in (module_of(p) for p in ROOT.rglob("*.rs")) if m}


def expand(tree):
    """The paths a `use` tree names: `a::{b, c::{d, e}}` gives a::b, a::c::d, a::c::e."""
    tree = re.sub(r"\s+", "", tree)
    depth, start = 0, None
    for i, ch in enumerate(tree):
        if ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                prefix, inner, rest = tree[:start], tree[start + 1 : i], tree[i + 1 :]
                parts, depth2, last = [], 0, 0
                for j, c in enumerate(inner):
                    depth2 += c == "{"
                    depth2 -= c == "}"
                    if c == "," and depth2 == 0:
                        parts.append(inner[last:j])
                        last = j + 1
                parts.append(inner[last:])
                out = []
                for part in filter(None, parts):
                    for sub in expand(part):
                        out.append(prefix + sub if sub != "self" else prefix.rstrip(":"))
                return out
    return [re.sub(r"\bas\b.*", "", tree)]


def absolute(module, path):
    """The crate-absolute segments of `path` as written in `module` (None if it is not
    a path into the crate)."""
    segs = [s for s in path.split("::") if s]
    if not segs:
        return None
    if segs[0] == "crate":
        return segs[1:]
    base = list(module)
    if segs[0] in ("super", "self"):
        while segs and segs[0] in ("super", "self"):
            if segs.pop(0) == "super":
                if not base:
                    return None
                base.pop()
        return base + segs
    return None


def target(segs):
    """The module an absolute path names: its longest prefix that is a module."""
    parts = list(segs)
    while parts and tuple(parts) not in MODULES:
        parts.pop()
    return tuple(parts) if parts else None


def ancestor(a, b):
    """Is `a` an ancestor of `b`?"""
    return len(a) < len(b) and b[: len(a)] == a


def name(m):
    return "::".join(m)


edges, broken = {}, []
for path in sorted(ROOT.rglob("*.rs")):
    module = module_of(path)
    if module is None or path.name == "tests.rs":
        continue
    text = path.read_text()
    test_module = re.search(r"#\[cfg\(test\)\]\s*mod tests", text)
    if test_module:
        text = text[: test_module.start()]
    text = re.sub(r"//.*", "", text)
    paths = []
    for tree in re.findall(r"\buse\s+([^;]+);", text):
        paths += expand(tree)
    text_without_uses = re.sub(r"\buse\s+[^;]+;", "", text)
    paths += re.findall(r"\b(?:crate|super|self)(?:::[A-Za-z_][A-Za-z0-9_]*)+", text_without_uses)
    for p in paths:
        segs = absolute(module, p)
        if segs is None:
            continue
        if p.split("::")[0] == "crate" and segs and tuple(segs[:1]) not in MODULES:
            line = f"{path.relative_to(ROOT)}: `crate::{segs[0]}` goes through the crate root; name the module `{segs[0]}` is in"
            if line not in broken:
                broken.append(line)
            continue
        t = target(segs)
        if t is None or t == module or ancestor(t, module):
            continue
        edges.setdefault(module, set()).add(t)

for u, targets in sorted(edges.items()):
    if u[0] == "protocol":
        for t in sorted(targets):
            if t[0] not in PROTOCOL_MAY_IMPORT | {"protocol"}:
                broken.append(f"{name(u)} imports {name(t)}: protocol may import only {sorted(PROTOCOL_MAY_IMPORT)}")

# Circles: Tarjan's strongly connected components.
index, low, stack, on_stack, counter = {}, {}, [], set(), [0]
sys.setrecursionlimit(10_000)


def connect(v):
    index[v] = low[v] = counter[0]
    counter[0] += 1
    stack.append(v)
    on_stack.add(v)
    for w in edges.get(v, ()):
        if w not in index:
            connect(w)
            low[v] = min(low[v], low[w])
        elif w in on_stack:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        component = []
        while True:
            w = stack.pop()
            on_stack.discard(w)
            component.append(w)
            if w == v:
                break
        if len(component) > 1:
            broken.append("import circle: " + " <-> ".join(sorted(name(c) for c in component)))


for v in list(edges):
    if v not in index:
        connect(v)

if "-v" in sys.argv:
    for u in sorted(edges):
        print(name(u), "->", " ".join(sorted(name(t) for t in edges[u])))
for line in broken:
    print(line)
sys.exit(1 if broken else 0)
