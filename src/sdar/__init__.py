"""sdar: agentic RL with sigmoid-gated self-distillation (SDAR).

GRPO, naive GRPO+OPSD and SDAR on multi-turn text environments, from a laptop to EKS.
"""

import os

from sdar import openmp

# how PyTorch's OpenMP threads wait between ops (a short spin, then sleep; sdar.openmp says why): it takes effect only
# when set before torch is imported, so it is set here; the user's own OMP_WAIT_POLICY or GOMP_SPINCOUNT wins
openmp.apply(os.environ)

__version__ = "0.1.0"
