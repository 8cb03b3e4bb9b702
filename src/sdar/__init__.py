"""sdar: agentic RL with sigmoid-gated self-distillation (SDAR).

GRPO, naive GRPO+OPSD and SDAR on multi-turn text environments, from a laptop to EKS.
"""

__version__ = "0.1.0"
