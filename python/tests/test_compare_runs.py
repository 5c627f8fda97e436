"""bench/compare_runs.py on small synthetic `mxmoe bench --json` files (no GPU needed)."""

import importlib.util
import json
import pathlib

spec = importlib.util.spec_from_file_location(
    "compare_runs", pathlib.Path(__file__).resolve().parents[2] / "bench" / "compare_runs.py")
cr = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cr)


def case(tokens, mode, us, torch_us=0.0):
    """A bench case whose MMA floor is 100 us at M=1024 (and in proportion), HBM 116 us."""
    mma = 100.0 * tokens / 1024
    return {"tokens": tokens, "mode": mode, "median_us": us, "hbm_floor_us": 116.0,
            "mma_floor_us": mma, "tflops": 1448.0 * mma / us, "torch_us": torch_us}


def write(path, cases):
    path.write_text(json.dumps({"cases": cases}))


def test_table_means_rounds_and_rates_the_last_variant(tmp_path, capsys):
    for r, (a_us, b_us) in enumerate([(200.0, 180.0), (210.0, 190.0)], start=1):
        # Eager cases are ignored by default; M=4096 is missing from b's second round.
        write(tmp_path / f"a_{r}.json", [case(1024, "graph", a_us), case(1024, "eager", 1.0),
                                         case(4096, "graph", 800.0)])
        b = [case(1024, "graph", b_us, torch_us=740.0), case(1024, "eager", 1.0)]
        if r == 1:
            b.append(case(4096, "graph", 700.0))
        write(tmp_path / f"b_{r}.json", b)
    assert cr.main([str(tmp_path), "--variants", "a,b", "--rounds", "1,2", "--pattern", "{v}_{r}.json"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == "| M | a | b | b vs a | x floor | % peak | TFLOP/s | x torch |"
    assert len(lines) == 3  # M=4096 is not in every file
    # b: mean 185 against a's 205 (-9.8%); floor max(116, 100) = 116 -> 1.59x; MMA floor
    # 100 over 185 -> 54.1%; torch 740 / 185 = 4.00x.
    assert lines[2] == "| 1024 | 200.0 / 210.0 | 180.0 / 190.0 | -9.8% | 1.59x | 54.1% | 783 | 4.00x |"


def test_missing_file_and_single_round_pattern(tmp_path, capsys):
    write(tmp_path / "a_dec.json", [case(1, "graph", 99.0)])
    assert cr.main([str(tmp_path), "--variants", "a,f", "--pattern", "{v}_dec.json"]) == 1
    assert "f_dec.json is missing" in capsys.readouterr().err
    write(tmp_path / "f_dec.json", [case(1, "graph", 90.0)])
    assert cr.main([str(tmp_path), "--variants", "a,f", "--pattern", "{v}_dec.json"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[2].startswith("| 1 | 99.0 | 90.0 | -9.1% |")
