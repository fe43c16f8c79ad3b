"""benchmarks/report.py: each benchmark script's JSON (small synthetic ones, with the keys the scripts write) becomes a
markdown table holding its figures, and an unknown JSON is refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import load_bench

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "report.py")
report = load_bench("report")

_PHASES = {"first_run": 2.6392}
_START = dict(first_result_s=4.358, process_wall_s=4.894, kernels_compiled_before_first_result=0, xla_cache_hits=5,
              xla_cache_misses=0, phases_s=_PHASES)

CASES = {
  "attention": (
    {"device": "NVIDIA H200", "rows": [dict(row=0, B=1, N=16, K=16, S=4096, D=128, causal=False, jqat_fwd_ms=0.4877,
                                            jqat_fwdbwd_ms=1.7753, cudnn_fwd_ms=0.2401, cudnn_fwdbwd_ms=0.8961,
                                            ratio_fwd_vs_cudnn=2.031, ratio_fwdbwd_vs_cudnn=1.981)]},
    ["1, 16, 16, 4096, 128, no", "0.4877", "1.775", "2.03", "1.98"],
  ),
  "memory": (
    {"memory_check": {"accounting": {"shape": dict(B=1, N=8, S=65536, D=128, causal=True), "base": 941621252,
                                     "predicted_peak": 1077936132},
                      "peak_bytes": 1077937408, "measured_ratio": 1.1448, "finite": True}},
    ["941.62", "1077.94", "1.145x"],
  ),
  "masks": (
    {"rows": [dict(case="window 1024 at 16384", baseline="0.0605 x full non-causal", ms=[0.615, 2.243, 2.183],
                   baseline_ms=[0.3898, 1.540, 1.552], ratio=[1.578, 1.456, 1.407])]},
    ["window 1024 at 16384", "0.615", "1.58", "1.41", "given-dO fwd+bwd"],
  ),
  "kernel_times": (
    {"cases": {"causal": {"grouped": {"bwd_dkdv": 0.269, "attention_fwd": 0.190}, "total": 0.459}}},
    ["bwd_dkdv", "0.269", "0.459"],
  ),
  "sharding": (
    {"rows": [dict(config="jqat batch", B=2, T=16384, N=16, D=128, causal=True, fwdbwd_ms=16.21, speedup_vs_1=1.958,
                   target=1.8, collectives={"all-to-all": 0})]},
    ["jqat batch", "16.21", "1.96", "none"],
  ),
  "rope_qdq": (
    {"results": [dict(mode="fp4/32/ue8m0", rows=1048576, ours_ms=0.1489, ours_gbs=4063.2, copy_gbs=4102.6,
                      copy_method="torch", pct_of_copy=99.04, reference_ms=1.675, speedup_vs_reference=11.25)]},
    ["1,048,576", "99.0%", "11.2x"],
  ),
  "torch_rope_qdq": (
    {"results": [dict(mode="fp4/16/e4m3", width=512, heads=1, rows=1048576, ours_ms=0.5596, copy_ms=0.5058,
                      copy_fraction=0.904, ours_hbm_gbs=3845.0, allocated_delta=0)]},
    ["fp4/16/e4m3", "90.4%", "0.5596"],
  ),
  "qat_matmul": (
    {"rows": [dict(M=8192, K=4096, N=4096, dot_ms=0.3837, qat_ms=0.4129, xla_ms=0.4774, dot_fwdbwd_ms=1.161,
                   qat_fwdbwd_ms=1.240, ratio_fwd=1.076, ratio_fwdbwd=1.068, fq_x_gbs=3381.0, copy_x_gbs=3067.0,
                   fq_w_gbs=1607.0, copy_w_gbs=2294.0)]},
    ["0.4129", "1.08", "1.07", "3381 (3067)"],
  ),
  "decode": (
    {"device": "NVIDIA H100 80GB HBM3", "step_layers": 8,
     "rows": [dict(B=8, N=32, K=8, T=32768, D=128, Tq=1, paged=False, page_size=None, num_splits=16,
                   jqat_decode_ms=0.1379, jqat_decode_tbps=2.19, hbm_share=0.4562, cudnn_ms=0.3679,
                   jqat_attention_ms=1.484, jqat_write_ms=0.0569, split_vs_one=0.048, packed_cache_bytes=301989888,
                   jqat_decode_step_ms=0.1258, cudnn_step_ms=0.3641)]},
    # the share of the device's HBM, not the JSON's; the step table's TB/s from the cache's bytes
    ["0.1379", "TB/s (of 3.35)", "2.19 (65%)", "2.67x", "4.8e-02", "step of 8 layers", "0.1258", "2.40 (72%)",
     "2.89x"],
  ),
  "decode_gluon": (
    {"benchmark": "decode_gluon --sweep", "time": [dict(B=8, N=32, K=8, T=32768, D=128, Tq=1, page_size=0, splits=16,
                                                       gluon_kg4_stages2_s16_ms=0.1284, gluon_kg4_stages2_s16_tbps=2.35,
                                                       gluon_memonly_s16_ms=0.1215, gluon_memonly_s16_tbps=2.49)],
     "kernels": [dict(B=32, N=32, K=8, T=8192, D=128, Tq=4, page_size=0, splits=4, split_gluon_ms=0.1536,
                      combine_ms=0.0139, graph_ms=0.1677, combine_w1_ms=0.0071),
                 dict(B=64, N=8, K=1, T=4096, D=128, Tq=4, page_size=0, splits=8, split_ms=0.06, graph_ms=0.07)]},
    ["gluon_kg4_stages2 | 16 | 0.1284 | 2.35", "gluon_memonly | 16 | 0.1215 | 2.49",
     "| combine share | combine, 1 warp |",
     "| 32, 32, 8, 8192, 128 | 4 | 4 | Gluon | 0.1536 | 0.01390 | 0.1677 | 8% | 0.007100 |",
     "| 64, 8, 1, 4096, 128 | 4 | 8 | Triton | 0.06000 | - | 0.07000 | - | - |"],
  ),
  "decode_read": (
    {"benchmark": "decode_read", "rows": [dict(pattern="per_row", scales=True, warps=8, splits=128, rows=32,
                                               ms=0.1003, tbps=3.009, bytes=301989888)]},
    ["per_row | yes | 8 | 128 | 32 | 0.1003 | 3.01"],
  ),
  "compile_time": ({"cold": dict(_START, first_result_s=11.28), "warm": _START}, ["11.28", "4.36", "2.64", "5 / 0"]),
  "numerics_modes": (
    {"rows": [dict(t=16384, causal=False, p_scale="block", smooth_k=False, qkv_scale="block", fwd_bwd_ms=36.05,
                   err_o=0.166, err_dq=0.192, err_dk=0.192, err_dv=0.906),
              dict(t=16384, causal=False, p_scale="row", smooth_k=False, qkv_scale="block", fwd_bwd_ms=39.65,
                   err_o=0.166, err_dq=0.192, err_dk=0.192, err_dv=0.120)]},
    ["16384", "row", "39.65", "0.120", "| 1.10 |", "| fwd+bwd vs block |"],
  ),
  "numerics_modes_fwd": (
    {"rows": [dict(t=4096, causal=True, p_scale="block", smooth_k=False, qkv_scale="block", fwd_ms=0.30,
                   fwd_bwd_ms=1.0, err_o=0.173, err_dq=0.183, err_dk=0.182, err_dv=0.220),
              dict(t=4096, causal=True, p_scale="row", smooth_k=False, qkv_scale="block", fwd_ms=0.33,
                   fwd_bwd_ms=1.1, err_o=0.172, err_dq=0.183, err_dk=0.182, err_dv=0.141)]},
    ["| fwd | fwd vs block | fwd+bwd | fwd+bwd vs block |", "| 0.3300 | 1.10 | 1.100 | 1.10 |"],
  ),
  "attention_ws": (
    {"benchmark": "attention_ws",
     "check": [dict(variant="ws_c2", differing=0.0, ws_vs_oracle=1.66e-3, triton_vs_oracle=1.66e-3, ok=True),
               dict(variant="ws_c2_residuals", differing=0.0, differing_o_hp=2e-5, differing_lse=0.0,
                    ws_vs_oracle=1.67e-3, triton_vs_oracle=1.66e-3, ok=False),
               dict(variant="ws_c2_residuals", p_scale="row", differing=0.0, differing_o_hp=0.0, differing_lse=0.0,
                    differing_row_max=3e-5, ok=True)],
     "time": [dict(B=1, H=16, K=16, T=4096, D=128, causal=False, triton_ms=0.4279, cudnn_bf16_ms=0.2044,
                   ws_c2_ms=0.4018, ws_c2_vs_triton=0.0)]},
    ["ws_c2 | block | 1 | 0.0e+00 | - | - | - | 1.66e-03", "ws_c2_residuals | block | 1 | 0.0e+00 | 2.0e-05 | "
     "0.0e+00 | - | 1.67e-03 | 1.66e-03 | no",
     "ws_c2_residuals | row | 1 | 0.0e+00 | 0.0e+00 | 0.0e+00 | 3.0e-05 | - | - | yes",
     "0.4279", "0.4018", "| 1.06 |", "| 1.97 |"],
  ),
  "quantize_pass": (
    {"benchmark": "quantize_pass", "rows": [dict(shape=[8, 1024, 16, 128], bytes=201326592.0, pass_ms=0.0685392,
                                                 pass_tbs=2.93739, copy_ms=0.0714272, copy_tbs=2.81863)]},
    ["8, 1024, 16, 128", "201.3", "0.06854", "2.94", "0.07143", "2.82", "0.96"],
  ),
  "attention_ws_bwd": (
    {"benchmark": "attention_ws_bwd",
     "check": [dict(variant="ws_m32_s2", dk_differing=0.0, dv_differing=2e-5, dk_vs_oracle=1.6e-3, dv_vs_oracle=1.7e-3,
                    triton_dk_vs_oracle=1.6e-3, triton_dv_vs_oracle=1.65e-3, ok=True)],
     "time": [dict(B=1, H=16, K=16, T=4096, D=128, triton_ms=0.8429, ws_m32_s2_ms=0.7087, ws_m32_s2_bitwise=True)]},
    ["ws_m32_s2 | 1 | 2.0e-05 | 1.70e-03 | 1.65e-03 | yes", "| 0.8429 | 0.7087 | 1.19 | yes |"],
  ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_each_benchmarks_json_becomes_a_table_of_its_figures(name):
  data, figures = CASES[name]
  assert report.kind(data) == name.removesuffix("_fwd")
  lines = report.report(data, command="python3 benchmarks/x.py", date="2026-12-02", machine="one NVIDIA H200")
  assert lines[0].startswith("`python3 benchmarks/x.py`; 2026-12-02; one NVIDIA H200")
  table = lines[2:]
  assert table[1].startswith("|---|")
  for part in "\n".join(table).split("\n\n"):  # one width for every row of each table
    assert len({row.count("|") for row in part.splitlines()}) == 1, part
  text = "\n".join(table)
  for figure in figures:
    assert figure in text, (figure, text)


def test_rows_keeps_the_attention_rows_named():
  data = CASES["attention"][0]
  data = dict(data, rows=data["rows"] + [dict(data["rows"][0], row=3, S=16384)])
  text = "\n".join(report.report(data, rows={3}))
  assert "16384" in text and "4096" not in text


def test_kernel_times_keeps_the_warp_specialized_kernels_apart():
  """Grouped from the per-kernel times: the warp-specialized forward apart from the Triton forward (its REDO launch
  there), each case a column; the total as the JSON holds it."""
  kernels = {"attention_fwd_ws_kernel": 0.294, "attention_fwd_kernel": 0.005, "attention_bwd_dkdv_kernel": 0.3,
             "fake_quantize_rows3_kernel": 0.1, "fake_quantize_rows_kernel": 0.036}
  data = {"cases": {"causal (ws)": {"kernels": kernels, "total": 0.735},
                    "causal (triton)": {"kernels": {"attention_fwd_kernel": 0.204}, "total": 0.204}}}
  text = "\n".join(report.report(data))
  assert "| kernel | causal (ws) | causal (triton) |" in text
  for row in ("| attention_fwd_ws | 0.294 | - |", "| attention_fwd | 0.005 | 0.204 |", "| bwd_dkdv | 0.300 | - |",
              "| fake_quantize | 0.136 | - |", "| total | 0.735 | 0.204 |"):
    assert row in text, (row, text)


def test_kernel_times_runs_side_by_side():
  """Several kernel_times.py JSONs of one device, one labelled column per case of each; other JSONs, or runs of
  another device, are not merged."""
  one = lambda t: {"cases": {"causal": {"kernels": {"attention_fwd_kernel": t}, "total": t}}}
  merged = report.merge_kernel_times([one(0.2), one(0.3)], ["a", "b"])
  text = "\n".join(report.report(merged))
  assert "| kernel | causal (a) | causal (b) |" in text and "| attention_fwd | 0.200 | 0.300 |" in text
  with pytest.raises(ValueError, match="labels"):
    report.merge_kernel_times([one(0.2), one(0.3)], ["a"])
  with pytest.raises(ValueError, match="only kernel_times"):
    report.merge_kernel_times([one(0.2), CASES["masks"][0]], ["a", "b"])
  with pytest.raises(ValueError, match="one device"):
    report.merge_kernel_times([one(0.2), dict(one(0.3), device="another GPU")], ["a", "b"])


def test_an_unknown_json_is_refused():
  with pytest.raises(ValueError, match="not the JSON of a known benchmark"):
    report.kind({"rows": [{"something": 1}]})


def test_command_line(tmp_path):
  path = tmp_path / "masks.json"
  path.write_text(json.dumps(CASES["masks"][0]))
  out = subprocess.run([sys.executable, SCRIPT, str(path), "--date", "2026-12-02"], capture_output=True, text=True,
                       check=True).stdout
  assert out.startswith("2026-12-02.\n\n| case | baseline |") and "| window 1024 at 16384 |" in out


_NCU_TEXT = """[831] python3.12@127.0.0.1
  fake_quantize_rows3_kernel (49152, 1, 1)x(128, 1, 1), Context 1, Stream 7, Device 0, CC 9.0
    Section: GPU Speed Of Light Throughput
    ----------------------- ----------- -------------
    Metric Name             Metric Unit  Metric Value
    ----------------------- ----------- -------------
    DRAM Throughput                   %         87.96
    Duration                         us        129.54
  attention_fwd_ws_kernel (128, 16, 1)x(384, 1, 1), Context 1, Stream 7, Device 0, CC 9.0
    Section: GPU Speed Of Light Throughput
    Metric Name             Metric Unit  Metric Value
    Elapsed Cycles                cycle    10,589,837
    Duration                         ms          5.68
    Waves Per SM                                15.52
    OPT   This workload exhibits low compute throughput and memory bandwidth utilization relative to the peak
          performance of this device. Achieved compute throughput 12.0 below
    Table Name : Pipe Utilization (% of elapsed cycles)
    Tensor (All)                   %        38.54
    ALU                            %        38.30
    Table Name : Pipe Utilization (% of active cycles)
    ALU                            %        39.59
    Executed Instructions by SASS Opcode Category              3,124,014,910 (2,011,276,928;
                                                                   409,536,512; 208,199,680)
    Stall Barrier                   inst         1.60
    Stall Wait                      inst         0.67
    Stall Not Selected              inst         0.54
    Stall Long Scoreboard           inst         0.47
  fake_quantize_rows3_kernel (49152, 1, 1)x(128, 1, 1), Context 1, Stream 7, Device 0, CC 9.0
    Duration                         us        129.76
"""


def test_ncu_counters_reads_each_launch_and_becomes_a_table():
  """ncu_counters.py: each launch's rows of `ncu --print-details all` as numbers (durations in ms, the first of a
  repeated name, wrapped chart rows skipped), a kernel launched again kept once with its last values and its count;
  report.py renders them with the largest stalls."""
  ncu = load_bench("ncu_counters")
  launches = ncu.parse(_NCU_TEXT)
  assert [x["kernel"] for x in launches] == ["fake_quantize_rows3_kernel", "attention_fwd_ws_kernel",
                                             "fake_quantize_rows3_kernel"]
  fwd = launches[1]
  assert fwd["grid"] == [128, 16, 1] and fwd["block"] == [384, 1, 1]
  assert fwd["metrics"] == {"Elapsed Cycles": 10589837.0, "Duration": 5.68, "Waves Per SM": 15.52,
                            "Tensor (All)": 38.54, "ALU": 38.30, "Stall Barrier": 1.60, "Stall Wait": 0.67,
                            "Stall Not Selected": 0.54, "Stall Long Scoreboard": 0.47}
  assert launches[0]["metrics"] == {"DRAM Throughput": 87.96, "Duration": 129.54e-3}
  kept = ncu.select(launches, None)
  assert [(x["kernel"], x["launches"], x["metrics"]["Duration"]) for x in kept] == [
    ("fake_quantize_rows3_kernel", 2, 129.76e-3), ("attention_fwd_ws_kernel", 1, 5.68)]
  assert [x["kernel"] for x in ncu.select(launches, "attention")] == ["attention_fwd_ws_kernel"]
  data = {"benchmark": "ncu_counters", "rows": [{"label": "O alone", **x} for x in kept]}
  assert report.kind(data) == "ncu_counters"
  text = "\n".join(report.report(data))
  assert "| O alone | `attention_fwd_ws_kernel` | 128x16x1 of 384 | 5.680 | - | - | - | 38.5 | 38.3 |" in text, text
  assert "| barrier 1.60, wait 0.67, not selected 0.54 |" in text
  assert "`fake_quantize_rows3_kernel` (2 launches) | 49152x1x1 of 128 | 0.1298 |" in text
