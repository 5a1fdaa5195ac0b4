#!/usr/bin/env python3
"""Functions a person can hold in mind: no C or CUDA function in src/ or cli/ longer
than --max lines (120; counted from the first line of its signature to its closing
brace), unless tools/long-functions.txt names it with the reason it is long.

  check-function-length.py [--root DIR] [--max N] [--list]

Fails (exit 1, naming file:line and length) on a long function that is not listed,
and on a listed one that no longer exists or is no longer long (a stale entry).
--list prints every function over the limit, listed or not. A self-test of the
parser runs first, so the check cannot pass by finding no functions at all.
The sources are read as text: comments, strings and preprocessor lines are
blanked, then each top-level brace block whose head ends in a parameter list
is a function.
"""
import argparse
import os
import re
import sys

HEAD = re.compile(r'([A-Za-z_]\w*)\s*\((?:[^()]|\([^()]*\))*\)\s*(?:const\s*)?(?:__attribute__\s*\(\(.*?\)\)\s*)?$', re.S)


def blank(text):
    """Comments, string and character literals, and preprocessor lines as spaces (newlines kept)."""
    sp = lambda m: re.sub(r'[^\n]', ' ', m.group(0))
    text = re.sub(r'/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', sp, text, flags=re.S)
    return re.sub(r'(?m)^[ \t]*#(?:[^\n]*\\\n)*[^\n]*', sp, text)


def functions(text):
    """(name, first line, length in lines) of every top-level function definition."""
    text = blank(text)
    found, depth, decl, cur, linkage = [], 0, 0, None, 0
    for i, ch in enumerate(text):
        if ch == '{' and depth == 0 and re.search(r'\bextern\s*$', text[decl:i]):
            linkage += 1  # extern "C" { ... }: its contents stay top level
            decl = i + 1
            continue
        if ch == '}' and depth == 0 and linkage:
            linkage -= 1
            decl = i + 1
            continue
        if ch == '{':
            if depth == 0:
                head = text[decl:i].strip()
                m = HEAD.search(head)
                last = head.split('\n')[-1].strip()
                is_fn = m and '=' not in head.split('(')[0] and not re.match(r'(struct|union|enum|typedef)\b', last)
                cur = (m.group(1), text.count('\n', 0, decl + len(text[decl:i]) - len(text[decl:i].lstrip())) + 1) \
                    if is_fn else None
            depth += 1
        elif ch == '}':
            depth -= 1
            if depth == 0:
                if cur:
                    found.append((cur[0], cur[1], text.count('\n', 0, i) + 1 - cur[1] + 1))
                cur, decl = None, i + 1
        elif ch == ';' and depth == 0:
            decl = i + 1
    return found


def self_test():
    body = '\n'.join('    x += %d; /* } { */' % i for i in range(130))
    src = ('#define M(a) { a }\nstatic const int t[] = {1, 2};\nstruct s { int a; };\n'
           'static int small(int a) {\n    return a ? "}" [0] : \'{\';\n}\n'
           'int big(int x,\n        int y) {\n' + body + '\n    return x + y;\n}\n'
           'extern "C" {\nint inner(void) {\n    return 0;\n}\n}\n')
    got = functions(src)
    want = [('small', 4, 3), ('big', 7, 134), ('inner', 142, 3)]
    if got != want:
        sys.exit(f'check-function-length: parser self-test failed: got {got}, expected {want}')


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--root', default=os.path.join(os.path.dirname(os.path.abspath(__file__)), '..'))
    ap.add_argument('--max', type=int, default=120)
    ap.add_argument('--list', action='store_true', help='print every long function and exit 0')
    a = ap.parse_args()
    self_test()
    allowed = {}
    allow_path = os.path.join(a.root, 'tools', 'long-functions.txt')
    for n, line in enumerate(open(allow_path), 1):
        line = line.strip()
        if not line or line.startswith('#'):
            continue
        key, _, reason = line.partition(' ')
        if ':' not in key or not reason.strip():
            sys.exit(f'{allow_path}:{n}: expected "path:function reason", got: {line}')
        allowed[key] = reason.strip()
    long_fns, n_fns = {}, 0
    for top in ('src', 'cli'):
        for dp, _, files in os.walk(os.path.join(a.root, top)):
            for f in sorted(files):
                if not f.endswith(('.c', '.h', '.cu', '.cuh')):
                    continue
                path = os.path.join(dp, f)
                rel = os.path.relpath(path, a.root)
                for name, line, length in functions(open(path, errors='replace').read()):
                    n_fns += 1
                    if length > a.max:
                        long_fns[f'{rel}:{name}'] = (line, length)
    if a.list:
        for key, (line, length) in sorted(long_fns.items(), key=lambda kv: -kv[1][1]):
            path, name = key.rsplit(':', 1)
            print(f'{path}:{line}: {name} {length} lines' + ('  (listed)' if key in allowed else ''))
        return 0
    bad = 0
    for key, (line, length) in sorted(long_fns.items()):
        if key not in allowed:
            path, name = key.rsplit(':', 1)
            print(f'{path}:{line}: {name} is {length} lines (limit {a.max}): split it, or list it with the reason '
                  f'in tools/long-functions.txt')
            bad += 1
    for key in sorted(allowed):
        if key not in long_fns:
            print(f'tools/long-functions.txt: {key} is not a function over {a.max} lines any more: remove the entry')
            bad += 1
    listed = sum(1 for key in long_fns if key in allowed)
    print(f'check-function-length: {n_fns} functions in src/ and cli/, {len(long_fns)} over {a.max} lines '
          f'({listed} listed), {bad} problem(s)')
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())
