"""Pure loss functions over token-level log-ratios. They never import the trainer, data or logging."""

from humanline.objectives.anchor import nll_anchor
from humanline.objectives.base import LossOutput
from humanline.objectives.dpo import dpo_loss
from humanline.objectives.grpo import group_advantages, grpo_loss
from humanline.objectives.ipo import ipo_loss
from humanline.objectives.kto import kto_kl_ref, kto_loss

__all__ = ["LossOutput", "dpo_loss", "group_advantages", "grpo_loss", "ipo_loss", "kto_kl_ref", "kto_loss",
           "nll_anchor"]
