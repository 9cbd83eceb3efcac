"""Test modes: on a machine without a CUDA GPU, Triton kernels run in the interpreter
(TRITON_INTERPRET=1, set here before any kernel module is imported) and Pallas kernels in
interpret mode (automatic on JAX's CPU backend). JAX gets 8 fake CPU devices for the
tensor-parallel tests. The same test bodies run on the GPU, where bf16 cases are added."""
import os
import shutil

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # torch and jax share one GPU


def _has_cuda() -> bool:
    if os.environ.get("DSA_FORCE_INTERPRET"):
        return False
    return shutil.which("nvidia-smi") is not None or os.path.exists("/dev/nvidia0")


HAS_CUDA = _has_cuda()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
