"""The crate's import rules, checked on its source (outside test modules):

- no two modules import each other, directly or around a circle (modules are the crate's
  top-level ones, and the files of runtime/, protocol/, sim/ and transport/tcp/);
- protocol/ imports nothing of the crate but ids, error, codec and itself.

Prints what breaks a rule and exits 1; `-v` prints the whole graph.
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
    return "::".join(parts) if parts != ["lib"] else "lib"


def unit(module):
    parts = module.split("::")
    if parts[0] in ("runtime", "protocol", "sim") and len(parts) > 1:
        return "::".join(parts[:2])
    if parts[:2] == ["transport", "tcp"] and len(parts) > 2:
        return "::".join(parts[:3])
    return parts[0]


def exists(u):
    base = ROOT / u.replace("::", "/")
    return base.with_suffix(".rs").exists() or (base / "mod.rs").exists()


def resolve(path):
    """The module a path names: its longest prefix that is a file (an item of a module
    named by the module)."""
    parts = path.split("::")
    while parts and not exists("::".join(parts)):
        parts.pop()
    return unit("::".join(parts)) if parts else None


edges = {}
for path in ROOT.rglob("*.rs"):
    if path.name == "tests.rs":
        continue
    text = path.read_text()
    test_module = re.search(r"#\[cfg\(test\)\]\s*mod tests", text)
    if test_module:
        text = text[: test_module.start()]
    text = re.sub(r"//.*", "", text)
    module = module_of(path)
    u = unit(module)
    base = module.split("::")
    if path.name != "mod.rs":
        base = base[:-1]
    targets = {resolve(ref) for ref in re.findall(r"crate::([a-z_]+(?:::[a-z_]+)*)", text)}
    targets |= {
        resolve("::".join(base + ref.split("::")))
        for ref in re.findall(r"\bsuper::([a-z_]+(?:::[a-z_]+)*)", text)
    }
    edges.setdefault(u, set()).update(t for t in targets if t and t != u)

broken = []
for u, targets in sorted(edges.items()):
    if u.split("::")[0] == "protocol":
        for t in sorted(targets):
            if t.split("::")[0] not in PROTOCOL_MAY_IMPORT | {"protocol"}:
                broken.append(f"{u} imports {t}: protocol may import only {sorted(PROTOCOL_MAY_IMPORT)}")

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
            broken.append("import circle: " + " <-> ".join(sorted(component)))


for v in list(edges):
    if v not in index:
        connect(v)

if "-v" in sys.argv:
    for u in sorted(edges):
        print(u, "->", " ".join(sorted(edges[u])))
for line in broken:
    print(line)
sys.exit(1 if broken else 0)
