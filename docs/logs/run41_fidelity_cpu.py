# Run 41 (CPU): the fidelity table of tests/test_grad_fidelity.py::test_fidelity_table_on_gpu_triton, on the CPU.
# Usage (from an empty directory): PYTHONPATH=<repo> python3 <repo>/docs/logs/run41_fidelity_cpu.py xla 1024
import os
import sys
sys.path[:0] = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples")]
import train_lm, grad_fidelity
cfg = train_lm.CONFIGS["tiny"]
train_lm.save_checkpoint("ckpt.npz", train_lm.make_model(cfg, {}), cfg)
impl = sys.argv[1]
rows = grad_fidelity.main(["--checkpoint", "ckpt.npz", "--lengths", sys.argv[2], "--implementation", impl, "--out", "f.json"])
