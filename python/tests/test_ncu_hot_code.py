"""bench/ncu_hot_code.py on a small synthetic ncu source export (no GPU needed)."""

import importlib.util
import pathlib

spec = importlib.util.spec_from_file_location(
    "ncu_hot_code", pathlib.Path(__file__).resolve().parents[2] / "bench" / "ncu_hot_code.py")
hot = importlib.util.module_from_spec(spec)
spec.loader.exec_module(hot)

HEADER = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed",
          "Address Space", "stall_no_inst", "stall_long_sb", "stall_no_inst (Not Issued)"]


def write_export(path, rows):
    lines = ['"Kernel Name","void k(int)",', ",".join(f'"{h}"' for h in HEADER)]
    for r in rows:
        lines.append(",".join(f'"{v}"' for v in r))
    path.write_text("\n".join(lines) + "\n")


def test_totals_hot_ranges_and_aliasing(tmp_path):
    base = 0x7F0000000000
    # Hot code at offsets 0 and 64 KB (the same set modulo 64 KB, not modulo 128 KB),
    # one cold instruction between, and a hot one at 256 B.
    rows = [
        (hex(base), "LDC R1, c[0x0][0x28]", "10", "5000", "-", "4", "1", "9"),
        (hex(base + 0x100), "FFMA R2, R3, R4, R5", "1,000", "5000", "-", "0", "600", "0"),
        (hex(base + 0x8000), "BRA 0x0", "0", "0", "-", "0", "0", "0"),
        (hex(base + 0x10000), "LDG.E R6, desc[UR4][R2.64]", "30", "2500", "Global", "20", "5", "0"),
    ]
    f = tmp_path / "k.sass.csv"
    write_export(f, rows)
    kernel, got = hot.load(str(f))
    assert kernel == "void k(int)"
    assert [r["offset"] for r in got] == [0, 0x100, 0x8000, 0x10000]
    assert got[1]["Warp Stall Sampling (All Samples)"] == 1000.0  # thousands separator
    assert got[3]["Address Space"] == "Global"
    reasons = hot.stall_totals(got)
    assert reasons == {"no_inst": 24.0, "long_sb": 606.0}  # "(Not Issued)" columns left out
    lines = hot.hot_lines(got, 2000)
    assert lines == [0, 2, 0x10000 // 128]
    assert hot.ranges(lines) == [(0, 0x180), (0x10000, 0x10080)]
    assert hot.alias_histogram(lines, 64 * 1024) == {1: 1, 2: 1}
    assert hot.alias_histogram(lines, 128 * 1024) == {1: 3}
    assert hot.hot_lines(got, 3000) == [0, 2]


def test_main_prints_and_rejects_other_csv(tmp_path, capsys):
    f = tmp_path / "k.sass.csv"
    write_export(f, [(hex(0x1000), "NOP", "3", "4000", "-", "3", "0", "0")])
    assert hot.main([str(f), "--top", "no_inst", "-n", "1"]) == 0
    out = capsys.readouterr().out
    assert "stall samples 3" in out and "no_inst 100.0%" in out and "NOP" in out
    bad = tmp_path / "other.csv"
    bad.write_text('"a","b"\n"1","2"\n')
    try:
        hot.main([str(bad)])
    except SystemExit as e:
        assert "not an ncu --page source export" in str(e)
    else:
        raise AssertionError("a CSV without the source page's header was accepted")


def test_regions_and_listing(tmp_path, capsys):
    base = 0x7F0000000000
    rows = [
        (hex(base), "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R4", "60", "100", "-", "0", "50", "0"),
        (hex(base + 0x10), "HGMMA.64x128x16.F32.BF16 R24, R168, gdesc[UR24], R24", "30", "100", "-", "0", "0", "0"),
        (hex(base + 0x200), "LOP3.LUT R1, R2, 0x1, RZ, 0xc0, !PT", "9", "300", "-", "2", "0", "0"),
        (hex(base + 0x400), "NOP", "1", "7", "-", "0", "0", "0"),  # 1% of the samples: listed
    ]
    f = tmp_path / "k.sass.csv"
    write_export(f, rows)
    assert hot.main([str(f), "--regions", "0x200", "--listing", "0x0", "0x200"]) == 0
    out = capsys.readouterr().out
    assert "total samples 100" in out
    # Region 0: both instructions' samples, executions and HGMMA executions, long_sb first.
    assert "0x00000     90  90.0% ex=      200 hg=     100 long_sb:50" in out
    assert "0x00200      9   9.0% ex=      300 hg=       0 no_inst:2" in out
    assert "0x00400      1   1.0% ex=        7 hg=       0" in out
    # The listing: the two instructions of [0, 0x200) only, with their top reasons.
    listed = [l for l in out.splitlines() if any(op in l for op in ("TRYWAIT", "HGMMA", "LOP3", "NOP"))]
    assert len(listed) == 2
    assert listed[0].split()[:3] == ["0x00000", "60", "100"] and listed[0].endswith("long_sb:50")
    assert listed[1].split()[:3] == ["0x00010", "30", "100"]
