#!/usr/bin/env python3
"""Instruction counts of a kernel's loops, from its SASS: what a change does to the hot
loops before any GPU runs it (PERFORMANCE.md, session 39).

Input: `cuobjdump -sass` text of a binary or an object (cuobjdump and nvdisasm are not
in the development machine's toolkit: `pip download --no-deps nvidia-cuda-cuobjdump`,
unzip the wheel, and use its nvidia/cu13/bin/cuobjdump), or the binary itself when
cuobjdump is on PATH.

    python3 bench/sass_loops.py build-gpu/mxmoe -k gemm1_fp8_kernelILi3ELb1
    python3 bench/sass_loops.py new.sass --compare old.sass

A loop is the code between a backward branch and its target (at least --min-bytes
long; nested loops are listed each on their own), with its instructions counted by
opcode (predicates and modifiers dropped: "@!P0 LOP3.LUT" counts as LOP3). With
--compare, every kernel whose instruction sequence differs between the two dumps is
listed with both totals and both loop lists (kernels are matched by name with the
anonymous-namespace hash removed, which changes with the source file's path).
"""
import argparse
import collections
import re
import shutil
import signal
import subprocess
import sys

FUNCTION = re.compile(r"Function : (\S+)")
ARCH = re.compile(r"^\s*(?:arch =|code for) (sm_\w+)")  # a binary's ELF header, an object's
INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,8})\*/\s+([^;]*);")
BRANCH = re.compile(r"\bBRA(?:\.\S+)?\s+(?:\S+,\s*)?(0x[0-9a-f]+)")
ANON = re.compile(r"_GLOBAL__N__[0-9a-f]+_")


def read_sass(path):
    """The SASS text of `path`: a cuobjdump -sass dump, or a binary cuobjdump can read."""
    with open(path, "rb") as f:
        head = f.read(4)
    if head != b"\x7fELF":
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    tool = shutil.which("cuobjdump")
    if tool is None:
        sys.exit(f"sass_loops: {path} is a binary and cuobjdump is not on PATH (see --help)")
    return subprocess.run([tool, "-sass", path], check=True, capture_output=True, text=True).stdout


def parse(text):
    """{kernel name: [(byte offset, instruction text)]} in program order. A binary built
    for several architectures holds each kernel once per architecture: the names then
    carry it ("name @sm_90a")."""
    by_arch, current, arch = {}, None, ""  # {(name, arch): code}
    for line in text.splitlines():
        m = ARCH.match(line)
        if m:
            arch = m.group(1)
            continue
        m = FUNCTION.search(line)
        if m:
            current = by_arch.setdefault((m.group(1), arch), [])
            continue
        m = INSTRUCTION.search(line)
        if m and current is not None:
            current.append((int(m.group(1), 16), " ".join(m.group(2).split())))
    several = len({a for _, a in by_arch}) > 1
    return {(f"{name} @{a}" if several else name): code for (name, a), code in by_arch.items()}


def opcode(instruction):
    """The opcode without its predicate and modifiers: '@!P0 LOP3.LUT R1, ...' -> 'LOP3'."""
    words = instruction.split()
    word = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
    return word.split(".")[0]


def loops(code, min_bytes=0x100):
    """[(start, end, instructions)] for each backward branch spanning at least min_bytes."""
    found = []
    for offset, text in code:
        m = BRANCH.search(text)
        if not m:
            continue
        target = int(m.group(1), 16)
        if target < offset and offset - target >= min_bytes:
            found.append((target, offset, [t for o, t in code if target <= o <= offset]))
    return found


def histogram(instructions, top):
    counts = collections.Counter(opcode(t) for t in instructions)
    return ", ".join(f"{op} {n}" for op, n in counts.most_common(top))


def report(name, code, min_bytes, top, out):
    out.write(f"{name}: {len(code)} instructions\n")
    for start, end, body in loops(code, min_bytes):
        out.write(f"  loop {start:#x}..{end:#x}: {len(body)} ({histogram(body, top)})\n")


def main(argv=None, out=sys.stdout):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sass", help="cuobjdump -sass text, or a binary / object")
    ap.add_argument("-k", "--kernel", default="", help="only kernels whose name matches this regex")
    ap.add_argument("--compare", help="a second dump or binary: list the kernels whose SASS differs")
    ap.add_argument("--min-bytes", type=lambda s: int(s, 0), default=0x100,
                    help="shortest loop listed, in bytes of code (default 0x100: 16 instructions)")
    ap.add_argument("--top", type=int, default=10, help="opcodes listed per loop")
    a = ap.parse_args(argv)
    kernels = parse(read_sass(a.sass))
    if not kernels:
        sys.exit(f"sass_loops: no kernels in {a.sass} (not cuobjdump -sass output?)")
    pick = re.compile(a.kernel)
    if not a.compare:
        for name, code in kernels.items():
            if pick.search(name):
                report(name, code, a.min_bytes, a.top, out)
        return 0
    other = {ANON.sub("", n): c for n, c in parse(read_sass(a.compare)).items()}
    differ = 0
    for name, code in kernels.items():
        key = ANON.sub("", name)
        if not pick.search(name):
            continue
        if key not in other:
            out.write(f"only in {a.sass}: {name}\n")
            continue
        if [t for _, t in code] == [t for _, t in other[key]]:
            continue
        differ += 1
        report(f"{name} [{a.sass}]", code, a.min_bytes, a.top, out)
        report(f"{name} [{a.compare}]", other[key], a.min_bytes, a.top, out)
    mine = {ANON.sub("", n) for n in kernels}
    for key in other:
        if key not in mine and pick.search(key):
            out.write(f"only in {a.compare}: {key}\n")
    out.write(f"{differ} kernel(s) differ\n")
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` ends the listing quietly
    sys.exit(main())
