"""One-off probe (seventeenth session): gluon_check's 58th gluon_shws case (fp8_model1, bf16 q,
H 5, K 300, B 2, block table + topk_length + sink, the 8-head WS config) at 1 and 3 splits, with
the producer's L2 hint off and on, each in a child under a time limit (a hang is a TIMEOUT)."""
import subprocess
import sys

CHILD = r'''
import sys, torch
from bench import gluon_check as gc
from kernels import cases
from kernels.sparse_mla import configs, gluon_small_ws
gluon_small_ws.L2_PREFETCH = int(sys.argv[1])
gc._use("gluon_shws")
case = cases.make_mla_case(114, B=2, N=1, H=5, K=300, P=64, d_qk=512, kv_format="fp8_model1",
                           q_dtype="bfloat16", kv_dtype="float32", invalid="mix", logical=True,
                           topk_length=True, attn_sink=True)
print("topk_length", case.kwargs()["topk_length"], flush=True)
ref = case.reference()
row = gc._check_one(f"h5 k300 hint={sys.argv[1]} splits={sys.argv[2]}", case, ref,
                    configs.SPARSE_MLA_GLUON_SHWS8, int(sys.argv[2]), "gluon_shws")
torch.cuda.synchronize()
'''

for hint in ("0", "1"):
    for splits in ("1", "3"):
        try:
            r = subprocess.run([sys.executable, "-c", CHILD, hint, splits], capture_output=True,
                               text=True, timeout=45)
            print(f"hint={hint} splits={splits} rc={r.returncode}", r.stdout.strip()[-400:],
                  r.stderr.strip()[-300:], flush=True)
        except subprocess.TimeoutExpired:
            print(f"hint={hint} splits={splits} TIMEOUT (45 s)", flush=True)
