"""bench/sass_loops.py on small synthetic cuobjdump -sass dumps (no GPU or cuobjdump needed)."""

import importlib.util
import io
import pathlib

import pytest

spec = importlib.util.spec_from_file_location(
    "sass_loops", pathlib.Path(__file__).resolve().parents[2] / "bench" / "sass_loops.py")
sl = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sl)


def dump(functions, arch="sm_90a"):
    """cuobjdump -sass layout: a Function header, then one line per instruction with its
    offset comment and its encoding comment."""
    lines = ["", "Fatbin elf code:", "================", f"arch = {arch}", ""]
    for name, code in functions.items():
        lines.append(f"\t\tFunction : {name}")
        lines.append("\t.headerflags\t@\"EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)\"")
        for i, text in enumerate(code):
            lines.append(f"        /*{16 * i:04x}*/                   {text} ;"
                         f"                 /* 0x000fe20000000800 */")
            lines.append("                                                          /* 0x000fc80000000000 */")
    return "\n".join(lines) + "\n"


# A 20-instruction loop (offsets 0x10..0x140, back edge at 0x140) inside a kernel whose
# code runs past 0x10000 (five hex digits: the offsets must not be cut at four).
LOOP = (["MOV R1, RZ"] + ["@!P0 LOP3.LUT R2, R2, 0x7f, RZ, 0xc0, !PT"] * 10 +
        ["FFMA R3, R4, R5, R3"] * 8 + ["ISETP.NE.AND P0, PT, R1, RZ, PT", "@P0 BRA 0x10"])


def test_parse_opcodes_and_loops():
    code = LOOP + ["NOP"] * 4200 + ["BRA.DIV UR4, 0x10", "EXIT"]
    kernels = sl.parse(dump({"_Z1kv": code}))
    assert list(kernels) == ["_Z1kv"]
    k = kernels["_Z1kv"]
    assert len(k) == len(code) and k[-1][0] == 16 * (len(code) - 1) > 0xFFFF
    assert sl.opcode("@!P0 LOP3.LUT R2, R2, 0x7f, RZ, 0xc0, !PT") == "LOP3"
    assert sl.opcode("HGMMA.64x128x16.F32.BF16 R88, R180, gdesc[UR20], R88") == "HGMMA"
    found = sl.loops(k, 0x100)
    assert [(s, e, len(b)) for s, e, b in found] == [(0x10, 0x140, 20), (0x10, 16 * (len(code) - 2), len(code) - 2)]
    assert sl.histogram(found[0][2], 2) == "LOP3 10, FFMA 8"
    assert sl.loops(k, 0x200)[0][0:2] == (0x10, 16 * (len(code) - 2))  # the short loop filtered out


def test_main_lists_and_compares(tmp_path):
    old = tmp_path / "old.sass"
    new = tmp_path / "new.sass"
    same = ["MOV R1, RZ", "EXIT"]
    old.write_text(dump({"_ZN1a12_GLOBAL__N__1234abcd_1kEv": LOOP, "_Z4samev": same, "_Z4gonev": same}))
    shorter = [t for t in LOOP if not t.startswith("FFMA")][:-1] + ["@P0 BRA 0x10"]
    new.write_text(dump({"_ZN1a12_GLOBAL__N__99ff00ee_1kEv": shorter, "_Z4samev": same}))
    out = io.StringIO()
    assert sl.main([str(new), "-k", "1kEv", "--top", "1", "--min-bytes", "0x80"], out=out) == 0
    assert "1kEv: 13 instructions" in out.getvalue() and "(LOP3 10)" in out.getvalue()
    out = io.StringIO()
    assert sl.main([str(new), "--compare", str(old)], out=out) == 0
    text = out.getvalue()
    assert "13 instructions" in text and "21 instructions" in text  # the kernel matched across hashes
    assert "samev" not in text
    assert f"only in {old}: _Z4gonev" in text
    assert text.rstrip().endswith("1 kernel(s) differ")


def test_rejects_text_without_kernels(tmp_path):
    f = tmp_path / "empty.txt"
    f.write_text("nothing here\n")
    with pytest.raises(SystemExit, match="no kernels"):
        sl.main([str(f)])


def test_one_kernel_per_architecture():
    # A default build holds sm_80, sm_90a and sm_120a code: each kernel once per ELF.
    text = dump({"_Z1kv": LOOP}, "sm_80") + dump({"_Z1kv": LOOP[:5] + ["EXIT"]}, "sm_90a")
    kernels = sl.parse(text)
    assert sorted(kernels) == ["_Z1kv @sm_80", "_Z1kv @sm_90a"]
    assert len(kernels["_Z1kv @sm_80"]) == len(LOOP) and len(kernels["_Z1kv @sm_90a"]) == 6
    assert list(sl.parse(dump({"_Z1kv": LOOP}))) == ["_Z1kv"]  # one architecture: plain names
