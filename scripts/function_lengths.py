#!/usr/bin/env python3
"""The longest functions in src/ (C++), longest first: lines from the signature's first line to
the closing brace. House style keeps every function under about 150 lines (STYLE.md); this
makes the number checkable.

Usage: python3 scripts/function_lengths.py [--top N] [--over LINES] [ROOT ...]
(default: the top 20 under src/; --over lists every function longer than LINES and exits 1 if
there is one).

A small brace matcher, not a C++ parser: comments, strings and character literals are blanked
first, then a `{` at namespace or class level whose preceding text ends in a parameter list
(optionally followed by qualifiers, a trailing return type or a constructor's initialisers)
starts a function. Lambdas and local classes count towards the function they are in."""
import argparse
import os
import re
import sys

CONTROL = {"if", "for", "while", "switch", "catch", "do", "else", "return"}


def blank(text):
    """Comments, string and character literals replaced by spaces (newlines kept)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'R"([^(\s]*)\(', text[i:])
            if not m:
                out.append(c)
                i += 1
                continue
            end = ")" + m.group(1) + '"'
            j = text.find(end, i + m.end())
            j = n if j < 0 else j + len(end)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c in "\"'":
            if c == "'" and i > 0 and text[i - 1].isalnum():  # digit separator: 1'000
                out.append(" ")
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            j = min(n, j + 1)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def function_name(head):
    """The name of the function whose signature ends `head`, or None if `head` is not one."""
    head = re.sub(r"\s+", " ", head).strip()
    if not head or head.startswith("#"):
        return None
    # A constructor's initialiser list: drop from the ':' that follows the parameter list.
    depth, close = 0, -1
    for k, ch in enumerate(head):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                close = k
                rest = head[k + 1:].strip()
                if rest.startswith(":") and not rest.startswith("::"):
                    break
    if close < 0:
        return None
    # The parameter list that belongs to the name: the first top-level '(' group.
    depth = 0
    for k, ch in enumerate(head):
        if ch == "(":
            if depth == 0:
                before = head[:k].rstrip()
                m = re.search(r"([~A-Za-z_][\w:~<>=!+\-*/%&|^\[\]]*)$", before)
                if not m:
                    return None
                name = m.group(1)
                words = before.split()
                if name in CONTROL or (words and words[0] in CONTROL) or name.endswith("]"):
                    return None
                if re.match(r"^(class|struct|union|enum|namespace)\b", head):
                    return None
                if "=" in before and not re.search(r"operator\s*\S*=", before):
                    return None  # a variable initialised by a lambda or a call
                return name
            depth += 1
        elif ch == ")":
            depth -= 1
    return None


def functions(path):
    text = blank(open(path, encoding="utf-8", errors="replace").read())
    results = []
    # Scopes: 'ns' (namespace / class / extern: functions may start inside), 'fn', 'other'.
    stack, start = [], 0  # start: where the current declaration's text begins
    fn_start_line = {}
    i = 0
    while i < len(text):
        ch = text[i]
        if ch in ";":
            if not stack or stack[-1][0] == "ns":
                start = i + 1
        elif ch == "{":
            in_fn = any(kind == "fn" for kind, _, _ in stack)
            head = text[start:i]
            if in_fn:
                stack.append(("other", None, i))
            else:
                name = function_name(head)
                if name:
                    first = start + len(head) - len(head.lstrip())
                    stack.append(("fn", name, text.count("\n", 0, first) + 1))
                elif re.search(r"\b(namespace|class|struct|union)\b[^()]*$", head) or \
                        re.search(r'extern\s*$', head.strip() + " ") or head.strip().endswith("extern"):
                    stack.append(("ns", None, i))
                else:
                    stack.append(("other", None, i))
            start = i + 1
        elif ch == "}":
            if stack:
                kind, name, line = stack.pop()
                if kind == "fn":
                    end = text.count("\n", 0, i) + 1
                    results.append((end - line + 1, name, path, line))
            if not stack or stack[-1][0] == "ns":
                start = i + 1
        i += 1
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("roots", nargs="*", default=["src"])
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--over", type=int, default=0)
    args = ap.parse_args()
    found = []
    for root in args.roots:
        if os.path.isfile(root):
            found += functions(root)
        for d, _, files in os.walk(root):
            for f in sorted(files):
                if f.endswith((".cpp", ".h", ".cc", ".hpp", ".cu")):
                    found += functions(os.path.join(d, f))
    found.sort(key=lambda r: (-r[0], r[2], r[3]))
    shown = [r for r in found if r[0] > args.over] if args.over else found[: args.top]
    for lines, name, path, line in shown:
        print(f"{lines:5d}  {name}  {path}:{line}")
    return 1 if args.over and shown else 0


if __name__ == "__main__":
    sys.exit(main())
