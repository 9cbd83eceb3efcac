"""One eager sparse-MLA call of the Gluon config at B 64 H 128 K 2048 (fp8_ds_mla), for ncu.

    ncu --section SpeedOfLight --section WarpStateStats -k regex:gluon -c 1 python -m bench.ncu_mla
"""
import torch

from bench.mla_sweep import _inputs
from kernels.sparse_mla import configs
from torch_impl import sparse_mla as tsm

q, kv, idx = _inputs(64, 128, 2048, 576, "fp8_ds_mla")
for _ in range(2):
    tsm._triton_impl(q, kv, idx, 576 ** -0.5, "fp8_ds_mla", 512, None, None, None,
                     config=configs.SPARSE_MLA_GLUON, num_splits=1)
torch.cuda.synchronize()
