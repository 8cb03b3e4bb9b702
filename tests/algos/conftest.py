import pytest
import torch

DTYPES = [torch.float32, torch.bfloat16]
# bf16 keeps ~3 significant digits
TOL = {torch.float32: dict(rel=1e-5, abs=1e-6), torch.bfloat16: dict(rel=2e-2, abs=2e-2)}


@pytest.fixture(params=DTYPES, ids=["fp32", "bf16"])
def dtype(request):
    return request.param


def masks(B, T):
    """Empty, partial and full masks of shape [B, T]."""
    partial = torch.zeros(B, T)
    partial[0, : max(T // 2, 1)] = 1
    if B > 1:
        partial[1, :1] = 1
    return {"empty": torch.zeros(B, T), "partial": partial, "full": torch.ones(B, T)}
