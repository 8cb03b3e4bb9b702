"""sdar: agentic RL with sigmoid-gated self-distillation (SDAR).

GRPO, naive GRPO+OPSD and SDAR on multi-turn text environments, from a laptop to EKS.
"""

import os

# PyTorch's OpenMP threads busy-wait by default; on a shared CPU that made training 2-3x
# slower. It only takes effect when set before torch is imported, so it is set here.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
