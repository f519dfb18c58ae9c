#!/usr/bin/env python3
"""The structure checks of src/ (issue 28): sizes, layers and file circles.

Reports
  (a) files over MAX_FILE_LINES lines,
  (b) functions over MAX_FN_LINES lines (from the `fn` line to its closing brace),
  (c) imports from a lower layer to a higher one (LAYERS below; docs/DESIGN.md's module
      map says the same),
  (d) file circles: file A names an item of file B and B one of A (a module's own
      `mod.rs` and the files under it are parent and child, not a circle).

Imports are `use` trees and `crate::`/`super::`/`self::` paths in code; code under
`#[cfg(test)]` (inline test modules, and files declared `#[cfg(test)] mod x;`) is left out
of (c) and (d), but counted in (a) and (b).

Not everything is fixed at once: KNOWN lists today's offenders with their size. The check
fails on a new offender, on one that grew, and on an entry of KNOWN that is fixed or
smaller than listed (lower it: the list only shrinks). `--print-known` prints the list as
it should be now.

Python 3 standard library only. Exit 0 clean, 1 violations, 2 bad use.
"""

import pathlib
import re
import sys

MAX_FILE_LINES = 800
MAX_FN_LINES = 120

# Lower layers first. A module may import its own layer and those before it, never one
# after it. `apiserver` (the in-memory API server) and `metrics` (the registry prefix)
# import nothing of the crate.
LAYERS = [
    ["metrics", "apiserver"],
    ["api"],
    ["estimate"],
    ["plan"],
    ["inventory"],
    ["decide"],
    ["kinds", "kueue", "webhook", "operator", "agent"],
    ["cli", "simulate"],
]

# Today's offenders. Keys: "file" (lines), "file::fn" (lines), "file -> module" (import
# sites of a higher layer), "a <-> b" (a file circle; the value is always 1).
KNOWN = {
}


# ---------------------------------------------------------------- reading Rust


def blank_comments_and_strings(text):
    """The text with comments, string and char literals turned to spaces (newlines kept),
    so that braces, `fn` and paths found afterwards are code."""
    out = []
    i, n = 0, len(text)

    def blank(s):
        return "".join(c if c == "\n" else " " for c in s)

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(blank(text[i:j]))
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(blank(text[i:j]))
            i = j
        elif c in "rb" and re.match(r"(?:br|r)#*\"", text[i:i + 300]) and not (
            i > 0 and (text[i - 1].isalnum() or text[i - 1] == "_")
        ):
            m = re.match(r"(?:br|r)(#*)\"", text[i:])
            hashes = m.group(1)
            end = text.find('"' + hashes, i + m.end())
            j = n if end < 0 else end + 1 + len(hashes)
            out.append('""' + blank(text[i + 2:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append('""' + blank(text[i + 2:j]))
            i = j
        elif c == "'":
            # A char literal ('x', '\n', '\u{..}') or a lifetime ('a).
            if i + 1 < n and text[i + 1] == "\\":
                j = text.find("'", i + 3)
                j = n if j < 0 else j + 1
                out.append(blank(text[i:j]))
                i = j
            elif i + 2 < n and text[i + 2] == "'":
                out.append("   ")
                i += 3
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def matching_brace(code, open_at):
    depth = 0
    for j in range(open_at, len(code)):
        if code[j] == "{":
            depth += 1
        elif code[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return len(code) - 1


def line_of(code, pos):
    return code.count("\n", 0, pos) + 1


def functions(code):
    """(name, lines) of every function with a body."""
    found = []
    for m in re.finditer(r"\bfn\s+([A-Za-z_][A-Za-z0-9_]*)", code):
        depth, j = 0, m.end()
        while j < len(code):
            ch = code[j]
            if ch in "([<":
                depth += 1
            elif ch in ")]>" and not (ch == ">" and code[j - 1] == "-"):
                depth -= 1
            elif ch == ";" and depth <= 0:
                j = -1
                break
            elif ch == "{" and depth <= 0:
                break
            j += 1
        if j < 0 or j >= len(code):
            continue
        end = matching_brace(code, j)
        found.append((m.group(1), line_of(code, end) - line_of(code, m.start()) + 1))
    return found


def strip_cfg_test(code):
    """The code without items under `#[cfg(test)]`, and the names of `mod x;` declared
    under it (test files)."""
    test_mods = set()
    out, pos = [], 0
    for m in re.finditer(r"#\[cfg\(test\)\]", code):
        if m.start() < pos:
            continue
        rest = code[m.end():]
        decl = re.match(r"(?:\s*#\[[^\]]*\])*\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", rest)
        if decl:
            test_mods.add(decl.group(1))
            out.append(code[pos:m.start()])
            pos = m.end() + decl.end()
            continue
        brace, semi = code.find("{", m.end()), code.find(";", m.end())
        if brace < 0 or (0 <= semi < brace):
            end = semi
        else:
            end = matching_brace(code, brace)
        out.append(code[pos:m.start()])
        out.append("\n" * code.count("\n", m.start(), end + 1))
        pos = end + 1
    out.append(code[pos:])
    return "".join(out), test_mods


def expand_use_tree(tree):
    """`a::{b, c::{d, e}}` -> ["a::b", "a::c::d", "a::c::e"] (aliases and globs dropped)."""
    tree = re.sub(r"\s+", "", tree)
    depth = 0
    for k, ch in enumerate(tree):
        if ch == "{":
            if depth == 0:
                prefix = tree[:k]
                inner = tree[k + 1:matching_close(tree, k)]
                paths = []
                for part in split_top(inner):
                    for p in expand_use_tree(part):
                        paths.append((prefix + p) if p != "self" else prefix.rstrip(":"))
                return paths
            depth += 1
    return [tree.rstrip(":*").rstrip(":")]


def matching_close(s, k):
    depth = 0
    for j in range(k, len(s)):
        if s[j] == "{":
            depth += 1
        elif s[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return len(s)


def split_top(s):
    parts, depth, start = [], 0, 0
    for j, ch in enumerate(s):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(s[start:j])
            start = j + 1
    parts.append(s[start:])
    return [p for p in parts if p]


def referenced_paths(code):
    """Every path the code names through `use` or as `crate::`, `super::`, `self::`."""
    paths = []
    for m in re.finditer(r"\buse\s+([^;]+);", code):
        tree = re.sub(r"\s+as\s+\w+", "", m.group(1))
        paths.extend(expand_use_tree(tree))
    without_uses = re.sub(r"\buse\s+[^;]+;", "", code)
    for m in re.finditer(r"\b(?:crate|super|self)(?:::[A-Za-z_][A-Za-z0-9_]*)+", without_uses):
        paths.append(m.group(0))
    return paths


# ---------------------------------------------------------------- the crate's tree


class Crate:
    def __init__(self, src):
        self.src = pathlib.Path(src)
        self.files = sorted(p for p in self.src.rglob("*.rs"))
        self.text = {p: p.read_text(encoding="utf-8") for p in self.files}
        self.code = {p: blank_comments_and_strings(t) for p, t in self.text.items()}
        self.live, self.test_files = {}, set()
        for p, code in self.code.items():
            live, test_mods = strip_cfg_test(code)
            self.live[p] = live
            for name in test_mods:
                for child in (self.dir_of(p) / f"{name}.rs", self.dir_of(p) / name / "mod.rs"):
                    self.test_files.add(child)
        # A test file's own children are test code too.
        for p in self.files:
            if any(parent in self.test_files for parent in self.ancestors(p)):
                self.test_files.add(p)

    def rel(self, p):
        return p.relative_to(self.src.parent).as_posix()

    def module_of(self, p):
        """src/a/b.rs -> ["a", "b"]; src/a/mod.rs -> ["a"]; src/lib.rs -> []."""
        parts = list(p.relative_to(self.src).with_suffix("").parts)
        if parts[-1] == "mod" or (len(parts) == 1 and parts[0] in ("lib", "main")):
            parts = parts[:-1]
        return parts

    def dir_of(self, p):
        """The folder a file's child modules live in."""
        if p.name == "mod.rs" or p.parent == self.src and p.stem in ("lib", "main"):
            return p.parent
        return p.parent / p.stem

    def file_of(self, module):
        base = self.src.joinpath(*module) if module else self.src
        for cand in ((base.with_suffix(".rs"),) if module else ()) + (base / "mod.rs", base / "lib.rs"):
            if cand in self.text:
                return cand
        return None

    def ancestors(self, p):
        mod = self.module_of(p)
        return [f for k in range(len(mod)) if (f := self.file_of(mod[:k])) and f != p]

    def resolve(self, p, path):
        """The deepest file of the crate a path leads to, or None for an outside crate."""
        segs = path.split("::")
        here = self.module_of(p)
        if segs[0] == "crate":
            mod, segs = [], segs[1:]
        elif segs[0] in ("super", "self"):
            mod = here
            while segs and segs[0] in ("super", "self"):
                if segs[0] == "super":
                    mod = mod[:-1]
                segs = segs[1:]
        elif self.file_of(here + [segs[0]]) is not None:
            mod = here
        else:
            return None
        best = self.file_of(mod)
        for s in segs:
            f = self.file_of(mod + [s])
            if f is None:
                break
            mod, best = mod + [s], f
        return best


def layer_of(module):
    for k, names in enumerate(LAYERS):
        if module in names:
            return k
    return None


def violations(src):
    """{key: size} of everything over the rules in the crate under `src`."""
    crate = Crate(src)
    found = {}
    for p in crate.files:
        rel = crate.rel(p)
        lines = crate.text[p].count("\n") + (0 if crate.text[p].endswith("\n") else 1)
        if lines > MAX_FILE_LINES:
            found[rel] = lines
        for name, n in functions(crate.code[p]):
            if n > MAX_FN_LINES:
                key = f"{rel}::{name}"
                found[key] = max(found.get(key, 0), n)

    edges = {}
    for p in crate.files:
        if p in crate.test_files:
            continue
        mine = crate.module_of(p)
        top = mine[0] if mine else None
        own = layer_of(top)
        for path in referenced_paths(crate.live[p]):
            target = crate.resolve(p, path)
            if target is None or target == p:
                continue
            theirs = crate.module_of(target)
            if own is not None and theirs:
                other = layer_of(theirs[0])
                if other is not None and other > own:
                    key = f"{crate.rel(p)} -> {theirs[0]}"
                    found[key] = found.get(key, 0) + 1
            if target in crate.ancestors(p) or p in crate.ancestors(target):
                continue
            edges.setdefault(p, set()).add(target)
    for a, targets in edges.items():
        for b in targets:
            if a in edges.get(b, ()) and crate.rel(a) < crate.rel(b):
                found[f"{crate.rel(a)} <-> {crate.rel(b)}"] = 1
    return found


def kind(key):
    if "<->" in key:
        return "file circle"
    if " -> " in key:
        return "import from a lower layer to a higher one"
    if "::" in key:
        return f"function over {MAX_FN_LINES} lines"
    return f"file over {MAX_FILE_LINES} lines"


def compare(found, known):
    """(failures, left): lines that fail the check, and the known offenders still there."""
    failures, left = [], []
    for key, size in sorted(found.items()):
        if key not in known:
            failures.append(f"new: {key} ({kind(key)}, {size})")
        elif size > known[key]:
            failures.append(f"grew: {key} ({kind(key)}) {known[key]} -> {size}")
        else:
            left.append(f"{key} ({kind(key)}, {size})")
            if size < known[key]:
                failures.append(f"shrank: {key} {known[key]} -> {size}: lower it in KNOWN")
    for key in sorted(set(known) - set(found)):
        failures.append(f"fixed: {key}: remove it from KNOWN")
    return failures, left


def main(argv):
    root = pathlib.Path(__file__).resolve().parent.parent
    args = argv[1:]
    if args and args[0] not in ("--print-known",):
        print(f"usage: {argv[0]} [--print-known]", file=sys.stderr)
        return 2
    found = violations(root / "src")
    if args:
        print("KNOWN = {")
        for key, size in sorted(found.items()):
            print(f"    {key!r}: {size},")
        print("}")
        return 0
    failures, left = compare(found, KNOWN)
    counts = {}
    for key in found:
        counts[kind(key)] = counts.get(kind(key), 0) + 1
    print(f"structure of src/: {len(left)} known offenders left", end="")
    print("".join(f"; {n} {k}" for k, n in sorted(counts.items())) or "")
    for line in left:
        print(f"  left: {line}")
    for line in failures:
        print(f"FAIL {line}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
