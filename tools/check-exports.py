#!/usr/bin/env python3
"""The public surface: what libfathom.so exports must be what include/fathom declares.

  check-exports.py LIBFATHOM_SO INCLUDE_DIR   check (the ctest `public_exports`)
  check-exports.py --mark HEADER...           put FM_API on every unmarked public prototype

The check fails (exit 1, naming each symbol) when
  - the shared library exports a name that no public header declares with FM_API,
  - it exports a name that does not start with fm_,
  - a public header declares a function without FM_API (it would be hidden), or
  - a header declares an FM_API function the library does not export (no definition,
    or the defining file does not include the header, so the symbol stays hidden).
The headers are read as text: comments and preprocessor lines are blanked, and the
top-level declarations (outside struct/enum bodies and inline function bodies) are
the ones that must carry FM_API. The unary activations (group ACT in ops.def), whose
prototypes ops.h generates from ops.def, are read from ops.def.
"""
import re
import subprocess
import sys
from pathlib import Path

# Names the linker itself defines in every shared object; not part of the API.
LINKER_NAMES = {"_init", "_fini", "__bss_start", "_edata", "_end"}


def blank(text):
    """Comments and preprocessor lines replaced by spaces (offsets and newlines kept)."""
    out = list(text)
    i, n = 0, len(text)
    line_start = True
    while i < n:
        c = text[i]
        if line_start and c == "#":  # a directive, with its backslash continuations
            j = i
            while j < n and not (text[j] == "\n" and text[j - 1] != "\\"):
                j += 1
            for k in range(i, j):
                if out[k] != "\n":
                    out[k] = " "
            i = j
            continue
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            i = j + 1
            line_start = False
            continue
        else:
            if c == "\n":
                line_start = True
            elif not c.isspace():
                line_start = False
            i += 1
            continue
        for k in range(i, j):
            if out[k] != "\n":
                out[k] = " "
        i = j
    return "".join(out)


def declarations(text):
    """(offset, top-level text) of each top-level function or extern declaration."""
    src = re.sub(r'extern\s*"C"\s*\{', lambda m: " " * len(m.group(0)), blank(text))
    decls = []
    depth, start, flat, had_paren_before_body = 0, None, [], False
    for i, c in enumerate(src):
        if depth == 0 and start is None and not c.isspace() and c not in ";}":
            start, flat, had_paren_before_body = i, [], False
        if c == "{":
            if depth == 0 and start is not None:
                had_paren_before_body = "(" in "".join(flat)
            depth += 1
            continue
        if c == "}":
            if depth == 0:  # the end of extern "C" { ... }
                start = None
                continue
            depth -= 1
            if depth == 0 and had_paren_before_body:  # an inline function's body ended
                start = None
            continue
        if depth > 0 or start is None:
            continue
        if c == ";":
            stmt = " ".join("".join(flat).split())
            words = stmt.split()
            if words and words[0] not in ("typedef", "static") and ("(" in stmt or words[0] == "extern"):
                decls.append((start, stmt))
            start = None
            continue
        flat.append(c)
    return decls


def declared_name(stmt):
    for m in re.finditer(r"([A-Za-z_]\w*)\s*\(", stmt):
        if m.group(1) not in ("__attribute__", "FM_API"):
            return m.group(1)
    m = re.search(r"([A-Za-z_]\w*)\s*(\[[^\]]*\]\s*)*$", stmt)  # an extern variable
    return m.group(1) if m else None


def has_mark(stmt):
    return re.match(r"(extern\s+)?FM_API\b", stmt) is not None


def mark(paths):
    for p in map(Path, paths):
        text = p.read_text()
        todo = [off for off, stmt in declarations(text) if not has_mark(stmt)]
        for off in reversed(todo):
            text = text[:off] + "FM_API " + text[off:]
        if todo:
            p.write_text(text)
            print(f"{p}: FM_API added to {len(todo)} declarations")


def generated(include_dir):
    """fm_<name> for each ops.def line of group ACT: ops.h declares them (FM_API) through
    an X-macro over ops.def, which the text scan above does not expand."""
    d = Path(include_dir) / "ops.def"
    text = blank(d.read_text()) if d.exists() else ""
    return ["fm_" + m.group(1) for m in re.finditer(r"\bX\(\s*\w+\s*,\s*(\w+)\s*,[^)]*,\s*ACT\s*\)", text)]


def check(lib, include_dir):
    declared, errors = {}, []
    for h in sorted(Path(include_dir).glob("*.h")):
        for _, stmt in declarations(h.read_text()):
            name = declared_name(stmt)
            if not has_mark(stmt):
                errors.append(f"{h.name}: {name} is declared without FM_API (it would not be exported)")
            elif name:
                declared[name] = h.name
    for name in generated(include_dir):
        declared[name] = "ops.h (generated from ops.def)"
    nm = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True)
    if nm.returncode != 0:
        sys.exit(f"check-exports: nm -D failed on {lib}: {nm.stderr.strip()}")
    exported = set()
    for line in nm.stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] != "A" and parts[2] not in LINKER_NAMES:
            exported.add(parts[2].split("@")[0])
    for name in sorted(exported - declared.keys()):
        if not name.startswith("fm_"):
            errors.append(f"{name}: exported, and not an fm_ name (build with hidden visibility)")
        else:
            errors.append(f"{name}: exported but not declared FM_API in {include_dir}")
    for name in sorted(declared.keys() - exported):
        errors.append(f"{declared[name]}: {name} is declared FM_API but {Path(lib).name} does not export it")
    for e in errors:
        print("check-exports: " + e)
    print(f"check-exports: {len(exported)} exported symbols, {len(declared)} FM_API declarations, "
          f"{len(errors)} problems")
    return 1 if errors else 0


def main(argv):
    if len(argv) >= 2 and argv[1] == "--mark":
        mark(argv[2:])
        return 0
    if len(argv) != 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    return check(argv[1], argv[2])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
